"""Fixtures: a database of its own per test (PostgreSQL) or a file (SQLite), and one client
per driver with the same async interface, so every test runs once against every driver."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobguard

ADMIN_URL = os.environ.get(
    "JOBGUARD_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"
)

POSTGRES_DRIVERS = ["asyncpg", "psycopg", "psycopg_async", "sqlalchemy", "sqlalchemy_async"]
SQLITE_DRIVERS = ["sqlite3", "aiosqlite", "sqlalchemy_sqlite"]
DRIVERS = POSTGRES_DRIVERS + SQLITE_DRIVERS


def _with_db(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    query = url.partition("?")[2]
    return f"{base}/{name}" + (f"?{query}" if query else "")


@pytest.fixture
def pg_url() -> Any:
    name = "jgpy_" + uuid.uuid4().hex[:12]
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'create database "{name}"')
    yield _with_db(ADMIN_URL, name)
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'drop database if exists "{name}" with (force)')


@pytest.fixture
def sqlite_path(tmp_path: Path) -> str:
    return str(tmp_path / "jobs.db")


class Client:
    """One connection of one driver: begin, guard, effect, commit or roll back."""

    dialect = "postgres"
    is_async = True

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.tx: Any = None

    async def call(self, fn: Any, *args: Any) -> Any:
        if self.is_async:
            return await fn(*args)
        return await asyncio.to_thread(fn, *args)

    def guard(self, key: str, payload: Any = None) -> jobguard.Guard:
        if self.is_async:
            return jobguard.guard(self.conn, key, payload)
        return jobguard.guard_sync(self.conn, key, payload)

    async def enter(self, key: str, payload: Any = None) -> jobguard.Guard:
        g = self.guard(key, payload)
        if self.is_async:
            return await g.__aenter__()
        return await asyncio.to_thread(g.__enter__)

    async def held(self, g: jobguard.Guard) -> Any:
        if self.is_async:
            return await g.held()
        return await asyncio.to_thread(g.held)

    async def exit(self, g: jobguard.Guard, error: BaseException | None = None) -> None:
        args = (type(error), error, None) if error else (None, None, None)
        if self.is_async:
            await g.__aexit__(*args)
        else:
            await asyncio.to_thread(g.__exit__, *args)

    async def effect(self, key: str) -> None:
        await self.execute("insert into ledger (job_key) values ($1)", [key])

    async def execute(self, sql: str, params: list[Any]) -> None:
        from jobguard._drivers import driver_for

        d = driver_for(self.conn)
        await self.call(d.execute, sql, params)

    async def migrate(self) -> None:
        if self.is_async:
            await jobguard.migrate(self.conn)
        else:
            await asyncio.to_thread(jobguard.migrate_sync, self.conn)


class Asyncpg(Client):
    @classmethod
    async def open(cls, url: str) -> "Asyncpg":
        import asyncpg

        return cls(await asyncpg.connect(url))

    async def begin(self) -> None:
        self.tx = self.conn.transaction()
        await self.tx.start()

    async def commit(self) -> None:
        await self.tx.commit()

    async def rollback(self) -> None:
        await self.tx.rollback()

    async def close(self) -> None:
        await self.conn.close()


class Psycopg(Client):
    is_async = False

    @classmethod
    async def open(cls, url: str) -> "Psycopg":
        return cls(psycopg.connect(url, autocommit=True))

    async def begin(self) -> None:
        self.tx = self.conn.transaction()
        await asyncio.to_thread(self.tx.__enter__)

    async def commit(self) -> None:
        await asyncio.to_thread(self.tx.__exit__, None, None, None)

    async def rollback(self) -> None:
        error = psycopg.Rollback()
        await asyncio.to_thread(self.tx.__exit__, type(error), error, None)

    async def close(self) -> None:
        self.conn.close()


class PsycopgAsync(Client):
    @classmethod
    async def open(cls, url: str) -> "PsycopgAsync":
        return cls(await psycopg.AsyncConnection.connect(url, autocommit=True))

    async def begin(self) -> None:
        self.tx = self.conn.transaction()
        await self.tx.__aenter__()

    async def commit(self) -> None:
        await self.tx.__aexit__(None, None, None)

    async def rollback(self) -> None:
        error = psycopg.Rollback()
        await self.tx.__aexit__(type(error), error, None)

    async def close(self) -> None:
        await self.conn.close()


class Sqlalchemy(Client):
    is_async = False
    url_prefix = "postgresql+psycopg://"

    @classmethod
    async def open(cls, url: str) -> "Sqlalchemy":
        import sqlalchemy

        engine = sqlalchemy.create_engine(cls.sa_url(url), poolclass=sqlalchemy.pool.NullPool)
        client = cls(engine.connect())
        client.engine = engine
        return client

    @classmethod
    def sa_url(cls, url: str) -> str:
        return cls.url_prefix + url.partition("://")[2]

    async def begin(self) -> None:
        self.tx = await asyncio.to_thread(self.conn.begin)

    async def commit(self) -> None:
        await asyncio.to_thread(self.tx.commit)

    async def rollback(self) -> None:
        await asyncio.to_thread(self.tx.rollback)

    async def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


class SqlalchemyAsync(Client):
    @classmethod
    async def open(cls, url: str) -> "SqlalchemyAsync":
        import sqlalchemy
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(
            "postgresql+asyncpg://" + url.partition("://")[2], poolclass=sqlalchemy.pool.NullPool
        )
        client = cls(await engine.connect())
        client.engine = engine
        return client

    async def begin(self) -> None:
        self.tx = await self.conn.begin()

    async def commit(self) -> None:
        await self.tx.commit()

    async def rollback(self) -> None:
        await self.tx.rollback()

    async def close(self) -> None:
        await self.conn.close()
        await self.engine.dispose()


class Sqlite3(Client):
    dialect = "sqlite"
    is_async = False

    @classmethod
    async def open(cls, path: str) -> "Sqlite3":
        conn = sqlite3.connect(path, timeout=600, isolation_level=None, check_same_thread=False)
        conn.execute("pragma journal_mode = wal")
        return cls(conn)

    async def begin(self) -> None:
        await asyncio.to_thread(self.conn.execute, "begin immediate")

    async def commit(self) -> None:
        await asyncio.to_thread(self.conn.execute, "commit")

    async def rollback(self) -> None:
        await asyncio.to_thread(self.conn.execute, "rollback")

    async def close(self) -> None:
        self.conn.close()


class Aiosqlite(Client):
    dialect = "sqlite"

    @classmethod
    async def open(cls, path: str) -> "Aiosqlite":
        import aiosqlite

        conn = await aiosqlite.connect(path, timeout=600, isolation_level=None)
        await conn.execute("pragma journal_mode = wal")
        return cls(conn)

    async def begin(self) -> None:
        await self.conn.execute("begin immediate")

    async def commit(self) -> None:
        await self.conn.execute("commit")

    async def rollback(self) -> None:
        await self.conn.execute("rollback")

    async def close(self) -> None:
        await self.conn.close()


class SqlalchemySqlite(Sqlalchemy):
    dialect = "sqlite"

    @classmethod
    async def open(cls, path: str) -> "SqlalchemySqlite":
        import sqlalchemy

        engine = sqlalchemy.create_engine(
            f"sqlite:///{path}",
            poolclass=sqlalchemy.pool.NullPool,
            connect_args={"timeout": 600, "check_same_thread": False},
        )

        # pysqlite begins lazily; SQLAlchemy's documented recipe takes the write lock at begin.
        @sqlalchemy.event.listens_for(engine, "connect")
        def _connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None

        @sqlalchemy.event.listens_for(engine, "begin")
        def _begin(conn: Any) -> None:
            conn.exec_driver_sql("begin immediate")

        client = cls(engine.connect())
        client.engine = engine
        return client


CLIENTS = {
    "asyncpg": Asyncpg,
    "psycopg": Psycopg,
    "psycopg_async": PsycopgAsync,
    "sqlalchemy": Sqlalchemy,
    "sqlalchemy_async": SqlalchemyAsync,
    "sqlite3": Sqlite3,
    "aiosqlite": Aiosqlite,
    "sqlalchemy_sqlite": SqlalchemySqlite,
}


@pytest.fixture(params=DRIVERS)
def driver(request: Any) -> str:
    return request.param


@pytest.fixture
def target(driver: str, request: Any) -> str:
    if driver in SQLITE_DRIVERS:
        return request.getfixturevalue("sqlite_path")
    return request.getfixturevalue("pg_url")


@pytest.fixture
async def connect(driver: str, target: str) -> Any:
    """``await connect()`` opens one more connection of the test's driver; the first one
    migrates the guard table and makes the ledger the effects go to."""
    opened: list[Client] = []

    async def open_client() -> Client:
        client = await CLIENTS[driver].open(target)
        if not opened:
            await client.migrate()
            await client.begin()
            await client.execute("create table if not exists ledger (job_key text not null)", [])
            await client.commit()
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        try:
            await client.close()
        except Exception:
            pass


async def count(client: Client, sql: str, params: list[Any]) -> int:
    from jobguard._drivers import driver_for

    d = driver_for(client.conn)
    row = await client.call(d.fetchone, sql, params)
    return int(row[0])


async def ledger_rows(client: Client, key: str) -> int:
    await client.begin()
    try:
        return await count(client, "select count(*) from ledger where job_key = $1", [key])
    finally:
        await client.commit()


async def guard_rows(client: Client, key: str) -> int:
    await client.begin()
    try:
        return await count(client, "select count(*) from processed_jobs where job_key = $1", [key])
    finally:
        await client.commit()
