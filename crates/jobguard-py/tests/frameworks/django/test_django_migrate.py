"""``python -m django migrate`` creates the guard table with the Rust core's statements, on a
PostgreSQL database and a SQLite file no test created anything in; the table is the one
``jobguard.migrate`` makes (so either may run first), and the app's models match its
migrations."""

from __future__ import annotations

import contextlib
import sqlite3
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


def test_migrate_creates_the_guard_table_on_postgresql(pg_url, tmp_path):
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("select to_regclass('processed_jobs')").fetchone()[0] is None
    assert "Applying jobguard.0001_initial... OK" in migrate("default", pg_url, str(tmp_path / "x.db"))
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


def test_migrate_creates_the_guard_table_on_sqlite(pg_url, tmp_path):
    path = str(tmp_path / "app.db")
    assert "Applying jobguard.0001_initial... OK" in migrate("sqlite", pg_url, path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
        assert {"processed_jobs", "ledger", "deliveries"} <= tables
        jobguard.migrate_sync(conn)
        assert claim_twice(conn, lambda: immediate(conn)) == [True, False]
    finally:
        conn.close()


def test_migrate_after_jobguard_migrate_made_the_table(pg_url, tmp_path):
    with psycopg.connect(pg_url) as conn:
        jobguard.migrate_sync(conn)
    assert "Applying jobguard.0001_initial... OK" in migrate("default", pg_url, str(tmp_path / "x.db"))


def test_the_models_match_the_migrations(pg_url, tmp_path):
    out = manage(
        "makemigrations", "--check", "--dry-run", "jobguard", "djledger",
        database_url=pg_url, sqlite_path=str(tmp_path / "x.db"),
    )
    assert out.returncode == 0, out.stdout + out.stderr
