"""Celery jobs whose transaction did not commit are run again, on RabbitMQ and on Redis.

Each key is published once. Every key's first attempt fails transiently (its connection is
terminated with ``pg_terminate_backend``, or the server raises a serialization failure); the
first key's second attempt sleeps past the soft time limit (2 s), the second key's stops its
pool child with SIGSTOP past the hard time limit (4 s), where the worker kills it. Every key
must take effect exactly once: Celery alone acks each of these failures and loses the key.
"""

from __future__ import annotations

import pytest

import jobguard
from frameworks import celery_runs, kills
from frameworks.kills import BROKERS

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
    with celery_runs.queue(broker) as (queue, producer):
        env = celery_runs.app_environment(pg_url, broker, queue, flags)
        celery_runs.publish(producer, queue, KEYS)
        workers = kills.Workers(celery_runs.worker_command("celery_app", 2), env, tmp_path,
                                limit_s=LIMIT_S)
        workers.run_until(lambda: len(kills.effects(pg_url)) >= len(keys))
        kills.check_each_applied_once(pg_url, flags, keys, workers)
