"""Fixtures of the worker tests: a database of its own with the queue's and the guard's
tables (migrated by the Rust ``jobguard worker``, as a deployment does) and the ledger."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ledger_app import DRIVERS, LEDGER  # noqa: E402
from test_cross_language import cli  # noqa: E402,F401  (the fixture)


@pytest.fixture(params=DRIVERS)
def driver(request: Any) -> str:
    return request.param


@pytest.fixture
def queue_url(pg_url: str, cli: Any) -> str:  # noqa: F811
    cli("worker", "--until-idle", url=pg_url)  # creates the queue's and the guard's tables
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(LEDGER)
    return pg_url


def rows(url: str, sql: str, *params: Any) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.fixture
def worker_env(queue_url: str, driver: str) -> dict[str, str]:
    """The environment of a ``python -m jobguard worker ledger_app:app`` process."""
    env = dict(os.environ, DATABASE_URL=queue_url, JOBGUARD_TEST_DRIVER=driver)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                      env.get("PYTHONPATH")]))
    return env
