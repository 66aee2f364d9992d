"""Python schedulers in real worker processes: three ``python -m jobguard worker`` processes on
one schedule firing every second, SIGKILLed and SIGSTOPped at random, enqueue and apply every
firing in the window exactly once; and a Python and a Rust scheduler (``jobguard worker
--schedule FILE``) on one schedule name enqueue each firing once."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time

import psycopg
import pytest

from jobguard._native import firing_key, format_firing
from chaos import Fleet, python_worker, seed, stop_all
from conftest import rows
from periodic_app import PERIODIC_LEDGER
from test_cross_language import CLI

WORKERS = 3


@pytest.fixture(params=["asyncpg", "psycopg_async"])
def driver(request: pytest.FixtureRequest) -> str:
    """The schedulers' driver: the chaos costs ~30 s a run, so the two async pools only."""
    return str(request.param)
CHAOS_SECONDS = 20


def firing_times(url: str, name: str) -> list[int]:
    """Every firing of the every-second schedule ``name`` from its first run through its last
    firing recorded: the window every scheduler shared."""
    [(created_at, last_fired_at)] = rows(
        url, "select created_at, last_fired_at from jobguard_jobs_schedules where name = %s",
        name)
    assert last_fired_at is not None
    return list(range(created_at + 1, last_fired_at + 1))


def drain(env: dict[str, str]) -> None:
    """Runs the jobs left with a worker that has no schedule, until the queue is idle."""
    subprocess.run([sys.executable, "-m", "jobguard", "worker", "periodic_app:drain",
                    "--until-idle", "--poll-interval", "0.1"],
                   env=env, stdin=subprocess.DEVNULL, check=True, timeout=120,
                   capture_output=True)


def test_three_schedulers_killed_at_random_apply_every_firing_once(worker_env, queue_url):
    run_seed = seed()
    rng = random.Random(run_seed)
    with psycopg.connect(queue_url, autocommit=True) as conn:
        conn.execute(PERIODIC_LEDGER)
    with Fleet([python_worker(worker_env, "periodic_app:app")] * WORKERS) as fleet:
        fleet.chaos(rng, CHAOS_SECONDS)
    kills, stops = fleet.kills, fleet.stops
    drain(worker_env)
    context = f"seed {run_seed}, {kills} kills, {stops} stops"
    window = firing_times(queue_url, "every-second")
    assert len(window) >= CHAOS_SECONDS // 2, context
    keys = {firing_key("every-second", at) for at in window}
    jobs = rows(queue_url, "select job_key, state from jobguard_jobs where kind = 'tick'")
    assert {key for key, _ in jobs} == keys, context
    assert len(jobs) == len(keys) and {state for _, state in jobs} == {"completed"}, context
    applied = dict(rows(queue_url, "select at, count(*) from periodic_ledger group by at"))
    assert applied == {format_firing(at): 1 for at in window}, context
    [(claimed,)] = rows(queue_url, "select count(*) from processed_jobs where kind = 'tick'")
    assert claimed == len(window), context
    assert kills + stops > 5, context


def test_a_python_and_a_rust_scheduler_on_one_schedule_enqueue_each_firing_once(
        worker_env, queue_url, tmp_path, cli):
    schedule = tmp_path / "schedules.toml"
    schedule.write_text(
        '[[schedule]]\nname = "mixed"\ncron = "* * * * * *"\nkind = "noop"\n'
        'payload = { id = "x" }\nfiring_field = "id"\nmissed = "all"\n')
    # Each logs the firings it enqueued itself: together, every firing once.
    rust_log, python_log = tmp_path / "rust.log", tmp_path / "python.log"
    with open(rust_log, "w") as rust_err, open(python_log, "w") as python_err:
        rust = subprocess.Popen(
            [CLI, "worker", "--schedule", str(schedule), "--database-url", queue_url],
            env=dict(os.environ, JOBGUARD_LOG="jobguard=debug"), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=rust_err)
        # Both start at once on a database without the schedules table: they create it
        # under one migration lock, and neither ends on the other's creating it.
        python = subprocess.Popen(
            [sys.executable, "-m", "jobguard", "worker", "periodic_app:mixed"],
            env=dict(worker_env, JOBGUARD_LOG="DEBUG"), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=python_err)
        try:
            time.sleep(8)
            assert rust.poll() is None and python.poll() is None
        finally:
            stop_all([rust, python])
    by_rust = re.sub(r"\x1b\[[0-9;]*m", "", rust_log.read_text()).count('outcome="enqueued"')
    by_python = python_log.read_text().count(" enqueued (job ")
    window = firing_times(queue_url, "mixed")
    assert len(window) >= 5
    jobs = rows(queue_url, "select job_key, payload from jobguard_jobs where kind = 'noop'")
    keys = [key for key, _ in jobs]
    assert sorted(keys) == sorted(firing_key("mixed", at) for at in window)
    assert {payload["id"] for _, payload in jobs} == {format_firing(at) for at in window}
    assert by_rust + by_python == len(window), (by_rust, by_python, len(window))
    listed = cli("schedules", url=queue_url).stdout
    assert "mixed" in listed, listed
