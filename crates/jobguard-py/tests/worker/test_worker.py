"""The Python worker on each async driver: a job applied once, a duplicate not calling its body,
an exception retried then dead-lettered under the Rust policy, a lease taken over fenced off at
commit, an enqueue rolled back leaving nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import jobguard
from jobguard._pools import open_database
from jobguard.worker import Worker
from conftest import rows
from ledger_app import make_app


async def connect(driver: str, url: str) -> Any:
    if driver == "asyncpg":
        import asyncpg

        return await asyncpg.connect(url)
    import psycopg

    return await psycopg.AsyncConnection.connect(url)


class Rollback(Exception):
    pass


async def enqueue(driver: str, url: str, job: jobguard.Job, *payloads: dict) -> list:
    conn = await connect(driver, url)
    try:
        async with conn.transaction():
            return [await job.enqueue(conn, **payload) for payload in payloads]
    finally:
        await conn.close()


def ledger(url: str) -> dict[str, int]:
    return dict(rows(url, "select job_key, count(*) from worker_ledger group by job_key"))


async def test_each_job_is_applied_once(driver, queue_url):
    app, calls = make_app(driver, queue_url)
    orders = [{"order": f"o-{i}", "amount": i} for i in range(30)]
    inserted = await enqueue(driver, queue_url, app.jobs["credit"], *orders, orders[0])
    assert [e.inserted for e in inserted] == [True] * 30 + [False]
    stats = await app.run_worker(concurrency=4, until_idle=True, handle_signals=False)
    assert stats.applied == 30 and stats.failed == stats.dead == stats.fenced == 0
    assert ledger(queue_url) == {jobguard.key("credit", f"o-{i}"): 1 for i in range(30)}
    assert set(calls.values()) == {1}
    assert rows(queue_url, "select distinct state from jobguard_jobs") == [("completed",)]


async def test_a_duplicate_completes_without_calling_the_body(driver, queue_url):
    app, calls = make_app(driver, queue_url)
    credit = app.jobs["credit"]
    await enqueue(driver, queue_url, credit, {"order": "o-dup", "amount": 5})
    await app.run_worker(until_idle=True, handle_signals=False)
    # The first job completed: the key is free in the queue, and applied in the guard.
    again = await enqueue(driver, queue_url, credit, {"order": "o-dup", "amount": 5})
    assert again[0].inserted
    stats = await app.run_worker(until_idle=True, handle_signals=False)
    assert stats.duplicates == 1 and stats.applied == 0
    assert calls == {"o-dup": 1}
    assert ledger(queue_url) == {jobguard.key("credit", "o-dup"): 1}
    assert rows(queue_url, "select state from jobguard_jobs order by id") == [
        ("completed",), ("completed",)]


async def test_an_exception_is_retried_then_dead_lettered_with_the_rust_policy(driver, queue_url):
    retry = jobguard.Backoff(max_attempts=5, base=0.01, max_delay=0.02, jitter=0.0)
    app, calls = make_app(driver, queue_url, retry=retry)
    await enqueue(driver, queue_url, app.jobs["broken"], {"order": "o-bad"})
    for _ in range(50):
        await app.run_worker(until_idle=True, handle_signals=False, poll_interval=0.01)
        if rows(queue_url, "select state from jobguard_jobs") == [("dead",)]:
            break
        await asyncio.sleep(0.02)
    # The job's own max_attempts (3) is less than the policy's (5): the lesser wins, as in Rust.
    [(state, attempt, error)] = rows(queue_url,
                                     "select state, attempt, last_error from jobguard_jobs")
    assert (state, attempt) == ("dead", 3)
    assert "RuntimeError: no account for o-bad" in error
    assert calls == {"o-bad": 3}
    assert ledger(queue_url) == {}


async def test_a_lease_taken_over_is_fenced_off_at_commit(driver, queue_url):
    app, calls = make_app(driver, queue_url)
    await enqueue(driver, queue_url, app.jobs["credit"], {"order": "o-slow", "amount": 1})
    stale, fresh = Worker(app, lease=0.2), Worker(app, lease=30)
    for w in (stale, fresh):
        w._db = await open_database(app.db)
        w._sql = jobguard._queue_sql.worker_sql("postgres", app.table, app.guard_table)
    try:
        [first] = await stale._fetch(1)
        await asyncio.sleep(0.3)  # the lease expires while the stale worker stalls
        async with fresh._db.session() as s:
            assert await s.execute(fresh._sql["rescue"], [10, "[]"]) == 1
        [second] = await fresh._fetch(1)
        assert second.id == first.id and second.token > first.token
        # The stale worker wakes up: its claim finds the lease gone, so it neither calls the
        # body nor commits anything.
        assert await stale.execute(first) == "fenced"
        assert calls == {} and ledger(queue_url) == {}
        assert await fresh.execute(second) == "applied"
    finally:
        for w in (stale, fresh):
            await w._db.close()
    assert calls == {"o-slow": 1}
    assert ledger(queue_url) == {jobguard.key("credit", "o-slow"): 1}
    assert rows(queue_url, "select state, attempt from jobguard_jobs") == [("completed", 2)]


async def test_an_enqueue_in_a_rolled_back_transaction_leaves_nothing(driver, queue_url):
    app, calls = make_app(driver, queue_url)
    conn = await connect(driver, queue_url)
    try:
        with pytest.raises(Rollback):
            async with conn.transaction():
                await app.jobs["credit"].enqueue(conn, order="o-rb", amount=1)
                raise Rollback
    finally:
        await conn.close()
    assert rows(queue_url, "select count(*) from jobguard_jobs") == [(0,)]
    stats = await app.run_worker(until_idle=True, handle_signals=False)
    assert stats.applied == 0 and calls == {}


async def test_a_payload_that_does_not_bind_or_a_key_function_that_raises_is_dead_lettered(
    driver, queue_url,
):
    app, calls = make_app(driver, queue_url)
    conn = await connect(driver, queue_url)
    try:
        async with conn.transaction():
            # Enqueued by another producer, not through the job's own enqueue.
            await jobguard.enqueue(conn, "credit", {"order": "o-1", "amout": 5},
                                   key=jobguard.key("credit", "o-1"))
            await jobguard.enqueue(conn, "credit", {"order": "", "amount": 5},
                                   key=jobguard.key("credit", "o-2"))
            await jobguard.enqueue(conn, "credit", ["o-3", 5], key=jobguard.key("credit", "o-3"))
            good = await app.jobs["credit"].enqueue(conn, order="o-4", amount=5)
    finally:
        await conn.close()
    stats = await app.run_worker(until_idle=True, handle_signals=False)
    assert (stats.dead, stats.applied) == (3, 1)
    errors = dict(rows(queue_url, "select job_key, last_error from jobguard_jobs "
                                  "where state = 'dead'"))
    assert "does not bind to `credit`'s parameters" in errors["credit:o-1"]
    assert "'amount'" in errors["credit:o-1"]
    assert "the key function raised" in errors["credit:o-2"]
    assert "not an object" in errors["credit:o-3"]
    assert rows(queue_url, "select state from jobguard_jobs where id = %s", good.id) == [
        ("completed",)]
    assert calls == {"o-4": 1}


def test_a_sync_job_on_an_async_pool_is_refused_at_definition(queue_url):
    import asyncpg

    async def make() -> None:
        pool = await asyncpg.create_pool(queue_url, min_size=1, max_size=1)
        try:
            app = jobguard.App(db=pool)
            with pytest.raises(jobguard.UnsupportedConnection, match="async def"):
                @app.job("credit")
                def credit(conn: Any, order: str) -> None:
                    pass
            assert app.jobs == {}
        finally:
            await pool.close()

    asyncio.run(make())


async def test_a_sync_job_on_a_pool_from_a_factory_is_refused_when_the_worker_starts(queue_url):
    app, _ = make_app("asyncpg", queue_url)

    @app.job("plain")
    def plain(conn: Any, order: str) -> None:
        pass

    with pytest.raises(jobguard.UnsupportedConnection, match="`plain` is a plain function"):
        await app.run_worker(until_idle=True, handle_signals=False)


def test_the_worker_statements_are_the_rust_workers(queue_url):
    sql = jobguard._native.worker_sql("postgres", "jobguard_jobs", "processed_jobs")
    assert "lease_token = $6" in sql["claim_completing"]
    assert "kind = any($4::text[])" in sql["fetch"]
    assert json.dumps(sorted(sql)) == json.dumps(sorted([
        "claim_completing", "complete", "dead", "fetch", "heartbeat", "heartbeat_many",
        "notify_channel", "release", "rescue", "retry"]))
