"""The Python worker on each driver (asyncpg, psycopg async and sync, SQLAlchemy async and sync
on PostgreSQL, sqlite3 and SQLAlchemy on SQLite): a job applied once, a duplicate not calling its body, an exception retried then
dead-lettered under the Rust policy, a lease taken over fenced off at commit, an enqueue rolled
back leaving nothing, bad input dead-lettered without blocking the queue, and a body of the
other kind than the driver refused at definition."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator

import psycopg
import pytest

import jobguard
from jobguard._pools import open_database
from jobguard._queue_sql import worker_sql
from jobguard.worker import Worker
from conftest import is_postgres, rows
from ledger_app import ASYNC_DRIVERS, _sa_url, make_app, sqlite_connect


class Rollback(Exception):
    pass


@contextlib.asynccontextmanager
async def producer(driver: str, url: str) -> AsyncIterator[Any]:
    """A connection of ``driver`` with a transaction open: committed when the block ends,
    rolled back when it raises."""
    if driver == "asyncpg":
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            async with conn.transaction():
                yield conn
        finally:
            await conn.close()
    elif driver == "psycopg_async":
        import psycopg

        async with await psycopg.AsyncConnection.connect(url) as conn, conn.transaction():
            yield conn
    elif driver == "sqlalchemy_async":
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(_sa_url(url, "asyncpg"))
        try:
            async with engine.begin() as conn:
                yield conn
        finally:
            await engine.dispose()
    elif driver == "psycopg":
        import psycopg

        with psycopg.connect(url) as conn, conn.transaction():
            yield conn
    elif driver == "sqlalchemy":
        import sqlalchemy

        engine = sqlalchemy.create_engine(_sa_url(url, "psycopg"))
        try:
            with engine.begin() as conn:
                yield conn
        finally:
            engine.dispose()
    elif driver == "sqlalchemy_sqlite":
        import sqlalchemy

        engine = sqlalchemy.create_engine(f"sqlite:///{url}", connect_args={"timeout": 30})
        try:
            with engine.begin() as conn:
                yield conn
        finally:
            engine.dispose()
    elif driver == "sqlite3":
        conn = sqlite_connect(url)
        try:
            conn.execute("begin immediate")
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()
        finally:
            conn.close()
    else:
        raise ValueError(driver)


async def enqueue_job(driver: str, conn: Any, job: jobguard.Job, **payload: Any) -> Any:
    if driver in ASYNC_DRIVERS:
        return await job.enqueue(conn, **payload)
    return job.enqueue_sync(conn, **payload)


async def enqueue_raw(driver: str, conn: Any, kind: str, payload: Any, key: str) -> Any:
    """Another producer's enqueue: not through the job's own, so not checked against it."""
    if driver in ASYNC_DRIVERS:
        return await jobguard.enqueue(conn, kind, payload, key=key)
    return jobguard.enqueue_sync(conn, kind, payload, key=key)


async def enqueue(driver: str, url: str, job: jobguard.Job, *payloads: dict) -> list:
    async with producer(driver, url) as conn:
        return [await enqueue_job(driver, conn, job, **payload) for payload in payloads]


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
        w._sql = worker_sql(w._db.dialect, app.table, app.guard_table)
    try:
        [first] = await stale._fetch(1)
        await asyncio.sleep(0.3)  # the lease expires while the stale worker stalls
        async with fresh._db.session() as s:
            assert await s.execute(fresh._sql["rescue"], [10, "[]", fresh._kinds_param()]) == 1
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


async def test_a_worker_rescues_the_expired_leases_of_its_own_kinds_only(driver, queue_url):
    # Another service's worker, whose policy gives a job one attempt, must not dead-letter a
    # credit whose lease expired: the credit's own workers rescue it under their policy.
    app, calls = make_app(driver, queue_url)
    await enqueue(driver, queue_url, app.jobs["credit"], {"order": "o-lost", "amount": 1})
    other = jobguard.App(db=app.db, retry=jobguard.Backoff(max_attempts=1))
    other.job("mail", key=lambda to: jobguard.key("mail", to))(
        app.jobs["slow"].spec.fn)  # any body: no mail job is enqueued
    dying, others, own = Worker(app, lease=0.2), Worker(other, lease=30), Worker(app, lease=30)
    for w in (dying, others, own):
        w._db = await open_database(w.app.db)
        w._sql = worker_sql(w._db.dialect, w.app.table, w.app.guard_table)
    try:
        [lost] = await dying._fetch(1)
        await asyncio.sleep(0.3)  # its worker died: the lease expires, attempt 1 spent
        await others._rescue()
        assert rows(queue_url, "select state, attempt from jobguard_jobs") == [("available", 1)]
        [(leased_until,)] = rows(queue_url, "select leased_until is not null from jobguard_jobs")
        assert leased_until, "the other kind's worker left the lease as it was"
        await own._rescue()
        [again] = await own._fetch(1)
        assert again.id == lost.id and again.attempt == 2
        assert await own.execute(again) == "applied"
    finally:
        for w in (dying, others, own):
            await w._db.close()
    assert calls == {"o-lost": 1}
    assert rows(queue_url, "select state, attempt from jobguard_jobs") == [("completed", 2)]


async def test_an_enqueue_in_a_rolled_back_transaction_leaves_nothing(driver, queue_url):
    app, calls = make_app(driver, queue_url)
    with pytest.raises(Rollback):
        async with producer(driver, queue_url) as conn:
            await enqueue_job(driver, conn, app.jobs["credit"], order="o-rb", amount=1)
            raise Rollback
    assert rows(queue_url, "select count(*) from jobguard_jobs") == [(0,)]
    stats = await app.run_worker(until_idle=True, handle_signals=False)
    assert stats.applied == 0 and calls == {}


async def test_a_job_enqueued_while_the_worker_waits_is_woken_by_its_notification(
    driver, queue_url,
):
    """The enqueue's statement wakes the idle worker: with an hour's poll interval, nothing
    else would fetch the job before the test gives up. Jobs fetched and jobs kept for the next
    fetch share connections; the worker must still see every enqueue."""
    if not is_postgres(queue_url):
        pytest.skip("SQLite has no notifications: its workers poll")
    app, calls = make_app(driver, queue_url)
    worker = Worker(app, concurrency=2, poll_interval=3600, handle_signals=False)
    running = asyncio.ensure_future(worker.run())
    try:
        await _listening(queue_url, running)  # before the enqueues
        for round_ in range(3):
            await enqueue(driver, queue_url, app.jobs["credit"],
                          {"order": f"o-woken-{round_}", "amount": 1})
            for _ in range(1200):
                if calls.get(f"o-woken-{round_}") or running.done():
                    break
                await asyncio.sleep(0.05)
            assert calls.get(f"o-woken-{round_}") == 1, f"round {round_}: not woken"
    finally:
        worker.stop()
        stats = await running
    assert stats.applied == 3 and stats.failed == 0
    assert ledger(queue_url) == {jobguard.key("credit", f"o-woken-{r}"): 1 for r in range(3)}


async def _listening(url: str, running: asyncio.Future) -> None:
    """Until the worker's listener is up (its first fetch then found nothing)."""
    for _ in range(600):
        listening = rows(url, "select count(*) from pg_stat_activity where "
                         "datname = current_database() and query ilike 'listen %%'")
        if listening[0][0] or running.done():
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)


async def test_a_job_ending_does_not_fetch_again_when_the_queue_had_no_more(driver, queue_url):
    """Where enqueues notify, a worker whose last fetch came back short fetches again at the
    next notification, not at each job's end (a fetch that would find nothing): jobs enqueued
    one at a time cost about one fetch each, not two. Idle for a poll interval, it gives the
    connections it kept between jobs back to the pool."""
    if not is_postgres(queue_url):
        pytest.skip("SQLite has no notifications: its workers fetch at each job's end")
    app, calls = make_app(driver, queue_url)
    worker = Worker(app, concurrency=2, poll_interval=3600, handle_signals=False)
    fetches = 0
    fetch = worker._fetch

    async def counted(limit: int) -> list:
        nonlocal fetches
        fetches += 1
        return await fetch(limit)

    worker._fetch = counted  # type: ignore[method-assign]
    running = asyncio.ensure_future(worker.run())
    try:
        await _listening(queue_url, running)
        before = fetches
        for n in range(20):
            await enqueue(driver, queue_url, app.jobs["credit"], {"order": f"o-one-{n}", "amount": 1})
            for _ in range(1200):
                if calls.get(f"o-one-{n}") or running.done():
                    break
                await asyncio.sleep(0.01)
            assert calls.get(f"o-one-{n}") == 1, f"job {n} did not run"
        await asyncio.sleep(0.2)
        assert fetches - before <= 24, f"{fetches - before} fetches for 20 jobs"
        assert worker._kept, "the connections are kept while jobs keep coming"
    finally:
        worker.stop()
        stats = await running
    assert stats.applied == 20
    assert not worker._kept

    idle = Worker(app, concurrency=2, poll_interval=0.2, handle_signals=False)
    running = asyncio.ensure_future(idle.run())
    try:
        await enqueue(driver, queue_url, app.jobs["credit"], {"order": "o-idle", "amount": 1})
        for _ in range(1200):
            if (calls.get("o-idle") and not idle._kept) or running.done():
                break
            await asyncio.sleep(0.01)
        assert calls.get("o-idle") == 1 and not idle._kept, "idle, it gives its connections back"
    finally:
        idle.stop()
        await running


async def test_a_job_waiting_behind_where_fetches_start_is_fetched_by_a_read_of_the_head(
    driver, queue_url,
):
    """Between two reads of the queue's head, a fetch starts a second behind the newest job a
    fetch took, past the index entries of the jobs completed before it. A job that becomes
    waiting further behind (here: its run time ten seconds back, as an enqueue whose
    transaction stayed open that long has) is fetched by the next read of the head, the next
    fetch once a tenth of a second has passed or, with no other fetch, the poll."""
    if not is_postgres(queue_url):
        pytest.skip("SQLite's fetch always reads the head")
    app, calls = make_app(driver, queue_url)
    worker = Worker(app, concurrency=2, poll_interval=0.3, handle_signals=False)
    used: list[str] = []
    choose = worker._fetch_statement

    def recorded(limit: int) -> tuple[str, list]:
        statement, params = choose(limit)
        used.append("after" if statement == worker._sql.get("fetch_after") else "head")
        return statement, params

    worker._fetch_statement = recorded  # type: ignore[method-assign]
    running = asyncio.ensure_future(worker.run())
    try:
        await _listening(queue_url, running)
        for n in range(5):  # enqueued back to back: fetches within a tenth of a second
            await enqueue(driver, queue_url, app.jobs["credit"], {"order": f"o-front-{n}", "amount": 1})
        for _ in range(1200):
            if all(calls.get(f"o-front-{n}") for n in range(5)) or running.done():
                break
            await asyncio.sleep(0.01)
        behind = jobguard.key("credit", "o-behind")
        with psycopg.connect(queue_url) as conn, conn.transaction():
            jobguard.enqueue_sync(conn, "credit", {"order": "o-behind", "amount": 1}, key=behind)
            conn.execute("update jobguard_jobs set run_at = run_at - interval '10 seconds' "
                         "where job_key = %s", [behind])
        for _ in range(1000):
            if calls.get("o-behind") or running.done():
                break
            await asyncio.sleep(0.01)
        assert calls.get("o-behind") == 1, f"the job behind was not fetched ({used})"
        assert "after" in used, used
    finally:
        worker.stop()
        stats = await running
    assert stats.applied == 6 and stats.failed == 0


def test_a_fetch_reads_the_head_every_tenth_of_a_second_and_after_jobs_were_given_back():
    """Which fetch the worker runs: past the floor only where enqueues notify, between reads of
    the head less than ``_HEAD_EVERY`` apart, never when waiting for the queue to be idle or
    after jobs were given back."""
    from jobguard import worker as worker_module

    app = jobguard.App(db=lambda: None)

    @app.job("noop")
    async def noop(conn: Any) -> None:  # pragma: no cover - not run
        pass

    async def choices() -> None:
        worker = Worker(app, handle_signals=False)
        worker._sql = {"fetch": "head", "fetch_after": "after"}
        worker._listening = True
        assert worker._fetch_statement(5)[0] == "head"  # no job taken yet: no floor
        worker._floor = (1_000, 0)
        statement, params = worker._fetch_statement(5)
        assert (statement, params[-2:]) == ("after", [1_000, 0])  # the head read just now
        worker._head_read_at -= worker_module._HEAD_EVERY
        assert worker._fetch_statement(5)[0] == "head"
        assert worker._fetch_statement(5)[0] == "after"
        worker._read_head_next()
        assert worker._fetch_statement(5)[0] == "head"
        worker._listening = False
        assert worker._fetch_statement(5)[0] == "head"
        worker._listening, worker.until_idle = True, True
        assert worker._fetch_statement(5)[0] == "head"

    asyncio.run(choices())


async def test_a_payload_that_does_not_bind_or_a_key_function_that_raises_is_dead_lettered(
    driver, queue_url,
):
    app, calls = make_app(driver, queue_url)
    async with producer(driver, queue_url) as conn:
        await enqueue_raw(driver, conn, "credit", {"order": "o-1", "amout": 5},
                          jobguard.key("credit", "o-1"))
        await enqueue_raw(driver, conn, "credit", {"order": "", "amount": 5},
                          jobguard.key("credit", "o-2"))
        await enqueue_raw(driver, conn, "credit", ["o-3", 5], jobguard.key("credit", "o-3"))
        good = await enqueue_job(driver, conn, app.jobs["credit"], order="o-4", amount=5)
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


def _pool(driver: str, url: str) -> Any:
    """The driver's pool itself (not a factory), made without connecting."""
    if driver == "psycopg_async":
        from psycopg_pool import AsyncConnectionPool

        return AsyncConnectionPool(url, open=False)
    if driver == "psycopg":
        from psycopg_pool import ConnectionPool

        return ConnectionPool(url, open=False)
    if driver == "sqlalchemy":
        import sqlalchemy

        return sqlalchemy.create_engine(_sa_url(url, "psycopg"))
    if driver == "sqlalchemy_async":
        from sqlalchemy.ext.asyncio import create_async_engine

        return create_async_engine(_sa_url(url, "asyncpg"))
    raise ValueError(driver)


async def test_a_body_of_the_other_kind_than_the_driver_is_refused_at_definition(
    driver, queue_url,
):
    if driver == "asyncpg":
        import asyncpg

        db = await asyncpg.create_pool(queue_url, min_size=1, max_size=1)
    elif driver == "sqlite3":
        db = None  # a factory: known when the worker starts (the test below)
    elif driver == "sqlalchemy_sqlite":
        import sqlalchemy

        db = sqlalchemy.create_engine(f"sqlite:///{queue_url}")
    else:
        db = _pool(driver, queue_url)
    if db is not None:
        app = jobguard.App(db=db)
        if driver in ASYNC_DRIVERS:
            with pytest.raises(jobguard.UnsupportedConnection, match="give the app a sync pool"):
                @app.job("credit")
                def credit(conn: Any, order: str) -> None:
                    pass
        else:
            with pytest.raises(jobguard.UnsupportedConnection, match="runs on a thread"):
                @app.job("credit")
                async def credit_async(conn: Any, order: str) -> None:
                    pass
        assert app.jobs == {}
        if driver == "asyncpg":
            await db.close()
    # Through a factory, refused when the worker starts, before it fetches anything.
    app, _ = make_app(driver, queue_url)
    if driver in ASYNC_DRIVERS:
        @app.job("plain")
        def plain(conn: Any, order: str) -> None:
            pass
        match = "`plain` is a plain function"
    else:
        @app.job("coroutine")
        async def coroutine(conn: Any, order: str) -> None:
            pass
        match = "`coroutine` is `async def`"
    with pytest.raises(jobguard.UnsupportedConnection, match=match):
        await app.run_worker(until_idle=True, handle_signals=False)


def test_the_worker_statements_are_the_rust_workers():
    sql = jobguard._native.worker_sql("postgres", "jobguard_jobs", "processed_jobs")
    assert "lease_token = $6" in sql["claim_completing"]
    assert "kind = any($4::text[])" in sql["fetch"]
    assert json.dumps(sorted(sql)) == json.dumps(sorted([
        "claim_completing", "claim_completing_many", "complete", "dead", "fetch",
        "fetch_after", "give_back", "heartbeat", "heartbeat_many", "held", "notify_channel", "release",
        "rescue", "retry"]))
    assert "(run_at, id) > (" in sql["fetch_after"] and "kind = any($4" in sql["fetch_after"]
    assert "unnest($1::int8[], $2::int8[]" in sql["claim_completing_many"]
    sqlite = jobguard._native.worker_sql("sqlite", "jobguard_jobs", "processed_jobs")
    assert "kind in (select value from json_each($4))" in sqlite["fetch"]
    assert "on conflict (job_key) do nothing" in sqlite["claim"]
