"""Django Celery jobs whose transaction did not commit are run again, on Redis, by the
retries ``DjangoTask`` inherits from ``GuardedTask``: the points of
``frameworks/celery/test_celery_retry.py``, armed in the task's atomic block on Django's own
connection. Every key's first attempt fails transiently (its connection terminated with
``pg_terminate_backend``, or a serialization failure); the first key's second attempt sleeps
past the soft time limit, the second key's stops its pool child past the hard one. Every key
takes effect exactly once. (On RabbitMQ the same retries are ``GuardedTask``'s, which
``test_celery_retry.py`` runs there; one broker keeps this suite short.)"""

from __future__ import annotations

import pytest

import jobguard
from djcommand import environment, migrate
from frameworks import celery_runs, kills
from frameworks.kills import BROKERS

KEYS = [f"o-{n}" for n in range(6)]
# Long enough to show a hang or a lost key; a passing run takes about 10 s.
LIMIT_S = 50


@pytest.mark.parametrize("broker", ["redis"])
def test_transient_failures_and_time_limits_are_run_again(broker, pg_url, tmp_path):
    kills.require(BROKERS[broker])
    migrate("default", pg_url, str(tmp_path / "unused.db"))
    flags = tmp_path / "flags"
    flags.mkdir()
    keys = [jobguard.key("credit", order) for order in KEYS]
    kills.arm_retries(flags, keys, overrun_s=6, stop_s=20)
    with celery_runs.queue(broker) as (queue, producer):
        env = environment(
            pg_url, str(tmp_path / "unused.db"),
            DATABASE_URL=pg_url,  # kills.misbehave's own connection terminates the task's
            JOBGUARD_TEST_BROKER=BROKERS[broker],
            JOBGUARD_TEST_QUEUE=queue,
            JOBGUARD_TEST_FLAGS=str(flags),
        )
        celery_runs.publish(producer, queue, KEYS)
        workers = kills.Workers(celery_runs.worker_command("djproject", 2), env, tmp_path,
                                limit_s=LIMIT_S)
        workers.run_until(lambda: len(kills.effects(pg_url)) >= len(keys))
        kills.check_each_applied_once(pg_url, flags, keys, workers)
