"""``python -m jobguard bench`` on a small run: both variants apply each job once."""

from __future__ import annotations

import json
import subprocess
import sys


def test_a_small_bench_applies_each_job_once_in_both_variants(pg_url):
    out = subprocess.run(
        [sys.executable, "-m", "jobguard", "bench", "--database-url", pg_url, "--json",
         "--jobs", "60", "--chunk", "20", "--rounds", "1"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    for variant in ("hand_written", "jobguard"):
        run = report[variant]
        assert (run["deliveries"], run["applied"], run["duplicates"], run["failed"]) == (
            180, 60, 120, 0
        ), run
        assert run["deliveries_per_second"] > 0
    assert report["ratio"] > 0 and "meets_target" in report
