"""The taskiq broker the kill tests run a worker on: one guarded credit task, on RabbitMQ
(aio-pika) or Redis Streams, with jobguard's metrics middleware.

Configured from the environment: JOBGUARD_TEST_BROKER (amqp:// or redis://), DATABASE_URL,
JOBGUARD_TEST_QUEUE.

``credit`` has a ``timeout`` label of 4 s (the guard's budget is 90% of it) and retries a
transient failure after 0.2 s, 0.4 s, ... (at most 1 s), up to 10 times: the retry tests stay
short. Sending a key's retry raises once when ``refuse`` is armed for it; every retry counted is
written to the database (``kills.count_retries``).
"""

from __future__ import annotations

import os
from typing import Any

import asyncpg
from taskiq import (
    BrokerMessage, TaskiqEvents, TaskiqMessage, TaskiqMiddleware, TaskiqResult, TaskiqState,
)

import jobguard
import jobguard.taskiq

import kills

URL = os.environ.get("DATABASE_URL", "")
BROKER = os.environ["JOBGUARD_TEST_BROKER"]
QUEUE = os.environ["JOBGUARD_TEST_QUEUE"]
TIMEOUT_S = 4

if BROKER.startswith("redis"):
    from taskiq_redis import RedisStreamBroker

    # A dead worker's unacked messages are claimed by another once idle this long (ms).
    broker = RedisStreamBroker(BROKER, queue_name=QUEUE, consumer_id="0", idle_timeout=1000)
else:
    from taskiq_aio_pika import AioPikaBroker
    from taskiq_aio_pika.exchange import Exchange
    from taskiq_aio_pika.queue import Queue, QueueType

    broker = AioPikaBroker(
        BROKER,
        qos=1,
        exchange=Exchange(name=QUEUE, auto_delete=True),
        task_queues=[Queue(name=QUEUE, type=QueueType.CLASSIC, routing_key="#")],
        dead_letter_queue=Queue(name=f"{QUEUE}.dead", type=QueueType.CLASSIC),
    )


class AfterCommit(TaskiqMiddleware):
    """Kills the worker when ``after-commit`` is armed: the task returned (committed), its
    message is not acked yet."""

    def post_execute(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        if message.task_name == "credit" and message.args:
            kills.die_here("after-commit", jobguard.key("credit", message.args[0]))


broker.add_middlewares(jobguard.taskiq.GuardMetrics(), AfterCommit())
kills.count_retries(URL)
_kick = broker.kick


async def kick(message: BrokerMessage) -> None:
    # The wrapper sends a retry through here; the error is the one a closed channel raises.
    if jobguard.taskiq.RETRIES_LABEL in message.labels:
        order = broker.formatter.loads(message.message).args[0]
        if kills.refuse_send(jobguard.key("credit", order)):
            raise ConnectionError("the broker refused the publish (test)")
    await _kick(message)


broker.kick = kick  # type: ignore[method-assign]
pool: asyncpg.Pool | None = None


@broker.on_event(TaskiqEvents.WORKER_STARTUP)
async def startup(state: TaskiqState) -> None:
    global pool
    pool = await asyncpg.create_pool(URL, min_size=1, max_size=2)


async def effect(conn: Any, key: str) -> None:
    await conn.execute("insert into ledger (job_key, pid) values ($1, $2)", key, os.getpid())
    await conn.execute(
        "insert into deliveries (job_key, outcome, pid) values ($1, 'applied', $2)",
        key, os.getpid(),
    )
    await kills.misbehave_async(conn, key)
    kills.die_here("before-commit", key)


def duplicate(outcome: jobguard.Duplicate, order: str) -> None:
    kills.record_duplicate(URL, jobguard.key("credit", order))


if kills.unguarded():

    @broker.task(task_name="credit", timeout=TIMEOUT_S)
    async def credit(order: str) -> dict:
        async with pool.acquire() as conn, conn.transaction():
            await effect(conn, jobguard.key("credit", order))
        return {"credited": order}

else:

    @broker.task(task_name="credit", timeout=TIMEOUT_S)
    @jobguard.taskiq.guarded(
        key=lambda order: jobguard.key("credit", order),
        db=lambda: pool,
        on_duplicate=duplicate,
        max_retries=10,
        retry_backoff=0.2,
        retry_backoff_max=1.0,
    )
    async def credit(conn: Any, order: str) -> dict:
        await effect(conn, jobguard.key("credit", order))
        return {"credited": order}


@broker.task(task_name="nudge")
async def nudge() -> None:
    """Nothing: a new message, after which a Redis Streams worker claims idle ones."""
