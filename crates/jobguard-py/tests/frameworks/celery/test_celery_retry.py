"""Celery jobs whose transaction did not commit are run again, on RabbitMQ and on Redis.

Each key is published once. Every key's first attempt fails transiently (its connection is
terminated with ``pg_terminate_backend``, or the server raises a serialization failure); the
first key's second attempt sleeps past the soft time limit (2 s), the second key's stops its
pool child with SIGSTOP past the hard time limit (4 s), where the worker kills it. Every key
must take effect exactly once: Celery alone acks each of these failures and loses the key.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
from celery import Celery

import jobguard
from frameworks import kills

HERE = Path(__file__).parent
BROKERS = {
    "rabbitmq": os.environ.get("JOBGUARD_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    "redis": os.environ.get("JOBGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
KEYS = [f"o-{n}" for n in range(6)]
# Long enough to show a hang or a lost key; a passing run takes about 10 s.
LIMIT_S = 50


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_transient_failures_and_time_limits_are_run_again(broker, pg_url, tmp_path):
    kills.require(BROKERS[broker])
    kills.prepare(pg_url)
    flags = tmp_path / "flags"
    flags.mkdir()
    keys = [jobguard.key("credit", order) for order in KEYS]
    kills.arm_retries(flags, keys, overrun_s=6, stop_s=20)
    queue = f"jobguard-test-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DATABASE_URL": pg_url,
        "JOBGUARD_TEST_BROKER": BROKERS[broker],
        "JOBGUARD_TEST_QUEUE": queue,
        "JOBGUARD_TEST_FLAGS": str(flags),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
    }
    producer = Celery(broker=BROKERS[broker])
    for order in KEYS:
        producer.send_task("credit", args=[order], queue=queue)
    cmd = [
        sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool=prefork",
        "--concurrency=2", "--without-heartbeat", "--without-mingle", "--without-gossip",
        "--loglevel=INFO",
    ]
    workers = kills.Workers(cmd, env, tmp_path, limit_s=LIMIT_S)
    try:
        workers.run_until(lambda: len(kills.effects(pg_url)) >= len(keys))
        kills.check_each_applied_once(pg_url, flags, keys, workers)
    finally:
        with producer.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
        producer.close()
