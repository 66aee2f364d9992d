"""``python -m jobguard bench queue`` on a small run, jobguard alone: every job is run and
applied once, none is left, and the report has every figure. The database it ran on is kept
(``--keep``) and read here, so a bench that skipped work fails whatever its report says."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import psycopg
import pytest

JOBS = 200


def _with_db(url: str, name: str) -> str:
    base, _, rest = url.rpartition("/")
    query = rest.partition("?")[2]
    return f"{base}/{name}" + (f"?{query}" if query else "")


def test_a_small_queue_bench_applies_each_job_once_and_reports_every_figure(pg_url):
    prefix = "jgpy_bq_" + uuid.uuid4().hex[:8]
    out = subprocess.run(
        [sys.executable, "-m", "jobguard", "bench", "queue", "--database-url", pg_url, "--json",
         "--jobs", str(JOBS), "--latency-seconds", "1", "--settings", "default",
         "--set", "concurrency=4", "--database-prefix", prefix, "--keep"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )
    bench_db = _with_db(pg_url, f"{prefix}_jobguard_default")
    try:
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        [run] = report["systems"]
        assert (run["system"], run["setting"], run["error"]) == ("jobguard", "default", None), run
        # `--set concurrency=4` over the default's 10; the pool follows it.
        assert run["settings"] == {"concurrency": 4, "pool": 6, "poll_interval": 1.0,
                                   "batch_size": 1}
        assert run["described"].endswith(" with concurrency=4")
        assert run["noop_jobs_per_s"] > 0 and run["credit_jobs_per_s"] > 0
        assert (run["ledger_rows"], run["ledger_distinct"], run["ledger_foreign"]) == (
            JOBS, JOBS, 0)
        assert run["exactly_once"] and run["left"] == 0
        assert run["runs"] == 2 * JOBS  # each body called once
        assert [r["fraction"] for r in run["latency"]] == [0.1, 0.5, 0.9]
        latency_jobs = 0
        for r in run["latency"]:
            assert r["jobs"] > 0 and r["missing"] == 0 and r["enqueue_failed"] == 0, r
            assert 0 <= r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"], r
            assert r["rate"] > 0 and r["achieved"] > 0
            latency_jobs += r["jobs"]
        with psycopg.connect(bench_db) as conn:
            ledger = conn.execute("select count(*), count(distinct n), min(n), max(n) "
                                  "from bench_ledger").fetchone()
            states = dict(conn.execute(
                "select state, count(*) from jobguard_jobs group by state").fetchall())
            claimed = conn.execute("select count(*) from processed_jobs").fetchone()[0]
        assert ledger == (JOBS, JOBS, JOBS, 2 * JOBS - 1)
        assert states == {"completed": 2 * JOBS + latency_jobs}, states
        assert claimed == 2 * JOBS + latency_jobs  # every job claimed its key
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{prefix}_jobguard_default" with (force)')


@pytest.mark.parametrize("bad", ["batch_size", "batch_size=many", "=3", "batch size=3"])
def test_a_setting_that_is_not_a_name_and_a_number_is_refused_in_one_line(bad):
    out = subprocess.run(
        [sys.executable, "-m", "jobguard", "bench", "queue", "--database-url",
         "postgres://nobody@127.0.0.1:1/none", "--set", bad],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
    )
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0 and "--set takes NAME=NUMBER" in out.stderr
