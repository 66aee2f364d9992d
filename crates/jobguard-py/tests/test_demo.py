"""``python -m jobguard demo``: the guide's experiment, on SQLite and PostgreSQL, reporting the
fields ``jobguard demo --json`` reports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# At the top, while `conftest` is still this directory's: worker/ has a conftest of its own.
from conftest import ADMIN_URL, _with_db

FIELDS = {
    "backend", "database", "jobs", "deliveries", "concurrency", "expected_balance_total",
    "naive", "guarded", "exactly_once", "seconds",
}
RUN_FIELDS = {
    "deliveries", "effects", "applied", "duplicates", "failed", "balance_total", "seconds",
    "deliveries_per_second",
}


def demo(url: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "jobguard", "demo", "--database-url", url, "--json"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_demo_applies_each_job_once_and_reports_the_duplicates(backend, request):
    if backend == "sqlite":
        url = "sqlite:" + request.getfixturevalue("sqlite_path")
    else:
        url = request.getfixturevalue("pg_url")
    report = demo(url)
    assert set(report) == FIELDS
    assert set(report["naive"]) == RUN_FIELDS and set(report["guarded"]) == RUN_FIELDS
    assert report["backend"] == backend
    assert (report["jobs"], report["deliveries"], report["concurrency"]) == (100, 3, 20)
    naive, guarded = report["naive"], report["guarded"]
    # The naive job applies every delivery: balances tripled.
    assert naive["effects"] == 300 and naive["balance_total"] == 3 * report["expected_balance_total"]
    assert guarded["effects"] == 100 and guarded["applied"] == 100
    assert guarded["duplicates"] == 200 and guarded["failed"] == 0
    assert guarded["balance_total"] == report["expected_balance_total"]
    assert report["exactly_once"] is True


def test_the_demo_reports_the_same_fields_as_the_rust_cli(sqlite_path, tmp_path):
    from test_cross_language import CLI

    if not CLI:
        pytest.skip("no jobguard binary (set JOBGUARD_CLI)")
    rust = subprocess.run(
        [CLI, "demo", "--json", "--database-url", f"sqlite:{tmp_path / 'rust.db'}"],
        capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL,
    )
    rust_report = json.loads(rust.stdout)
    python_report = demo(f"sqlite:{sqlite_path}")
    assert set(python_report) == set(rust_report)
    for run in ("naive", "guarded"):
        assert set(python_report[run]) == set(rust_report[run]) - {"first_error"}
        assert python_report[run]["effects"] == rust_report[run]["effects"]
    assert python_report["expected_balance_total"] == rust_report["expected_balance_total"]


def run_demo(url: str, block_asyncpg: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m jobguard demo``, with ``import asyncpg`` failing as on an install without
    the ``[asyncpg]`` extra when asked."""
    block = "sys.modules['asyncpg'] = None; " if block_asyncpg else ""
    code = f"import sys; {block}from jobguard.__main__ import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "demo", "--database-url", url],
        capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )


def test_the_demo_on_postgresql_drops_what_it_made(pg_url):
    import psycopg

    demo(pg_url)
    with psycopg.connect(pg_url) as conn:
        left = conn.execute(
            "select n.nspname || '.' || c.relname from pg_class c "
            "join pg_namespace n on n.oid = c.relnamespace "
            "where c.relname like 'jobguard_demo%' or n.nspname like 'jobguard_demo%' "
            "union all select nspname from pg_namespace where nspname like 'jobguard_demo%' "
            "union all select proname from pg_proc where proname like 'jobguard_demo%'"
        ).fetchall()
    assert left == []


def test_the_demo_on_sqlite_removes_the_file_it_created(tmp_path):
    path = tmp_path / "demo.db"
    demo(f"sqlite:{path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_demo_on_an_existing_sqlite_file_drops_only_its_tables(tmp_path):
    import sqlite3

    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("create table orders (id integer primary key)")
    conn.commit()
    conn.close()
    demo(f"sqlite:{path}")
    conn = sqlite3.connect(path)
    tables = [r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")]
    conn.close()
    assert tables == ["orders"]


@pytest.mark.parametrize(
    "case, expected",
    [
        ("no_asyncpg", "pip install 'jobguard[asyncpg]'"),
        ("unreachable", "cannot connect to postgres://postgres@127.0.0.1:1/postgres"),
        ("missing_database", 'database "jobguard_no_such_db" does not exist'),
        ("unopenable_sqlite", "cannot open the SQLite database"),
        ("unknown_scheme", "give postgres://user@host/db or sqlite:path.db"),
    ],
)
def test_the_demo_reports_what_stops_it_in_one_line(case, expected, tmp_path):
    url = {
        "no_asyncpg": ADMIN_URL,
        "unreachable": "postgres://postgres@127.0.0.1:1/postgres",
        "missing_database": _with_db(ADMIN_URL, "jobguard_no_such_db"),
        "unopenable_sqlite": f"sqlite:{tmp_path / 'no-such-dir' / 'demo.db'}",
        "unknown_scheme": "mysql://localhost/app",
    }[case]
    out = run_demo(url, block_asyncpg=case == "no_asyncpg")
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("python -m jobguard demo: ") and expected in lines[0], lines[0]
