"""Transient errors raised by a real PostgreSQL inside a Python worker's job, classified by the
core's table (``jobguard_core::transient``) as the Rust worker classifies them (its twin is
``postgres_faults::transient`` in the Rust tests): the session ended by ``pg_terminate_backend``
(57P01) and a lock not granted in time (55P03) run the job again and spend no attempt, so a job
allowed a single attempt still applies, once; one whose transient error outlasts the core's
runs (``TRANSIENT_RUNS``) is given back, its attempt not counted, never dead-lettered."""

from __future__ import annotations

from typing import Any

import pytest

import jobguard
from jobguard import _native
from conftest import rows
from ledger_app import pool_factory

RUNS: dict[str, int] = {}


@pytest.fixture
def driver() -> str:
    return "asyncpg"


async def test_transient_errors_spend_no_attempt_and_dead_letter_nothing(queue_url: str) -> None:
    # No wait before a job given back runs again, as the Rust test's draining worker.
    app = jobguard.App(db=pool_factory("asyncpg", queue_url),
                       retry=jobguard.Backoff(base=0.0, max_delay=0.0, jitter=0.0))

    @app.job("flaky", key=lambda order, fault, times: jobguard.key("flaky", order),
             max_attempts=1)
    async def flaky(conn: Any, order: str, fault: str, times: int) -> None:
        await conn.execute("insert into worker_ledger(job_key, amount) values($1, 1)",
                           jobguard.key("flaky", order))
        RUNS[order] = run = RUNS.get(order, 0) + 1
        if run <= times and fault == "terminated":
            await conn.execute("select pg_terminate_backend(pg_backend_pid())")
        if run <= times and fault == "lock_timeout":
            await conn.execute("do $$ begin raise exception 'injected fault' "
                               "using errcode = '55P03'; end $$")

    outlasting = _native.TRANSIENT_RUNS + 2
    jobs = [("o-1", "terminated", 1), ("o-2", "lock_timeout", 1),
            ("o-3", "lock_timeout", outlasting)]
    import asyncpg

    conn = await asyncpg.connect(queue_url)
    try:
        for order, fault, times in jobs:
            await flaky.enqueue(conn, order=order, fault=fault, times=times)
    finally:
        await conn.close()

    stats = await app.run_worker(until_idle=True, handle_signals=False, poll_interval=0.05)
    assert (stats.applied, stats.dead) == (3, 0), stats
    assert stats.released == 1, stats
    assert RUNS == {"o-1": 2, "o-2": 2, "o-3": outlasting + 1}
    assert rows(queue_url, "select job_key, count(*) from worker_ledger group by job_key "
                           "order by job_key") == [(jobguard.key("flaky", o), 1)
                                                    for o in ("o-1", "o-2", "o-3")]
    assert rows(queue_url, "select state, attempt from jobguard_jobs order by id") == [
        ("completed", 1)] * 3
