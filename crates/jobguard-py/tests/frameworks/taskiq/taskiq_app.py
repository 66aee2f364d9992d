"""The taskiq broker the kill tests run a worker on: one guarded credit task, on RabbitMQ
(aio-pika) or Redis Streams, with jobguard's metrics middleware.

Configured from the environment: JOBGUARD_TEST_BROKER (amqp:// or redis://), DATABASE_URL,
JOBGUARD_TEST_QUEUE.
"""

from __future__ import annotations

import os
from typing import Any

import asyncpg
from taskiq import TaskiqEvents, TaskiqState

import jobguard
import jobguard.taskiq

import kills

URL = os.environ.get("DATABASE_URL", "")
BROKER = os.environ["JOBGUARD_TEST_BROKER"]
QUEUE = os.environ["JOBGUARD_TEST_QUEUE"]

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

broker.add_middlewares(jobguard.taskiq.GuardMetrics())
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
    kills.die_here("before-commit", key)


def duplicate(outcome: jobguard.Duplicate, order: str) -> None:
    kills.record_duplicate(URL, jobguard.key("credit", order))


@jobguard.taskiq.guarded(
    key=lambda order: jobguard.key("credit", order), db=lambda: pool, on_duplicate=duplicate
)
async def guarded_credit(conn: Any, order: str) -> dict:
    await effect(conn, jobguard.key("credit", order))
    return {"credited": order}


async def naive_credit(order: str) -> dict:
    async with pool.acquire() as conn, conn.transaction():
        await effect(conn, jobguard.key("credit", order))
    return {"credited": order}


@broker.task(task_name="credit")
async def credit(order: str) -> dict:
    out = await (naive_credit if kills.unguarded() else guarded_credit)(order)
    # Committed; the message is acked once the result is saved, after this returns.
    kills.die_here("after-commit", jobguard.key("credit", order))
    return out


@broker.task(task_name="nudge")
async def nudge() -> None:
    """Nothing: a new message, after which a Redis Streams worker claims idle ones."""
