"""``python -m jobguard demo``: the guide's experiment, on SQLite and PostgreSQL, reporting the
fields ``jobguard demo --json`` reports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
