"""``python -m django migrate`` creates the guard table and the queue's tables with the Rust
core's statements, on a PostgreSQL database and a SQLite file no test created anything in; the
tables are the ones ``jobguard.migrate`` and the Rust queue make (so either may run first: the
`jobguard` binary enqueues into and lists the queue Django made), and the app's models match
its migrations."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from typing import Iterator

import psycopg

import jobguard
from djcommand import manage, migrate


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("begin immediate")
    yield
    conn.execute("commit")


def claim_twice(conn, transaction) -> list[bool]:
    """Two deliveries of one key, each in ``transaction()``, with jobguard's own guard."""
    applied = []
    for _ in range(2):
        with transaction():
            with jobguard.guard_sync(conn, jobguard.key("credit", "order-1")) as g:
                applied.append(g.applied)
    return applied


def cli(*args: str) -> str:
    """The `jobguard` binary, as an operator runs it."""
    out = subprocess.run(
        [os.environ["JOBGUARD_CLI"], *args], capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_migrate_creates_the_guard_table_on_postgresql(pg_url, tmp_path):
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("select to_regclass('processed_jobs')").fetchone()[0] is None
        assert conn.execute("select to_regclass('jobguard_jobs')").fetchone()[0] is None
    out = migrate("default", pg_url, str(tmp_path / "x.db"))
    assert "Applying jobguard.0001_initial... OK" in out
    assert "Applying jobguard.0002_queue_tables... OK" in out
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("select to_regclass('processed_jobs')").fetchone()[0] == "processed_jobs"
        functions = conn.execute(
            "select proname from pg_proc where proname like 'processed_jobs_%' order by 1"
        ).fetchall()
        assert [f[0] for f in functions] == ["processed_jobs_claim", "processed_jobs_held"]
        # The Rust library's schema marker: jobguard.migrate finds the table migrated.
        jobguard.migrate_sync(conn)
        conn.commit()
        assert claim_twice(conn, conn.transaction) == [True, False]
        # The queue's tables, as the Rust queue made them: its marker, and a job enqueued from
        # Python in Django's tables listed by the `jobguard` binary.
        [(comment,)] = conn.execute("select obj_description('jobguard_jobs'::regclass)").fetchall()
        assert comment.startswith("jobguard schema "), comment
        with conn.transaction():
            jobguard.enqueue_sync(conn, "credit", {"order": "o-7"}, key=jobguard.key("credit", "o-7"))
    assert "credit:o-7" in cli("jobs", "--database-url", pg_url)


def test_migrate_creates_the_guard_table_on_sqlite(pg_url, tmp_path):
    path = str(tmp_path / "app.db")
    out = migrate("sqlite", pg_url, path)
    assert "Applying jobguard.0002_queue_tables... OK" in out
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
        assert {"processed_jobs", "jobguard_jobs", "ledger", "deliveries"} <= tables
        jobguard.migrate_sync(conn)
        assert claim_twice(conn, lambda: immediate(conn)) == [True, False]
        with immediate(conn):
            jobguard.enqueue_sync(conn, "credit", {"order": "o-7"}, key=jobguard.key("credit", "o-7"))
    finally:
        conn.close()
    assert "credit:o-7" in cli("jobs", "--database-url", f"sqlite:{path}")


def test_migrate_after_jobguard_migrate_made_the_table(pg_url, tmp_path):
    with psycopg.connect(pg_url) as conn:
        jobguard.migrate_sync(conn)
    # The Rust queue's tables first: `jobguard enqueue` migrates them.
    cli("enqueue", "noop", "--payload", "{\"id\": \"first\"}", "--database-url", pg_url)
    out = migrate("default", pg_url, str(tmp_path / "x.db"))
    assert "Applying jobguard.0002_queue_tables... OK" in out
    with psycopg.connect(pg_url) as conn:
        [(indexes,)] = conn.execute(
            "select count(*) from pg_indexes where tablename = 'jobguard_jobs'"
        ).fetchall()
    # And the Rust queue after Django: it finds them migrated, and rebuilds nothing.
    cli("enqueue", "noop", "--payload", "{\"id\": \"second\"}", "--database-url", pg_url)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute(
            "select count(*) from pg_indexes where tablename = 'jobguard_jobs'"
        ).fetchone()[0] == indexes


def test_the_models_match_the_migrations(pg_url, tmp_path):
    out = manage(
        "makemigrations", "--check", "--dry-run", "jobguard", "djledger",
        database_url=pg_url, sqlite_path=str(tmp_path / "x.db"),
    )
    assert out.returncode == 0, out.stdout + out.stderr
