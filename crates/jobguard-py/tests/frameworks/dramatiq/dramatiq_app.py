"""The Dramatiq app the kill tests run workers of (``dramatiq dramatiq_app``): one guarded
credit actor, on RabbitMQ or Redis.

Configured from the environment: JOBGUARD_TEST_BROKER (amqp:// or redis://), DATABASE_URL,
JOBGUARD_TEST_QUEUE, JOBGUARD_TEST_NAMESPACE (the Redis broker's key prefix).

``credit`` has a time limit of 2 s and retries a transient failure after 0.2 s, 0.4 s, ... (at
most 1 s), up to Dramatiq's ``max_retries`` of 10: the retry tests stay short. On Redis a worker
whose heartbeat is 3 s old counts as dead, and every broker call runs the maintenance that
requeues a dead worker's unacked messages (by default: after 60 s, on 1 call in 1,000).
"""

from __future__ import annotations

import os

import dramatiq
import psycopg
from dramatiq.middleware import Middleware

import jobguard
import jobguard.dramatiq

import kills

URL = os.environ["DATABASE_URL"]
BROKER = os.environ["JOBGUARD_TEST_BROKER"]
QUEUE = os.environ["JOBGUARD_TEST_QUEUE"]
TIME_LIMIT_MS = 2000


def make_broker() -> dramatiq.Broker:
    if BROKER.startswith("redis"):
        from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker

        return RedisBroker(
            url=BROKER, namespace=os.environ["JOBGUARD_TEST_NAMESPACE"],
            heartbeat_timeout=3000, maintenance_chance=MAINTENANCE_SCALE,
        )
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    return RabbitmqBroker(url=BROKER)


class AfterCommit(Middleware):
    """Kills the worker when ``after-commit`` is armed: the actor returned (committed), its
    message is not acked yet."""

    def after_process_message(self, broker, message, *, result=None, exception=None):
        if message.actor_name == "credit" and exception is None:
            kills.die_here("after-commit", jobguard.key("credit", message.args[0]), group=True)


broker = make_broker()
broker.add_middleware(AfterCommit())
broker.add_middleware(jobguard.dramatiq.Guard())
dramatiq.set_broker(broker)


def connect() -> psycopg.Connection:
    return psycopg.connect(URL)


def effect(conn: psycopg.Connection, key: str) -> None:
    conn.execute("insert into ledger (job_key, pid) values (%s, %s)", (key, os.getpid()))
    kills.misbehave(conn, key)
    kills.record(conn, key, "applied")
    kills.die_here("before-commit", key, group=True)


def duplicate(outcome: jobguard.Duplicate, order: str) -> None:
    kills.record_duplicate(URL, jobguard.key("credit", order))


OPTIONS = dict(
    actor_name="credit", queue_name=QUEUE, time_limit=TIME_LIMIT_MS, max_retries=10,
    min_backoff=200, max_backoff=1000,
)

if kills.unguarded():

    @dramatiq.actor(**OPTIONS)
    def credit(order: str) -> None:
        with connect() as conn:
            effect(conn, jobguard.key("credit", order))

else:

    @dramatiq.actor(
        **OPTIONS,
        guard_key=lambda order: jobguard.key("credit", order),
        guard_db=connect,
        guard_on_duplicate=duplicate,
        guard_retry_backoff=0.2,
        guard_retry_backoff_max=1.0,
    )
    def credit(conn: psycopg.Connection, order: str) -> dict:
        effect(conn, jobguard.key("credit", order))
        return {"credited": order}
