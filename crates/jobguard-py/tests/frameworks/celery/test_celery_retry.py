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


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_a_retry_that_cannot_be_sent_leaves_the_delivery_to_the_broker(broker, pg_url, tmp_path):
    # The first two keys' retries are refused, after a transient failure (sent by the pool
    # child) and after the hard time limit (sent by the worker's main process); the other two
    # are sent, one of each kind.
    kills.require(BROKERS[broker])
    kills.prepare(pg_url)
    flags = tmp_path / "flags"
    flags.mkdir()
    orders = [f"s-{n}" for n in range(4)]
    keys = [jobguard.key("credit", order) for order in orders]
    (flags / f"transient.{keys[0]}").write_text("terminate")
    (flags / f"stop.{keys[1]}").write_text("20")
    (flags / f"transient.{keys[2]}").write_text("serialization")
    (flags / f"stop.{keys[3]}").write_text("20")
    for key in keys[:2]:
        kills.arm(flags, "refuse", key)
    with celery_runs.queue(broker) as (queue, producer):
        env = celery_runs.app_environment(pg_url, broker, queue, flags)
        celery_runs.publish(producer, queue, orders)
        workers = kills.Workers(celery_runs.worker_command("celery_app", 2), env, tmp_path,
                                limit_s=LIMIT_S)
        workers.run_until(lambda: len(kills.effects(pg_url)) >= len(keys))
    assert kills.fired(flags) == sorted(
        [f"refuse.{k}" for k in keys[:2]] + [f"transient.{keys[0]}", f"transient.{keys[2]}"]
        + [f"stop.{keys[1]}", f"stop.{keys[3]}"]
    ), workers.log_tail()
    assert kills.effects(pg_url) == {k: 1 for k in keys}, workers.log_tail()
    assert kills.retries(pg_url) == {"retried": 2}, workers.log_tail()
