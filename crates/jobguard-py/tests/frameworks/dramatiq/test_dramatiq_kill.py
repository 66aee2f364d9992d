"""Dramatiq workers killed with SIGKILL, on RabbitMQ and on Redis: one effect per key.

On RabbitMQ the killed worker's connection closes and its unacked messages are redelivered; on
Redis the restarted worker's maintenance moves the dead worker's unacked messages back to the
queue once its heartbeat is 3 s old.

And actors whose transaction did not commit, run again: each key published once, every key's
first delivery fails transiently (its connection terminated with ``pg_terminate_backend``, or a
serialization failure raised by the server), the first key's second delivery sleeps past the
actor's 2 s time limit, the second key's stops its worker with SIGSTOP for 6 s, past it (on
Redis the other worker takes the message once the stopped one's heartbeat is old, and waits on
its guard row). Without the guard, Dramatiq's own retries apply the keys whose worker died after
its commit or that overran their time limit after the effect, twice.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import urllib.parse

import pytest

import jobguard
from frameworks import kills

HERE = Path(__file__).parent


def pika_url(url: str) -> str:
    """``url`` as pika reads it: the default virtual host ``/`` spelled ``%2F`` (pika reads
    Celery's ``amqp://host//`` as a virtual host named "")."""
    parts = urllib.parse.urlsplit(url)
    if parts.path in ("", "/", "//"):
        parts = parts._replace(path="/%2F")
    return urllib.parse.urlunsplit(parts)


BROKERS = {
    "rabbitmq": pika_url(
        os.environ.get("JOBGUARD_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
    ),
    "redis": os.environ.get("JOBGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
KEYS = [f"o-{n}" for n in range(5)]
PUBLISHED = 2
RETRY_KEYS = [f"r-{n}" for n in range(6)]
# Long enough to show a hang or a lost key; a passing run takes about 15 s.
RETRY_LIMIT_S = 50


def producer(broker: str, namespace: str):
    if broker == "redis":
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=BROKERS[broker], namespace=namespace)
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    return RabbitmqBroker(url=BROKERS[broker])


def publish(broker: str, queue: str, namespace: str, orders: list[str], count: int) -> None:
    import dramatiq

    sender = producer(broker, namespace)
    try:
        for _ in range(count):
            for order in orders:
                sender.enqueue(dramatiq.Message(
                    queue_name=queue, actor_name="credit", args=(order,), kwargs={}, options={},
                ))
    finally:
        sender.close()


def cleanup(broker: str, queue: str, namespace: str) -> None:
    if broker == "redis":
        import redis

        client = redis.Redis.from_url(BROKERS[broker])
        for name in client.scan_iter(f"{namespace}:*"):
            client.delete(name)
        client.close()
        return
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(BROKERS[broker]))
    channel = conn.channel()
    for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
        channel.queue_delete(name)
    conn.close()


def run(broker: str, pg_url: str, tmp_path: Path, arm, orders: list[str], published: int,
        done, check, count: int = 1, limit_s: float = kills.HANG_LIMIT_S) -> None:
    kills.require(BROKERS[broker])
    kills.prepare(pg_url)
    flags = tmp_path / "flags"
    flags.mkdir()
    arm(flags)
    queue = f"jobguard-test-{uuid.uuid4().hex[:8]}"
    namespace = f"jobguard-test-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DATABASE_URL": pg_url,
        "JOBGUARD_TEST_BROKER": BROKERS[broker],
        "JOBGUARD_TEST_QUEUE": queue,
        "JOBGUARD_TEST_NAMESPACE": namespace,
        "JOBGUARD_TEST_FLAGS": str(flags),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
    }
    cmd = [
        sys.executable, "-m", "dramatiq", "dramatiq_app", "--processes", "1", "--threads", "1",
    ]
    workers = kills.Workers(cmd, env, tmp_path, limit_s=limit_s, count=count)
    try:
        publish(broker, queue, namespace, orders, published)
        workers.run_until(done)
        check(flags, workers)
    finally:
        cleanup(broker, queue, namespace)


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_killed_dramatiq_workers_apply_each_key_once(broker, pg_url, tmp_path):
    keys = [jobguard.key("credit", order) for order in KEYS]
    expected = kills.expected_finished(keys, PUBLISHED)
    run(
        broker, pg_url, tmp_path, lambda flags: kills.arm_both(flags, keys), KEYS, PUBLISHED,
        lambda: kills.finished(pg_url) >= expected,
        lambda flags, workers: kills.check_exactly_once(pg_url, flags, keys, PUBLISHED, workers),
    )


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_transient_failures_and_time_limits_are_run_again(broker, pg_url, tmp_path):
    keys = [jobguard.key("credit", order) for order in RETRY_KEYS]
    run(
        broker, pg_url, tmp_path,
        lambda flags: kills.arm_retries(flags, keys, overrun_s=4, stop_s=6), RETRY_KEYS, 1,
        lambda: len(kills.effects(pg_url)) >= len(keys) and kills.finished(pg_url) >= len(keys),
        lambda flags, workers: check_run_again(pg_url, flags, keys, workers),
        count=2, limit_s=RETRY_LIMIT_S,
    )


def check_run_again(url: str, flags: Path, keys: list[str], workers: kills.Workers) -> None:
    """Every key applied once, and every armed point retried by the guard (with its delay,
    counted), not by Dramatiq's backoff alone."""
    kills.check_each_applied_once(url, flags, keys, workers)
    kills.check_retries_logged(workers, len(keys) + 2)
