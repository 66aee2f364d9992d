"""The app the worker tests run, in-process and as ``python -m jobguard worker``: a credit job
that appends to a ledger, a slow one, and one that always fails; ``async def`` bodies on the
async drivers, plain ``def`` ones (run on threads) on the sync drivers.

``JOBGUARD_TEST_DRIVER`` picks the driver (one of ``DRIVERS``), ``DATABASE_URL`` the database (a
PostgreSQL URL, or a SQLite file's path for ``sqlite3`` and ``sqlalchemy_sqlite``); ``JOBGUARD_TEST_SLOW`` is how long the
slow job sleeps, ``JOBGUARD_TEST_CREDIT_PAUSE`` how long a credit waits after its insert
(seconds); with ``JOBGUARD_TEST_FAIL_ONCE_MOD`` set to N, a credit whose order number is a
multiple of N raises after its insert the first time a process runs it (retried soon after);
``JOBGUARD_TEST_BATCH`` lets the kinds run in batches."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from typing import Any

import jobguard
from jobguard._drivers import convert

ASYNC_DRIVERS = ["asyncpg", "psycopg_async", "sqlalchemy_async"]
SYNC_DRIVERS = ["psycopg", "sqlalchemy", "sqlite3", "sqlalchemy_sqlite"]
DRIVERS = ASYNC_DRIVERS + SYNC_DRIVERS
SQLITE_DRIVERS = ["sqlite3", "sqlalchemy_sqlite"]

LEDGER = """create table if not exists worker_ledger (
    id bigserial primary key, job_key text not null, amount bigint not null,
    pid int not null default pg_backend_pid())"""
SQLITE_LEDGER = """create table if not exists worker_ledger (
    id integer primary key autoincrement, job_key text not null, amount integer not null,
    pid int not null default 0)"""


def sqlite_connect(path: str) -> sqlite3.Connection:
    """A sqlite3 connection as the documented factory makes it: waits for the write lock."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("pragma journal_mode = wal")
    return conn


def _sa_url(url: str, driver: str) -> str:
    return url.replace("postgres://", f"postgresql+{driver}://", 1)


def pool_factory(driver: str, url: str, size: int = 8) -> Any:
    """A function that opens a pool (or engine, or connection) of ``driver`` on ``url``, as an
    app takes it."""
    if driver == "asyncpg":
        import asyncpg

        return lambda: asyncpg.create_pool(url, min_size=1, max_size=size)
    if driver == "psycopg_async":
        from psycopg_pool import AsyncConnectionPool

        return lambda: AsyncConnectionPool(url, min_size=1, max_size=size, open=False)
    if driver == "psycopg":
        from psycopg_pool import ConnectionPool

        return lambda: ConnectionPool(url, min_size=1, max_size=size, open=False)
    if driver == "sqlalchemy":
        import sqlalchemy

        return lambda: sqlalchemy.create_engine(_sa_url(url, "psycopg"), pool_size=size)
    if driver == "sqlalchemy_async":
        from sqlalchemy.ext.asyncio import create_async_engine

        return lambda: create_async_engine(_sa_url(url, "asyncpg"), pool_size=size)
    if driver == "sqlite3":
        return lambda: sqlite_connect(url)
    if driver == "sqlalchemy_sqlite":
        import sqlalchemy

        return lambda: sqlalchemy.create_engine(f"sqlite:///{url}", connect_args={"timeout": 30})
    raise ValueError(f"unknown driver {driver}")


def _style(conn: Any) -> tuple[str, bool]:
    """The placeholder style of a job's connection, and whether it goes through SQLAlchemy."""
    module = type(conn).__module__
    if module.startswith("asyncpg"):
        return "numeric_dollar", False
    if module.startswith("sqlalchemy"):
        return conn.dialect.paramstyle, True
    if isinstance(conn, sqlite3.Connection):
        return "qmark", False
    return "pyformat", False


async def insert(conn: Any, sql: str, *params: Any) -> None:
    """An insert on an async driver's connection."""
    style, via_sqlalchemy = _style(conn)
    text, args = convert(sql, params, style)
    if via_sqlalchemy:
        await conn.exec_driver_sql(text, args)
    elif style == "numeric_dollar":
        await conn.execute(text, *args)
    else:
        await conn.execute(text, args)


def insert_sync(conn: Any, sql: str, *params: Any) -> None:
    """An insert on a sync driver's connection."""
    style, via_sqlalchemy = _style(conn)
    text, args = convert(sql, params, style)
    if via_sqlalchemy:
        conn.exec_driver_sql(text, args)
    else:
        conn.execute(text, args)


LEDGER_INSERT = "insert into worker_ledger (job_key, amount) values ($1, $2)"


def make_app(driver: str, url: str, batch: bool = False,
             **options: Any) -> tuple[jobguard.App, dict[str, int]]:
    """The test app, and the count of calls of each job's body; ``batch``: its kinds may run
    in batches."""
    fail_mod = int(os.environ.get("JOBGUARD_TEST_FAIL_ONCE_MOD", "0"))
    if fail_mod:
        options.setdefault("retry", jobguard.Backoff(base=0.05, max_delay=0.2))
    app = jobguard.App(db=pool_factory(driver, url), **options)
    calls: dict[str, int] = {}

    def fail_once(order: str) -> None:
        if fail_mod and calls[order] == 1 and int(order.rsplit("-", 1)[1]) % fail_mod == 0:
            raise RuntimeError(f"{order} fails its first run here")

    def called(order: str) -> None:
        calls[order] = calls.get(order, 0) + 1

    def pause(name: str, default: str) -> float:
        return float(os.environ.get(name, default))

    if driver in ASYNC_DRIVERS:
        @app.job("credit", key=lambda order, amount: jobguard.key("credit", order), batch=batch)
        async def credit(conn: Any, order: str, amount: int) -> None:
            called(order)
            await insert(conn, LEDGER_INSERT, jobguard.key("credit", order), amount)
            fail_once(order)
            if pause("JOBGUARD_TEST_CREDIT_PAUSE", "0"):  # a commit that a kill can land before
                await asyncio.sleep(pause("JOBGUARD_TEST_CREDIT_PAUSE", "0"))

        @app.job("slow", key=lambda order: jobguard.key("slow", order), batch=batch)
        async def slow(conn: Any, order: str) -> None:
            called(order)
            await asyncio.sleep(pause("JOBGUARD_TEST_SLOW", "1"))
            await insert(conn, LEDGER_INSERT, jobguard.key("slow", order), 1)

        @app.job("broken", key=lambda order: jobguard.key("broken", order), max_attempts=3,
                 batch=batch)
        async def broken(conn: Any, order: str) -> None:
            called(order)
            raise RuntimeError(f"no account for {order}")
    else:
        @app.job("credit", key=lambda order, amount: jobguard.key("credit", order), batch=batch)
        def credit_sync(conn: Any, order: str, amount: int) -> None:
            called(order)
            insert_sync(conn, LEDGER_INSERT, jobguard.key("credit", order), amount)
            fail_once(order)
            time.sleep(pause("JOBGUARD_TEST_CREDIT_PAUSE", "0"))

        @app.job("slow", key=lambda order: jobguard.key("slow", order), batch=batch)
        def slow_sync(conn: Any, order: str) -> None:
            called(order)
            time.sleep(pause("JOBGUARD_TEST_SLOW", "1"))
            insert_sync(conn, LEDGER_INSERT, jobguard.key("slow", order), 1)

        @app.job("broken", key=lambda order: jobguard.key("broken", order), max_attempts=3,
                 batch=batch)
        def broken_sync(conn: Any, order: str) -> None:
            called(order)
            raise RuntimeError(f"no account for {order}")

    return app, calls


if os.environ.get("JOBGUARD_TEST_DRIVER"):
    app, _ = make_app(os.environ["JOBGUARD_TEST_DRIVER"], os.environ["DATABASE_URL"],
                      batch=bool(os.environ.get("JOBGUARD_TEST_BATCH")))
    not_an_app = {"jobs": []}
