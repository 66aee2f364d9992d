"""The arq worker the kill tests run: one guarded credit job on an asyncpg pool.

Configured from the environment: DATABASE_URL, JOBGUARD_TEST_REDIS_URL, JOBGUARD_TEST_QUEUE.
Run as ``python arq_app.py``.

The job's time budget is 3 s, under the worker's ``job_timeout`` of 5 s; a transient failure is
retried after 0.2 s, 0.4 s, ... (at most 1 s), up to try 10: the retry tests stay short. With
JOBGUARD_TEST_JOB_TIMEOUT the worker's ``job_timeout`` is that instead and the job's budget is
left at the wrapper's default (270 s). Every retry counted is written to the database
(``kills.count_retries``).
"""

from __future__ import annotations

import os
from typing import Any

import asyncpg
from arq.connections import RedisSettings
from arq.worker import Worker

import jobguard
import jobguard.arq

import kills

URL = os.environ["DATABASE_URL"]
MAX_TRIES = 10
JOB_TIMEOUT_S = float(os.environ.get("JOBGUARD_TEST_JOB_TIMEOUT", "5"))
BUDGET = {} if "JOBGUARD_TEST_JOB_TIMEOUT" in os.environ else {"timeout": 3}

kills.count_retries(URL)


async def startup(ctx: dict) -> None:
    ctx["db"] = await asyncpg.create_pool(URL, min_size=1, max_size=2)


async def shutdown(ctx: dict) -> None:
    await ctx["db"].close()


async def effect(conn: Any, key: str) -> None:
    await conn.execute("insert into ledger (job_key, pid) values ($1, $2)", key, os.getpid())
    await conn.execute(
        "insert into deliveries (job_key, outcome, pid) values ($1, 'applied', $2)",
        key, os.getpid(),
    )
    await kills.misbehave_async(conn, key)
    kills.die_here("before-commit", key)


def duplicate(ctx: dict, outcome: jobguard.Duplicate, order: str) -> None:
    kills.record_duplicate(URL, jobguard.key("credit", order))


@jobguard.arq.guarded(
    key=lambda order: jobguard.key("credit", order),
    db=lambda ctx: ctx["db"],
    on_duplicate=duplicate,
    max_tries=MAX_TRIES,
    retry_backoff=0.2,
    retry_backoff_max=1.0,
    **BUDGET,
)
async def guarded_credit(ctx: dict, conn: Any, order: str) -> dict:
    await effect(conn, jobguard.key("credit", order))
    return {"credited": order}


async def naive_credit(ctx: dict, order: str) -> dict:
    async with ctx["db"].acquire() as conn, conn.transaction():
        await effect(conn, jobguard.key("credit", order))
    return {"credited": order}


async def credit(ctx: dict, order: str) -> dict:
    out = await (naive_credit if kills.unguarded() else guarded_credit)(ctx, order)
    # Committed; arq has not marked the job complete yet.
    kills.die_here("after-commit", jobguard.key("credit", order))
    return out


if __name__ == "__main__":
    worker = Worker(
        functions=[credit],
        on_startup=startup,
        on_shutdown=shutdown,
        redis_settings=RedisSettings.from_dsn(os.environ["JOBGUARD_TEST_REDIS_URL"]),
        queue_name=os.environ["JOBGUARD_TEST_QUEUE"],
        max_jobs=1,
        job_timeout=JOB_TIMEOUT_S,
        max_tries=MAX_TRIES,
        poll_delay=0.1,
        handle_signals=True,
    )
    # A job whose worker died runs again once its in-progress marker expires, by default
    # job_timeout + 10 s; shortened so the test does not wait for it (the marker is what
    # arq's redelivery rests on, and it is still the one in use).
    worker.in_progress_timeout_s = 2
    worker.run()
