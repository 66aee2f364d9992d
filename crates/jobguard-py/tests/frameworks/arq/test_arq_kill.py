"""arq workers killed with SIGKILL on Redis: the job runs again once its in-progress marker
expires, and the guard keeps one effect per key."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

from arq import create_pool
from arq.connections import RedisSettings

import jobguard
from frameworks import kills

HERE = Path(__file__).parent
REDIS = os.environ.get("JOBGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
KEYS = [f"o-{n}" for n in range(5)]
PUBLISHED = 2


async def publish(queue: str) -> None:
    redis = await create_pool(RedisSettings.from_dsn(REDIS), default_queue_name=queue)
    try:
        # The default job ids are random: each enqueue is a job of its own, as a producer that
        # enqueues one operation twice makes.
        for _ in range(PUBLISHED):
            for order in KEYS:
                assert await redis.enqueue_job("credit", order) is not None
    finally:
        await redis.aclose()


async def cleanup(queue: str) -> None:
    redis = await create_pool(RedisSettings.from_dsn(REDIS))
    try:
        await redis.delete(queue)
    finally:
        await redis.aclose()


def test_killed_arq_workers_apply_each_key_once(pg_url, tmp_path):
    kills.require(REDIS)
    kills.prepare(pg_url)
    flags = tmp_path / "flags"
    flags.mkdir()
    keys = [jobguard.key("credit", order) for order in KEYS]
    kills.arm_both(flags, keys)
    queue = f"jobguard-test-{uuid.uuid4().hex[:8]}"
    asyncio.run(publish(queue))
    env = {
        **os.environ,
        "DATABASE_URL": pg_url,
        "JOBGUARD_TEST_REDIS_URL": REDIS,
        "JOBGUARD_TEST_QUEUE": queue,
        "JOBGUARD_TEST_FLAGS": str(flags),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
    }
    workers = kills.Workers([sys.executable, str(HERE / "arq_app.py")], env, tmp_path)
    try:
        expected = kills.expected_finished(keys, PUBLISHED)
        workers.run_until(lambda: kills.finished(pg_url) >= expected)
        kills.check_exactly_once(pg_url, flags, keys, PUBLISHED, workers)
    finally:
        asyncio.run(cleanup(queue))
