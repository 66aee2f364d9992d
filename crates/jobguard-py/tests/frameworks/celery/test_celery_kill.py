"""Celery workers killed with SIGKILL, on RabbitMQ and on Redis: one effect per key.

On RabbitMQ the pool child dies (the master rejects the message because of
``task_reject_on_worker_lost`` and it is redelivered); on Redis the whole worker dies and the
restarted one takes the message back after the visibility timeout.
"""

from __future__ import annotations

import pytest

import jobguard
from frameworks import celery_runs, kills
from frameworks.kills import BROKERS

KEYS = [f"o-{n}" for n in range(5)]
PUBLISHED = 2


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_killed_celery_workers_apply_each_key_once(broker, pg_url, tmp_path):
    kills.require(BROKERS[broker])
    kills.prepare(pg_url)
    flags = tmp_path / "flags"
    flags.mkdir()
    keys = [jobguard.key("credit", order) for order in KEYS]
    kills.arm_both(flags, keys)
    with celery_runs.queue(broker) as (queue, producer):
        env = celery_runs.app_environment(
            pg_url, broker, queue, flags,
            JOBGUARD_TEST_KILL_GROUP="1" if broker == "redis" else "0")
        celery_runs.publish(producer, queue, KEYS, PUBLISHED)
        workers = kills.Workers(celery_runs.worker_command("celery_app", 1), env, tmp_path)
        expected = kills.expected_finished(keys, PUBLISHED)
        workers.run_until(lambda: kills.finished(pg_url) >= expected)
        kills.check_exactly_once(pg_url, flags, keys, PUBLISHED, workers)
