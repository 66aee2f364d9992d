"""taskiq workers killed with SIGKILL, on RabbitMQ (aio-pika) and Redis Streams: the worker
process manager starts a new worker, which takes the redelivery; one effect per key."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import time
import uuid
from pathlib import Path

import pytest

import jobguard
from frameworks import kills

HERE = Path(__file__).parent
BROKERS = {
    "rabbitmq": os.environ.get("JOBGUARD_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    "redis": os.environ.get("JOBGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
KEYS = [f"o-{n}" for n in range(5)]
PUBLISHED = 2


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


async def publish(app, count: int) -> None:
    await app.broker.startup()
    try:
        for _ in range(count):
            for order in KEYS:
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


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_killed_taskiq_workers_apply_each_key_once(broker, pg_url, tmp_path):
    kills.require(BROKERS[broker])
    kills.prepare(pg_url)
    flags = tmp_path / "flags"
    flags.mkdir()
    keys = [jobguard.key("credit", order) for order in KEYS]
    kills.arm_both(flags, keys)
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
    workers = kills.Workers(cmd, worker_env, tmp_path)
    expected = kills.expected_finished(keys, PUBLISHED)
    last_nudge = [time.monotonic()]

    def done() -> bool:
        if kills.finished(pg_url) >= expected:
            return True
        # Redis Streams: a worker claims idle messages only after reading a new one.
        if broker == "redis" and time.monotonic() - last_nudge[0] > 1:
            asyncio.run(nudge(app))
            last_nudge[0] = time.monotonic()
        return False

    try:
        asyncio.run(publish(app, PUBLISHED))
        workers.run_until(done)
        kills.check_exactly_once(pg_url, flags, keys, PUBLISHED, workers)
    finally:
        asyncio.run(cleanup(broker, queue))
