"""``@jobguard.guarded``: the body runs once per key; duplicates return the stored result."""

from __future__ import annotations

import asyncio
import sqlite3

import asyncpg
import pytest

import jobguard


async def test_async_on_an_asyncpg_pool_runs_the_body_once_under_concurrent_deliveries(pg_url):
    pool = await asyncpg.create_pool(pg_url, min_size=1, max_size=10)
    try:
        async with pool.acquire() as conn:
            await jobguard.migrate(conn)
            await conn.execute("create table ledger (job_key text not null)")
        calls = []

        @jobguard.guarded(key=lambda order: jobguard.key("credit", order), db=pool)
        async def credit(conn, order):
            calls.append(order)
            await conn.execute("insert into ledger values ($1)", f"credit:{order}")
            return {"credited": order}

        outcomes = await asyncio.gather(*(credit(f"o-{n % 5}") for n in range(15)))
        applied = [o for o in outcomes if isinstance(o, jobguard.Applied)]
        duplicates = [o for o in outcomes if isinstance(o, jobguard.Duplicate)]
        assert len(applied) == 5 and len(duplicates) == 10
        assert sorted(calls) == sorted(f"o-{n}" for n in range(5))
        assert all(d.result == {"credited": d.result["credited"]} for d in duplicates)
        assert await pool.fetchval("select count(*) from ledger") == 5
    finally:
        await pool.close()


def test_sync_on_a_sqlite3_factory_rolls_back_on_error(sqlite_path):
    def connect():
        return sqlite3.connect(sqlite_path, isolation_level=None, timeout=60)

    setup = connect()
    jobguard.migrate_sync(setup)
    setup.execute("create table ledger (job_key text not null)")
    setup.close()
    attempts = []

    @jobguard.guarded(key=jobguard.key("fee", "account-7", "2026-10"), db=connect)
    def fee(conn):
        attempts.append(1)
        conn.execute("insert into ledger values ('fee')")
        if len(attempts) == 1:
            raise RuntimeError("crash before commit")

    with pytest.raises(RuntimeError):
        fee()
    assert isinstance(fee(), jobguard.Applied)
    assert isinstance(fee(), jobguard.Duplicate)
    check = connect()
    assert check.execute("select count(*) from ledger").fetchone()[0] == 1
    check.close()
