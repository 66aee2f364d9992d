"""``jobguard.enqueue``: a job enqueued from Python, in the caller's transaction, is run by the
Rust ``jobguard worker``; the live-key dedupe is the Rust queue's own."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

import asyncpg
import psycopg
import pytest

import jobguard
from test_cross_language import cli  # noqa: F401  (the fixture)


class Rollback(Exception):
    pass


def order(name: str, amount: int = 500) -> dict:
    return {"order": name, "account": 7, "amount": amount}


def credit(name: str) -> str:
    return jobguard.key("credit", name)


async def test_a_job_enqueued_from_python_is_run_by_the_rust_worker(pg_url, cli):  # noqa: F811
    cli("worker", "--until-idle", url=pg_url)  # the worker migrates the queue's tables
    conn = await asyncpg.connect(pg_url)
    try:
        async with conn.transaction():
            first = await jobguard.enqueue(conn, "credit", order("o-py"), key=credit("o-py"))
            again = await jobguard.enqueue(conn, "credit", order("o-py"), key=credit("o-py"))
        assert first.inserted and again == jobguard.Enqueued(first.id, False)
        with pytest.raises(jobguard.KeyReused):
            async with conn.transaction():
                await jobguard.enqueue(conn, "credit", order("o-py", 501), key=credit("o-py"))
        with pytest.raises(Rollback):
            async with conn.transaction():
                await jobguard.enqueue(conn, "credit", order("o-rb"), key=credit("o-rb"))
                raise Rollback
        # Outside a transaction, asyncpg commits each statement: the enqueue is its own.
        alone = await jobguard.enqueue(conn, "credit", order("o-out"), key=credit("o-out"))
        assert alone.inserted and not conn.is_in_transaction()
    finally:
        await conn.close()
    cli("worker", "--until-idle", url=pg_url)
    with psycopg.connect(pg_url) as check:
        ledger = dict(check.execute(
            "select job_key, count(*) from jobguard_ledger group by job_key").fetchall())
        jobs = check.execute("select job_key, state from jobguard_jobs").fetchall()
    assert ledger == {credit("o-py"): 1, credit("o-out"): 1}
    assert sorted(jobs) == [(credit("o-out"), "completed"), (credit("o-py"), "completed")]


def test_on_sqlite_with_a_key_derived_from_the_payload(sqlite_path, cli):  # noqa: F811
    url = f"sqlite:{sqlite_path}"
    cli("worker", "--until-idle", url=url)
    conn = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        conn.execute("begin immediate")
        first = jobguard.enqueue_sync(conn, "noop", {"id": "a"})
        again = jobguard.enqueue_sync(conn, "noop", {"id": "a"})
        other = jobguard.enqueue_sync(conn, "noop", {"id": "b"})
        conn.execute("commit")
        assert first.inserted and not again.inserted and again.id == first.id
        assert other.inserted and other.id != first.id
        key = conn.execute("select job_key from jobguard_jobs where id = ?", [first.id]).fetchone()
        assert key == (jobguard.key("noop", jobguard.fingerprint({"id": "a"})),)
    finally:
        conn.close()
    cli("worker", "--until-idle", url=url)
    conn = sqlite3.connect(sqlite_path)
    states = conn.execute("select state from jobguard_jobs order by id").fetchall()
    conn.close()
    assert states == [("completed",), ("completed",)]


async def test_on_a_connection_that_commits_each_statement_an_enqueue_is_its_own_transaction(
        pg_url):
    """asyncpg outside ``transaction()`` and psycopg with ``autocommit=True`` commit each
    statement: an enqueue there commits the job (and wakes workers) as it returns, a unique
    policy's steps and ``enqueue_many`` run in one transaction of their own (all or none). A
    psycopg connection that would open a transaction implicitly, for a commit the caller may
    never make, is refused with nothing written."""
    app = jobguard.App(db=lambda: asyncpg.create_pool(pg_url, min_size=1, max_size=2))

    @app.job("credit", key=lambda order, amount: jobguard.key("credit", order))
    async def credit_job(conn, order: str, amount: int) -> None:  # pragma: no cover - not run
        pass

    await app.migrate()
    conn = await asyncpg.connect(pg_url)
    listener = await asyncpg.connect(pg_url)
    woken: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener("jobguard_jobs", lambda *args: woken.put_nowait(args[3]))
    other = psycopg.connect(pg_url, autocommit=True)

    def waiting(key: str) -> int:
        return other.execute("select count(*) from jobguard_jobs where job_key = %s "
                             "and state = 'available'", [key]).fetchone()[0]

    try:
        done = await credit_job.enqueue(conn, order="o-1", amount=5)
        assert done.inserted and not conn.is_in_transaction()
        assert waiting(credit("o-1")) == 1  # committed: another connection sees it
        assert await asyncio.wait_for(woken.get(), 5) == "default"
        again = await credit_job.enqueue(conn, order="o-1", amount=5)
        assert again == jobguard.Enqueued(done.id, False)
        with pytest.raises(jobguard.KeyReused):
            await credit_job.enqueue(conn, order="o-1", amount=6)

        # Under a unique policy: its read and its write in one transaction of their own.
        daily = jobguard.Unique(period=86400)
        first = await jobguard.enqueue(conn, "fee", {"a": 1}, jobguard.key("fee", "a"),
                                       unique=daily)
        held = await jobguard.enqueue(conn, "fee", {"a": 1}, jobguard.key("fee", "a"),
                                      unique=daily)
        assert first.inserted and held.id == first.id and not held.inserted
        assert not conn.is_in_transaction()

        # enqueue_many: all or none. The reused key sorts last, after two jobs were written.
        await credit_job.enqueue(conn, order="o-9", amount=1)
        with pytest.raises(jobguard.KeyReused):
            await credit_job.enqueue_many(conn, [{"order": "o-2", "amount": 1},
                                                 {"order": "o-3", "amount": 1},
                                                 {"order": "o-9", "amount": 2}])
        assert waiting(credit("o-2")) == waiting(credit("o-3")) == 0
        made = await credit_job.enqueue_many(conn, [{"order": "o-2", "amount": 1},
                                                    {"order": "o-3", "amount": 1}])
        assert all(m.inserted for m in made) and waiting(credit("o-3")) == 1

        # psycopg: in autocommit mode an enqueue commits; otherwise it needs a transaction.
        done = jobguard.enqueue_sync(other, "credit", order("o-5"), key=credit("o-5"))
        assert done.inserted and waiting(credit("o-5")) == 1
        with psycopg.connect(pg_url) as implicit:
            with pytest.raises(jobguard.NotInTransaction, match="autocommit=True"):
                jobguard.enqueue_sync(implicit, "credit", order("o-6"), key=credit("o-6"))
            assert implicit.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert waiting(credit("o-6")) == 0
    finally:
        await conn.close()
        await listener.close()
        other.close()


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg", "sqlalchemy"])
async def test_enqueue_many_inserts_the_new_keys_in_one_statement_and_settles_the_rest_one_by_one(
        pg_url, driver, monkeypatch):
    """``enqueue_many`` on PostgreSQL: the jobs whose keys no live job holds go in one
    statement, which notifies each queue that received one; a key a live job holds, a key's
    later entries and a job under a unique policy are then settled as ``enqueue`` settles them
    one by one (found, refused, or enqueued under the policy). What each entry got comes back
    in the order given, and a refused key rolls the whole batch back."""
    from jobguard import _drivers

    app = jobguard.App(db=lambda: asyncpg.create_pool(pg_url, min_size=1, max_size=2))

    @app.job("credit", key=lambda order, amount: jobguard.key("credit", order))
    async def credit_job(conn, order: str, amount: int) -> None:  # pragma: no cover - not run
        pass

    @app.job("fee", key=lambda account: jobguard.key("fee", account), queue="fees",
             unique=jobguard.Unique(period=86400))
    async def fee_job(conn, account: str) -> None:  # pragma: no cover - not run
        pass

    await app.migrate()
    statements: list[str] = []
    for cls in (_drivers.AsyncpgDriver, _drivers.AsyncPsycopgDriver,
                _drivers.AsyncSqlalchemyDriver):
        for name in ("fetchone", "fetchall", "execute"):
            def counting(original):  # noqa: ANN001, ANN202
                async def run(self, sql, params=()):  # noqa: ANN001, ANN202
                    statements.append(sql)
                    return await original(self, sql, params)
                return run
            monkeypatch.setattr(cls, name, counting(getattr(cls, name)))

    listener = await asyncpg.connect(pg_url)
    woken: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener("jobguard_jobs", lambda *args: woken.put_nowait(args[3]))
    async with _connect(driver, pg_url) as (conn, begin):
        async with begin():
            held = await credit_job.enqueue(conn, order="o-held", amount=1)
        statements.clear()
        orders = [f"o-{n:03}" for n in range(100)]
        async with begin():
            got = await credit_job.enqueue_many(
                conn, [{"order": o, "amount": 1} for o in orders]
                + [{"order": "o-held", "amount": 1}, {"order": "o-007", "amount": 1}])
        # One insert for the 100 new keys; then the held key and o-007's second entry alone.
        assert sum("unnest(" in s for s in statements) == 1
        assert len(statements) == 1 + 2 * 2, statements
        assert all(g.inserted for g in got[:100])
        assert len({g.id for g in got[:100]}) == 100
        assert got[100] == jobguard.Enqueued(held.id, False)
        assert got[101] == jobguard.Enqueued(got[7].id, False)
        assert await asyncio.wait_for(woken.get(), 5) == "default"

        # A policy's job goes alone, under its policy: the same account twice a day is one job.
        async with begin():
            fees = await fee_job.enqueue_many(conn, [{"account": "a"}, {"account": "a"}])
        assert fees[0].inserted and (fees[1].id, fees[1].inserted) == (fees[0].id, False)

        # A key held with another payload refuses the batch: none of it is written.
        with pytest.raises(jobguard.KeyReused):
            async with begin():
                await credit_job.enqueue_many(conn, [{"order": "o-new", "amount": 1},
                                                     {"order": "o-held", "amount": 2}])
    await listener.close()
    with psycopg.connect(pg_url) as check:
        counts = dict(check.execute(
            "select queue, count(*) from jobguard_jobs group by queue").fetchall())
    assert counts == {"default": 101, "fees": 1}


@contextlib.asynccontextmanager
async def _connect(driver: str, url: str):  # noqa: ANN202
    """A connection of ``driver`` and how to open a transaction on it."""
    if driver == "asyncpg":
        conn = await asyncpg.connect(url)
        try:
            yield conn, conn.transaction
        finally:
            await conn.close()
    elif driver == "psycopg":
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            yield conn, conn.transaction
        finally:
            await conn.close()
    else:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(url.replace("postgres://", "postgresql+asyncpg://", 1))
        try:
            async with engine.connect() as conn:
                yield conn, conn.begin
        finally:
            await engine.dispose()


@pytest.mark.parametrize("driver", ["psycopg", "sqlalchemy", "sqlite3"])
def test_enqueue_many_sync_is_the_same_batch_on_a_sync_connection(
        pg_url, sqlite_path, driver, monkeypatch):
    """``enqueue_many_sync``: on PostgreSQL one statement for the keys no live job holds, the
    rest one by one, what each got in the order given, a refused key rolling the batch back;
    on SQLite the jobs one by one, with the same answers."""
    from jobguard import _drivers

    sqlite = driver == "sqlite3"
    if sqlite:
        app = jobguard.App(db=lambda: sqlite3.connect(sqlite_path, isolation_level=None))
    else:
        from psycopg_pool import ConnectionPool

        app = jobguard.App(db=lambda: ConnectionPool(pg_url, min_size=1, max_size=2, open=True))

    @app.job("credit", key=lambda order, amount: jobguard.key("credit", order))
    def credit_job(conn, order: str, amount: int) -> None:  # pragma: no cover - not run
        pass

    app.migrate_sync()
    statements: list[str] = []
    for cls in (_drivers.PsycopgDriver, _drivers.SqlalchemyDriver, _drivers.Sqlite3Driver):
        for name in ("fetchone", "fetchall", "execute"):
            def counting(original):  # noqa: ANN001, ANN202
                def run(self, sql, params=()):  # noqa: ANN001, ANN202
                    statements.append(sql)
                    return original(self, sql, params)
                return run
            if hasattr(cls, name):
                monkeypatch.setattr(cls, name, counting(getattr(cls, name)))

    @contextlib.contextmanager
    def transaction():  # noqa: ANN202
        if driver == "psycopg":
            with psycopg.connect(pg_url, autocommit=True) as conn, conn.transaction():
                yield conn
        elif driver == "sqlalchemy":
            from sqlalchemy import create_engine

            engine = create_engine(pg_url.replace("postgres://", "postgresql+psycopg://", 1))
            try:
                with engine.begin() as conn:
                    yield conn
            finally:
                engine.dispose()
        else:
            conn = sqlite3.connect(sqlite_path, isolation_level=None)
            conn.execute("begin immediate")
            try:
                yield conn
            except BaseException:
                conn.execute("rollback")
                raise
            else:
                conn.execute("commit")
            finally:
                conn.close()

    with transaction() as conn:
        held = credit_job.enqueue_sync(conn, order="o-held", amount=1)
    statements.clear()
    with transaction() as conn:
        got = credit_job.enqueue_many_sync(
            conn, [{"order": f"o-{n:02}", "amount": 1} for n in range(20)]
            + [{"order": "o-held", "amount": 1}, {"order": "o-07", "amount": 1}])
    assert sum("unnest(" in s for s in statements) == (0 if sqlite else 1)
    if not sqlite:
        assert len(statements) == 1 + 2 * 2, statements
    assert all(g.inserted for g in got[:20]) and len({g.id for g in got[:20]}) == 20
    assert got[20] == jobguard.Enqueued(held.id, False)
    assert got[21] == jobguard.Enqueued(got[7].id, False)
    with pytest.raises(jobguard.KeyReused):
        with transaction() as conn:
            credit_job.enqueue_many_sync(conn, [{"order": "o-new", "amount": 1},
                                                {"order": "o-held", "amount": 2}])
    if sqlite:
        check = sqlite3.connect(sqlite_path)
        count = check.execute("select count(*) from jobguard_jobs").fetchone()[0]
        check.close()
    else:
        with psycopg.connect(pg_url) as check:
            count = check.execute("select count(*) from jobguard_jobs").fetchone()[0]
    assert count == 21
