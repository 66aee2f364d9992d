"""Celery workers in a Django project killed with SIGKILL, on RabbitMQ and on Redis, as
``frameworks/celery/test_celery_kill.py`` kills them: ``DjangoTask`` runs ``credit`` in
``transaction.atomic()`` with its guard row on Django's PostgreSQL connection, and every key
takes effect exactly once, none lost.

The worker's database is made by ``python -m django migrate`` (the guard table, the ledger and
the deliveries), as a Django deployment makes it. ``JOBGUARD_TEST_UNGUARDED=1`` runs the task
without the guard, and the test fails.
"""

from __future__ import annotations

import pytest

import jobguard
from frameworks import celery_runs, kills
from frameworks.kills import BROKERS
from djcommand import environment, migrate

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
    with celery_runs.queue(broker) as (queue, producer):
        env = environment(
            pg_url, str(tmp_path / "unused.db"),
            JOBGUARD_TEST_BROKER=BROKERS[broker],
            JOBGUARD_TEST_QUEUE=queue,
            JOBGUARD_TEST_FLAGS=str(flags),
            JOBGUARD_TEST_KILL_GROUP="1" if broker == "redis" else "0",
        )
        celery_runs.publish(producer, queue, KEYS, PUBLISHED)
        workers = kills.Workers(celery_runs.worker_command("djproject", 1), env, tmp_path)
        expected = kills.expected_finished(keys, PUBLISHED)
        workers.run_until(lambda: kills.finished(pg_url) >= expected)
        kills.check_exactly_once(pg_url, flags, keys, PUBLISHED, workers)
