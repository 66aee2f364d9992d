"""Which failures the framework wrappers run again (``jobguard._retry.transient_reason``),
from the real servers' errors through each driver."""

from __future__ import annotations

import sqlite3

import asyncpg
import psycopg
import pytest
import sqlalchemy

from jobguard._retry import RetryPolicy, transient_reason

SERIALIZATION = (
    "do $$ begin raise exception 'could not serialize' using errcode = 'serialization_failure';"
    " end $$"
)
NOT_TRANSIENT = "select 1 / 0"


def test_psycopg_errors(pg_url):
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(psycopg.Error) as serialization:
            conn.execute(SERIALIZATION)
        conn.rollback()
        with pytest.raises(psycopg.Error) as division:
            conn.execute(NOT_TRANSIENT)
        conn.rollback()
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("select pg_terminate_backend(%s)", (conn.info.backend_pid,))
        with pytest.raises(psycopg.Error) as terminated:
            conn.execute("select 1")
        with pytest.raises(psycopg.Error) as closed:
            conn.execute("select 1")
    assert transient_reason(serialization.value) == "sqlstate 40001"
    assert transient_reason(division.value) is None
    assert transient_reason(terminated.value) is not None
    assert transient_reason(closed.value) is not None


async def test_asyncpg_errors(pg_url):
    conn = await asyncpg.connect(pg_url)
    try:
        with pytest.raises(asyncpg.PostgresError) as serialization:
            await conn.execute(SERIALIZATION)
        with pytest.raises(asyncpg.PostgresError) as division:
            await conn.execute(NOT_TRANSIENT)
        other = await asyncpg.connect(pg_url)
        await other.execute(f"select pg_terminate_backend({conn.get_server_pid()})")
        await other.close()
        with pytest.raises(Exception) as terminated:
            await conn.execute("select 1")
    finally:
        conn.terminate()
    assert transient_reason(serialization.value) == "sqlstate 40001"
    assert transient_reason(division.value) is None
    assert transient_reason(terminated.value) is not None


def test_sqlalchemy_wrapped_errors(pg_url):
    engine = sqlalchemy.create_engine(pg_url.replace("postgres://", "postgresql+psycopg://", 1))
    try:
        with pytest.raises(sqlalchemy.exc.DBAPIError) as serialization:
            with engine.begin() as conn:
                conn.exec_driver_sql(SERIALIZATION)
        with pytest.raises(sqlalchemy.exc.DBAPIError) as division:
            with engine.begin() as conn:
                conn.exec_driver_sql(NOT_TRANSIENT)
    finally:
        engine.dispose()
    assert transient_reason(serialization.value) == "sqlstate 40001"
    assert transient_reason(division.value) is None


def test_sqlite_busy(sqlite_path):
    holder = sqlite3.connect(sqlite_path, isolation_level=None)
    waiter = sqlite3.connect(sqlite_path, isolation_level=None, timeout=0)
    try:
        holder.execute("create table t (x int)")
        holder.execute("begin immediate")
        with pytest.raises(sqlite3.OperationalError) as busy:
            waiter.execute("begin immediate")
        with pytest.raises(sqlite3.OperationalError) as missing:
            waiter.execute("select * from no_such_table")
    finally:
        holder.close()
        waiter.close()
    assert transient_reason(busy.value) is not None
    assert transient_reason(missing.value) is None


def test_backoff_is_bounded():
    policy = RetryPolicy(max_retries=5, backoff=1.0, backoff_max=8.0)
    for retries, full in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (10, 8.0), (100, 8.0)]:
        delay = policy.delay(retries)
        assert full / 2 <= delay <= full, (retries, delay)
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)
