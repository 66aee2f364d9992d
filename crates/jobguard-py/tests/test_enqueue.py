"""``jobguard.enqueue``: a job enqueued from Python, in the caller's transaction, is run by the
Rust ``jobguard worker``; the live-key dedupe is the Rust queue's own."""

from __future__ import annotations

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
        with pytest.raises(jobguard.NotInTransaction):
            await jobguard.enqueue(conn, "credit", order("o-out"), key=credit("o-out"))
    finally:
        await conn.close()
    cli("worker", "--until-idle", url=pg_url)
    with psycopg.connect(pg_url) as check:
        ledger = dict(check.execute(
            "select job_key, count(*) from jobguard_ledger group by job_key").fetchall())
        jobs = check.execute("select job_key, state from jobguard_jobs").fetchall()
    assert ledger == {credit("o-py"): 1}
    assert jobs == [(credit("o-py"), "completed")]


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
