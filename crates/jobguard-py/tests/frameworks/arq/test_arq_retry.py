"""arq jobs whose transaction did not commit are run again, on Redis, with two workers.

Each key is enqueued once. Every key's first try fails transiently (its connection is terminated
with ``pg_terminate_backend``, or the server raises a serialization failure); the first key's
second try sleeps past the job's 3 s budget, the second key's stops its worker with SIGSTOP for
12 s while it holds the key's uncommitted guard row: the other worker takes the job once its
in-progress marker expires and waits on that row. Every key must take effect exactly once: arq
alone fails each of these tries (a job at ``job_timeout`` is never run again) and loses the key.
"""

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
KEYS = [f"o-{n}" for n in range(6)]
# Long enough to show a hang or a lost key; a passing run takes about 20 s.
LIMIT_S = 50


async def publish(queue: str) -> None:
    redis = await create_pool(RedisSettings.from_dsn(REDIS), default_queue_name=queue)
    try:
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


def test_transient_failures_and_timeouts_are_run_again(pg_url, tmp_path):
    kills.require(REDIS)
    kills.prepare(pg_url)
    flags = tmp_path / "flags"
    flags.mkdir()
    keys = [jobguard.key("credit", order) for order in KEYS]
    kills.arm_retries(flags, keys, overrun_s=6, stop_s=12)
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
    cmd = [sys.executable, str(HERE / "arq_app.py")]
    workers = kills.Workers(cmd, env, tmp_path, limit_s=LIMIT_S, count=2)
    try:
        workers.run_until(lambda: len(kills.effects(pg_url)) >= len(keys))
        kills.check_each_applied_once(pg_url, flags, keys, workers)
    finally:
        asyncio.run(cleanup(queue))
