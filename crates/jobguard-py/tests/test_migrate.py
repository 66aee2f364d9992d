"""First contact: a guard on a database without its table raises ``jobguard.NotMigrated``,
which names ``jobguard.migrate``, on every driver, and writes nothing; ``jobguard.migrate`` and
``migrate_sync`` take a connection or what the wrappers take as ``db=`` (a pool, an engine, a
connection factory), so a worker can migrate when it starts."""

from __future__ import annotations

import sqlite3

import asyncpg
import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import create_async_engine

import jobguard
from conftest import CLIENTS


async def test_a_guard_before_migrate_raises_not_migrated_naming_migrate(driver, target):
    client = await CLIENTS[driver].open(target)
    key = jobguard.key("credit", "first-contact")
    try:
        # Bare claim, then the claim with a payload (on PostgreSQL, the held function too).
        for payload in (None, {"amount": 500}):
            await client.begin()
            with pytest.raises(jobguard.NotMigrated) as raised:
                await client.enter(key, payload)
            await client.rollback()
            assert isinstance(raised.value, jobguard.Error)
            message = str(raised.value)
            assert "`processed_jobs`" in message and "jobguard.migrate" in message, message
        await client.migrate()
        await client.begin()
        g = await client.enter(key)
        await client.exit(g)
        await client.commit()
        assert g.applied
    finally:
        await client.close()


async def test_not_migrated_names_the_schema(pg_url):
    conn = await asyncpg.connect(pg_url)
    try:
        with pytest.raises(jobguard.NotMigrated, match=r"`jobs\.guards`"):
            async with conn.transaction():
                async with jobguard.guard(conn, "credit:o-1", table="guards", schema="jobs"):
                    pass
    finally:
        await conn.close()


def guard_table_exists_pg(url: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute("select to_regclass('processed_jobs') is not null").fetchone()[0]


def guard_table_exists_sqlite(path: str) -> bool:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "select count(*) from sqlite_master where type = 'table' and name = 'processed_jobs'"
        ).fetchone()[0] == 1
    finally:
        conn.close()


async def test_migrate_takes_an_asyncpg_pool(pg_url):
    pool = await asyncpg.create_pool(pg_url, min_size=1, max_size=2)
    try:
        await jobguard.migrate(pool)
        await jobguard.migrate(pool)  # idempotent
    finally:
        await pool.close()
    assert guard_table_exists_pg(pg_url)


async def test_migrate_takes_an_async_engine(pg_url):
    engine = create_async_engine("postgresql+asyncpg://" + pg_url.partition("://")[2])
    try:
        await jobguard.migrate(engine)
    finally:
        await engine.dispose()
    assert guard_table_exists_pg(pg_url)


def test_migrate_sync_takes_an_engine_on_postgresql(pg_url):
    engine = sqlalchemy.create_engine("postgresql+psycopg://" + pg_url.partition("://")[2])
    try:
        jobguard.migrate_sync(engine)
    finally:
        engine.dispose()
    assert guard_table_exists_pg(pg_url)


def test_migrate_sync_takes_a_psycopg_connection_factory(pg_url):
    jobguard.migrate_sync(lambda: psycopg.connect(pg_url))
    assert guard_table_exists_pg(pg_url)


def test_migrate_sync_takes_an_engine_on_sqlite(sqlite_path):
    engine = sqlalchemy.create_engine(f"sqlite:///{sqlite_path}")
    try:
        jobguard.migrate_sync(engine)
    finally:
        engine.dispose()
    assert guard_table_exists_sqlite(sqlite_path)


def test_migrate_sync_takes_a_sqlite3_connection_factory(sqlite_path):
    jobguard.migrate_sync(lambda: sqlite3.connect(sqlite_path, isolation_level=None))
    assert guard_table_exists_sqlite(sqlite_path)


def test_migrate_refuses_what_it_cannot_open():
    with pytest.raises(jobguard.UnsupportedConnection):
        jobguard.migrate_sync(object())


async def test_enqueue_before_the_queue_tables_exist_raises_not_migrated(pg_url, sqlite_path):
    conn = await asyncpg.connect(pg_url)
    try:
        with pytest.raises(jobguard.NotMigrated, match="jobguard worker module:app --migrate"):
            async with conn.transaction():
                await jobguard.enqueue(conn, "credit", {"order": "o-1"})
    finally:
        await conn.close()
    lite = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        lite.execute("begin immediate")
        with pytest.raises(jobguard.NotMigrated, match="`jobguard_jobs`"):
            jobguard.enqueue_sync(lite, "credit", {"order": "o-1"})
        lite.execute("rollback")
    finally:
        lite.close()
