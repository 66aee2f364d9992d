"""The app the worker tests run, in-process and as ``python -m jobguard worker``: a credit job
that appends to a ledger, a slow one, and one that always fails.

``JOBGUARD_TEST_DRIVER`` picks the pool (``asyncpg`` or ``psycopg_async``), ``DATABASE_URL``
the database; ``JOBGUARD_TEST_SLOW`` is how long the slow job sleeps, ``JOBGUARD_TEST_CREDIT_PAUSE`` how long
a credit waits after its insert (seconds)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import jobguard

DRIVERS = ["asyncpg", "psycopg_async"]

LEDGER = """create table if not exists worker_ledger (
    id bigserial primary key, job_key text not null, amount bigint not null,
    pid int not null default pg_backend_pid())"""


def pool_factory(driver: str, url: str, size: int = 8) -> Any:
    """A function that opens a pool of ``driver`` on ``url``, as an app takes it."""
    if driver == "asyncpg":
        import asyncpg

        return lambda: asyncpg.create_pool(url, min_size=1, max_size=size)
    if driver == "psycopg_async":
        from psycopg_pool import AsyncConnectionPool

        return lambda: AsyncConnectionPool(url, min_size=1, max_size=size, open=False)
    raise ValueError(f"unknown driver {driver}")


async def insert(conn: Any, sql: str, *params: Any) -> None:
    """An insert on either driver's connection."""
    if type(conn).__module__.startswith("asyncpg"):
        await conn.execute(sql, *params)
    else:
        from jobguard._drivers import convert

        text, args = convert(sql, params, "pyformat")
        await conn.execute(text, args)


def make_app(driver: str, url: str, **options: Any) -> tuple[jobguard.App, dict[str, int]]:
    """The test app, and the count of calls of each job's body."""
    app = jobguard.App(db=pool_factory(driver, url), **options)
    calls: dict[str, int] = {}

    @app.job("credit", key=lambda order, amount: jobguard.key("credit", order))
    async def credit(conn: Any, order: str, amount: int) -> None:
        calls[order] = calls.get(order, 0) + 1
        await insert(conn, "insert into worker_ledger (job_key, amount) values ($1, $2)",
                     jobguard.key("credit", order), amount)
        pause = float(os.environ.get("JOBGUARD_TEST_CREDIT_PAUSE", "0"))
        if pause:  # a commit that a kill can land before
            await asyncio.sleep(pause)

    @app.job("slow", key=lambda order: jobguard.key("slow", order))
    async def slow(conn: Any, order: str) -> None:
        calls[order] = calls.get(order, 0) + 1
        await asyncio.sleep(float(os.environ.get("JOBGUARD_TEST_SLOW", "1")))
        await insert(conn, "insert into worker_ledger (job_key, amount) values ($1, $2)",
                     jobguard.key("slow", order), 1)

    @app.job("broken", key=lambda order: jobguard.key("broken", order), max_attempts=3)
    async def broken(conn: Any, order: str) -> None:
        calls[order] = calls.get(order, 0) + 1
        raise RuntimeError(f"no account for {order}")

    return app, calls


if os.environ.get("JOBGUARD_TEST_DRIVER"):
    app, _ = make_app(os.environ["JOBGUARD_TEST_DRIVER"], os.environ["DATABASE_URL"])
    not_an_app = {"jobs": []}
