"""arq jobs whose transaction did not commit are run again, on Redis, with two workers.

Each key is enqueued once. Every key's first try fails transiently (its connection is terminated
with ``pg_terminate_backend``, or the server raises a serialization failure); the first key's
second try sleeps past the job's 3 s budget, the second key's stops its worker with SIGSTOP for
12 s while it holds the key's uncommitted guard row: the other worker takes the job once its
in-progress marker expires and waits on that row. Every key must take effect exactly once: arq
alone fails each of these tries (a job at ``job_timeout`` is never run again) and loses the key.

With a ``job_timeout`` below the wrapper's budget, a try that holds its transaction past it is
rolled back and run again too: the budget follows arq's timeout.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

from arq import create_pool
from arq.connections import RedisSettings
from arq.jobs import Job

import jobguard
from frameworks import kills

HERE = Path(__file__).parent
REDIS = os.environ.get("JOBGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
KEYS = [f"o-{n}" for n in range(6)]
# Long enough to show a hang or a lost key; a passing run takes about 20 s.
LIMIT_S = 50


async def publish(queue: str, orders: list[str] = KEYS) -> list[str]:
    """The jobs' ids."""
    redis = await create_pool(RedisSettings.from_dsn(REDIS), default_queue_name=queue)
    try:
        ids = []
        for order in orders:
            job = await redis.enqueue_job("credit", order)
            assert job is not None
            ids.append(job.job_id)
        return ids
    finally:
        await redis.aclose()


async def succeeded(job_id: str) -> bool | None:
    """Whether the job ended in success, failure, or ``None`` while it has not ended."""
    redis = await create_pool(RedisSettings.from_dsn(REDIS))
    try:
        info = await Job(job_id, redis).result_info()
        return None if info is None else info.success
    finally:
        await redis.aclose()


async def cleanup(queue: str) -> None:
    redis = await create_pool(RedisSettings.from_dsn(REDIS))
    try:
        await redis.delete(queue)
    finally:
        await redis.aclose()


def worker_environment(pg_url: str, queue: str, flags: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": pg_url,
        "JOBGUARD_TEST_REDIS_URL": REDIS,
        "JOBGUARD_TEST_QUEUE": queue,
        "JOBGUARD_TEST_FLAGS": str(flags),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
        **extra,
    }


def test_transient_failures_and_timeouts_are_run_again(pg_url, tmp_path):
    kills.require(REDIS)
    kills.prepare(pg_url)
    flags = tmp_path / "flags"
    flags.mkdir()
    keys = [jobguard.key("credit", order) for order in KEYS]
    kills.arm_retries(flags, keys, overrun_s=6, stop_s=12)
    queue = f"jobguard-test-{uuid.uuid4().hex[:8]}"
    asyncio.run(publish(queue))
    env = worker_environment(pg_url, queue, flags)
    cmd = [sys.executable, str(HERE / "arq_app.py")]
    workers = kills.Workers(cmd, env, tmp_path, limit_s=LIMIT_S, count=2)
    try:
        workers.run_until(lambda: len(kills.effects(pg_url)) >= len(keys))
        kills.check_each_applied_once(pg_url, flags, keys, workers)
    finally:
        asyncio.run(cleanup(queue))


def test_a_try_cancelled_at_job_timeout_is_run_again(pg_url, tmp_path):
    # job_timeout 2 s, the wrapper's budget left at its default (270 s); the first try holds
    # its transaction 3 s.
    kills.require(REDIS)
    kills.prepare(pg_url)
    flags = tmp_path / "flags"
    flags.mkdir()
    key = jobguard.key("credit", "t-0")
    (flags / f"overrun.{key}").write_text("3")
    queue = f"jobguard-test-{uuid.uuid4().hex[:8]}"
    [job_id] = asyncio.run(publish(queue, ["t-0"]))
    env = worker_environment(pg_url, queue, flags, JOBGUARD_TEST_JOB_TIMEOUT="2")
    cmd = [sys.executable, str(HERE / "arq_app.py")]
    workers = kills.Workers(cmd, env, tmp_path, limit_s=LIMIT_S)
    try:
        workers.run_until(lambda: asyncio.run(succeeded(job_id)) is not None)
        assert kills.fired(flags) == [f"overrun.{key}"], workers.log_tail()
        assert asyncio.run(succeeded(job_id)) is True, workers.log_tail()
        assert kills.effects(pg_url) == {key: 1}, workers.log_tail()
        assert kills.retries(pg_url) == {"retried": 1}, workers.log_tail()
    finally:
        asyncio.run(cleanup(queue))
