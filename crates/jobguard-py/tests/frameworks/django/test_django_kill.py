"""Celery workers in a Django project killed with SIGKILL, on RabbitMQ and on Redis, as
``frameworks/celery/test_celery_kill.py`` kills them: ``DjangoTask`` runs ``credit`` in
``transaction.atomic()`` with its guard row on Django's PostgreSQL connection, and every key
takes effect exactly once, none lost.

The worker's database is made by ``python -m django migrate`` (the guard table, the ledger and
the deliveries), as a Django deployment makes it. ``JOBGUARD_TEST_UNGUARDED=1`` runs the task
without the guard, and the test fails.
"""

from __future__ import annotations

import os
import sys
import uuid

import pytest
from celery import Celery

import jobguard
from frameworks import kills
from djcommand import environment, migrate

BROKERS = {
    "rabbitmq": os.environ.get("JOBGUARD_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    "redis": os.environ.get("JOBGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
KEYS = [f"o-{n}" for n in range(5)]
PUBLISHED = 2


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_killed_django_celery_workers_apply_each_key_once(broker, pg_url, tmp_path):
    kills.require(BROKERS[broker])
    migrate("default", pg_url, str(tmp_path / "unused.db"))
    flags = tmp_path / "flags"
    flags.mkdir()
    keys = [jobguard.key("credit", order) for order in KEYS]
    kills.arm_both(flags, keys)
    queue = f"jobguard-test-{uuid.uuid4().hex[:8]}"
    env = environment(
        pg_url, str(tmp_path / "unused.db"),
        JOBGUARD_TEST_BROKER=BROKERS[broker],
        JOBGUARD_TEST_QUEUE=queue,
        JOBGUARD_TEST_FLAGS=str(flags),
        JOBGUARD_TEST_KILL_GROUP="1" if broker == "redis" else "0",
    )
    producer = Celery(broker=BROKERS[broker])
    for _ in range(PUBLISHED):
        for order in KEYS:
            producer.send_task("credit", args=[order], queue=queue)
    cmd = [
        sys.executable, "-m", "celery", "-A", "djproject", "worker", "--pool=prefork",
        "--concurrency=1", "--without-heartbeat", "--without-mingle", "--without-gossip",
        "--loglevel=INFO",
    ]
    workers = kills.Workers(cmd, env, tmp_path)
    try:
        expected = kills.expected_finished(keys, PUBLISHED)
        workers.run_until(lambda: kills.finished(pg_url) >= expected)
        kills.check_exactly_once(pg_url, flags, keys, PUBLISHED, workers)
    finally:
        with producer.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
        producer.close()
