"""Fixtures of the worker tests: a database of its own with the queue's and the guard's
tables (migrated by the Rust ``jobguard worker``, as a deployment does) and the ledger, on
PostgreSQL or, for the sqlite3 driver, in a SQLite file."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ledger_app import DRIVERS, LEDGER, SQLITE_DRIVERS, SQLITE_LEDGER  # noqa: E402
from test_cross_language import cli  # noqa: E402,F401  (the fixture)


@pytest.fixture(params=DRIVERS)
def driver(request: Any) -> str:
    return request.param


def is_postgres(target: str) -> bool:
    return target.startswith(("postgres://", "postgresql://"))


def database_url(target: str) -> str:
    """The ``--database-url`` of the ``jobguard`` CLI for a test's database."""
    return target if is_postgres(target) else f"sqlite:{target}"


@pytest.fixture
def queue_url(driver: str, cli: Any, request: Any) -> str:  # noqa: F811
    """The test's database (a PostgreSQL URL, or a SQLite file's path for sqlite3), its
    tables made by the Rust worker."""
    if driver in SQLITE_DRIVERS:
        target = str(request.getfixturevalue("tmp_path") / "jobs.db")
    else:
        target = request.getfixturevalue("pg_url")
    cli("worker", "--until-idle", url=database_url(target))  # the queue's and the guard's tables
    execute(target, SQLITE_LEDGER if driver in SQLITE_DRIVERS else LEDGER)
    return target


def execute(target: str, sql: str) -> None:
    if is_postgres(target):
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(sql)
    else:
        with sqlite3.connect(target, isolation_level=None) as conn:
            conn.execute(sql)


def rows(target: str, sql: str, *params: Any) -> list[tuple]:
    """The rows of ``sql`` (``%s`` placeholders) on a PostgreSQL URL or a SQLite file."""
    if is_postgres(target):
        with psycopg.connect(target, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()
    conn = sqlite3.connect(target, timeout=30, isolation_level=None)
    try:
        return [tuple(r) for r in conn.execute(sql.replace("%s", "?"), params).fetchall()]
    finally:
        conn.close()


@pytest.fixture
def worker_env(queue_url: str, driver: str) -> dict[str, str]:
    """The environment of a ``python -m jobguard worker ledger_app:app`` process."""
    env = dict(os.environ, DATABASE_URL=queue_url, JOBGUARD_TEST_DRIVER=driver)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                      env.get("PYTHONPATH")]))
    return env
