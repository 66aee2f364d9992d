"""``python -m jobguard bench queue`` on a small run, jobguard alone: every job is run and
applied once, none is left, and the report has every figure. The database it ran on is kept
(``--keep``) and read here, so a bench that skipped work fails whatever its report says."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import psycopg

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
         "--database-prefix", prefix, "--keep"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )
    bench_db = _with_db(pg_url, f"{prefix}_jobguard_default")
    try:
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        [run] = report["systems"]
        assert (run["system"], run["setting"], run["error"]) == ("jobguard", "default", None), run
        assert run["settings"] == {"concurrency": 10, "pool": 12, "poll_interval": 1.0,
                               "batch_size": 1}
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
