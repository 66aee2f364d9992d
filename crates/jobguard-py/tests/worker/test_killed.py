"""Several ``python -m jobguard worker`` processes on one queue, SIGKILLed and SIGSTOPped at
random while they run: every key is applied exactly once, and no job is lost or left waiting."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import psycopg
import pytest

import jobguard
from conftest import rows

JOBS = 300
WORKERS = 3
CHAOS_SECONDS = 12


@pytest.fixture(params=["asyncpg", "psycopg_async", "psycopg"])
def driver(request) -> str:
    """Both async pools and the sync psycopg pool (its jobs on threads): the kills cost ~15 s
    each, so not every driver."""
    return request.param


def start(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "jobguard", "worker", "ledger_app:app", "--concurrency", "4",
         "--lease", "1", "--poll-interval", "0.1", "--shutdown-timeout", "5"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def test_workers_killed_and_stopped_at_random_apply_every_key_once(worker_env, queue_url):
    seed = int(os.environ.get("JOBGUARD_TEST_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    with psycopg.connect(queue_url) as conn, conn.transaction():
        for i in range(JOBS):
            order = f"k-{i}"
            jobguard.enqueue_sync(conn, "credit", {"order": order, "amount": i},
                                  key=jobguard.key("credit", order))
    env = dict(worker_env, JOBGUARD_TEST_CREDIT_PAUSE="0.02")
    workers = [start(env) for _ in range(WORKERS)]
    kills = stops = 0
    try:
        deadline = time.monotonic() + CHAOS_SECONDS
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.3, 0.8))
            i = rng.randrange(WORKERS)
            if rng.random() < 0.6:
                workers[i].kill()
                workers[i].wait()
                workers[i] = start(env)
                kills += 1
            else:
                # Stopped past its lease: its waiting jobs are rescued and run by the others,
                # and it is fenced off from them when it resumes.
                workers[i].send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(0.5, 2.0))
                workers[i].send_signal(signal.SIGCONT)
                stops += 1
        finish = time.monotonic() + 60
        while time.monotonic() < finish:
            [(left,)] = rows(queue_url,
                             "select count(*) from jobguard_jobs where state <> 'completed'")
            if left == 0:
                break
            time.sleep(0.2)
    finally:
        for w in workers:
            w.send_signal(signal.SIGCONT)
            w.terminate()
        for w in workers:
            try:
                w.wait(timeout=15)
            except subprocess.TimeoutExpired:
                w.kill()
    context = f"seed {seed}, {kills} kills, {stops} stops"
    states = dict(rows(queue_url, "select state, count(*) from jobguard_jobs group by state"))
    assert states == {"completed": JOBS}, context
    applied = rows(queue_url, "select job_key, count(*) from worker_ledger group by job_key")
    assert len(applied) == JOBS, context
    assert {count for _, count in applied} == {1}, context
    [(guarded,)] = rows(queue_url, "select count(*) from processed_jobs where kind = 'credit'")
    assert guarded == JOBS, context
    assert kills + stops > 5, context
