"""taskiq workers killed with SIGKILL, on RabbitMQ (aio-pika) and Redis Streams: the worker
process manager starts a new worker, which takes the redelivery; one effect per key.

And tasks whose transaction did not commit, run again: each key published once, every key's
first delivery fails transiently (its connection terminated with ``pg_terminate_backend``, or a
serialization failure raised by the server), the first key's second delivery sleeps past the
task's ``timeout`` label (4 s), the second key's stops its worker with SIGSTOP for 10 s, past
it. taskiq alone acks each of these failures and loses the key. A retry whose first send fails
is sent again, and counted once; one that cannot be sent at all is counted as lost."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

import jobguard
from frameworks import kills
from frameworks.kills import BROKERS

HERE = Path(__file__).parent
KEYS = [f"o-{n}" for n in range(5)]
PUBLISHED = 2
RETRY_KEYS = [f"r-{n}" for n in range(6)]
# Long enough to show a hang or a lost key; a passing run takes about 15 s.
RETRY_LIMIT_S = 50


def load_app(env: dict[str, str]):
    """The app module as the producer sees it, configured like the worker."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        sys.modules.pop("taskiq_app", None)
        sys.path.insert(0, str(HERE.parent))
        sys.path.insert(0, str(HERE))
        return importlib.import_module("taskiq_app")
    finally:
        sys.path.remove(str(HERE))
        sys.path.remove(str(HERE.parent))
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def publish(app, count: int, orders: list[str] = KEYS) -> None:
    await app.broker.startup()
    try:
        for _ in range(count):
            for order in orders:
                await app.credit.kiq(order)
    finally:
        await app.broker.shutdown()


async def nudge(app) -> None:
    await app.broker.startup()
    try:
        await app.nudge.kiq()
    finally:
        await app.broker.shutdown()


async def cleanup(broker: str, queue: str) -> None:
    if broker == "redis":
        import redis.asyncio as redis

        client = redis.from_url(BROKERS["redis"])
        await client.delete(queue)
        await client.aclose()
    else:
        import aio_pika

        conn = await aio_pika.connect(BROKERS["rabbitmq"])
        channel = await conn.channel()
        for name in (queue, f"{queue}.dead"):
            await channel.queue_delete(name)
        await conn.close()


def prepare_run(broker: str, pg_url: str, tmp_path: Path, keys_armed: Any) -> tuple:
    """The flags armed, the producer's app and the worker's command and environment."""
    kills.require(BROKERS[broker])
    kills.prepare(pg_url)
    flags = tmp_path / "flags"
    flags.mkdir()
    keys_armed(flags)
    queue = f"jobguard-test-{uuid.uuid4().hex[:8]}"
    env = {
        "DATABASE_URL": pg_url,
        "JOBGUARD_TEST_BROKER": BROKERS[broker],
        "JOBGUARD_TEST_QUEUE": queue,
        "JOBGUARD_TEST_FLAGS": str(flags),
    }
    app = load_app(env)
    worker_env = {
        **os.environ,
        **env,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
    }
    cmd = [
        sys.executable, "-m", "taskiq", "worker", "taskiq_app:broker", "--workers", "1",
        "--max-async-tasks", "1", "--ack-type", "when_saved", "--log-level", "INFO",
    ]
    return flags, queue, app, cmd, worker_env


def until(broker: str, app: Any, finished: Callable[[], bool]) -> Callable[[], bool]:
    """``finished``, nudging a Redis Streams worker meanwhile: it claims idle messages only
    after reading a new one."""
    last_nudge = [time.monotonic()]

    def done() -> bool:
        if finished():
            return True
        if broker == "redis" and time.monotonic() - last_nudge[0] > 1:
            asyncio.run(nudge(app))
            last_nudge[0] = time.monotonic()
        return False

    return done


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_killed_taskiq_workers_apply_each_key_once(broker, pg_url, tmp_path):
    keys = [jobguard.key("credit", order) for order in KEYS]
    flags, queue, app, cmd, env = prepare_run(
        broker, pg_url, tmp_path, lambda flags: kills.arm_both(flags, keys)
    )
    workers = kills.Workers(cmd, env, tmp_path)
    expected = kills.expected_finished(keys, PUBLISHED)
    try:
        asyncio.run(publish(app, PUBLISHED))
        workers.run_until(until(broker, app, lambda: kills.finished(pg_url) >= expected))
        kills.check_exactly_once(pg_url, flags, keys, PUBLISHED, workers)
    finally:
        asyncio.run(cleanup(broker, queue))


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_transient_failures_and_timeouts_are_run_again(broker, pg_url, tmp_path):
    keys = [jobguard.key("credit", order) for order in RETRY_KEYS]
    flags, queue, app, cmd, env = prepare_run(
        broker, pg_url, tmp_path,
        lambda flags: kills.arm_retries(flags, keys, overrun_s=6, stop_s=10),
    )
    workers = kills.Workers(cmd, env, tmp_path, limit_s=RETRY_LIMIT_S)
    try:
        asyncio.run(publish(app, 1, RETRY_KEYS))
        workers.run_until(until(broker, app, lambda: len(kills.effects(pg_url)) >= len(keys)))
        kills.check_each_applied_once(pg_url, flags, keys, workers)
    finally:
        asyncio.run(cleanup(broker, queue))


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_a_retry_whose_send_fails_is_sent_again(broker, pg_url, tmp_path):
    key = jobguard.key("credit", "s-0")

    def arm(flags: Path) -> None:
        (flags / f"transient.{key}").write_text("serialization")
        kills.arm(flags, "refuse", key)

    flags, queue, app, cmd, env = prepare_run(broker, pg_url, tmp_path, arm)
    workers = kills.Workers(cmd, env, tmp_path, limit_s=RETRY_LIMIT_S)
    try:
        asyncio.run(publish(app, 1, ["s-0"]))
        workers.run_until(until(broker, app, lambda: len(kills.effects(pg_url)) >= 1))
        assert kills.fired(flags) == [f"refuse.{key}", f"transient.{key}"], workers.log_tail()
        assert kills.effects(pg_url) == {key: 1}, workers.log_tail()
        assert kills.retries(pg_url) == {"retried": 1}, workers.log_tail()
    finally:
        asyncio.run(cleanup(broker, queue))


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_a_retry_that_cannot_be_sent_is_counted_as_lost(broker, pg_url, tmp_path):
    key = jobguard.key("credit", "l-0")

    def arm(flags: Path) -> None:
        (flags / f"transient.{key}").write_text("serialization")
        (flags / f"refuse.{key}").write_text("3")  # every send the wrapper tries

    flags, queue, app, cmd, env = prepare_run(broker, pg_url, tmp_path, arm)
    workers = kills.Workers(cmd, env, tmp_path, limit_s=RETRY_LIMIT_S)
    try:
        asyncio.run(publish(app, 1, ["l-0"]))
        workers.run_until(until(broker, app, lambda: bool(kills.retries(pg_url))))
        assert kills.retries(pg_url) == {"lost": 1}, workers.log_tail()
        assert kills.fired(flags) == [f"refuse.{key}", f"transient.{key}"], workers.log_tail()
        assert kills.effects(pg_url) == {}, workers.log_tail()
    finally:
        asyncio.run(cleanup(broker, queue))
