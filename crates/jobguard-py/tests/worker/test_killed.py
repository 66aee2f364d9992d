"""Several ``python -m jobguard worker`` processes on one queue, SIGKILLed and SIGSTOPped at
random while they run: every key is applied exactly once, and no job is lost or left waiting."""

from __future__ import annotations

import os
import random
import time

import psycopg

import jobguard
from chaos import start_worker, stop_all, unleash
from conftest import rows

JOBS = 300
WORKERS = 3
CHAOS_SECONDS = 12


def test_workers_killed_and_stopped_at_random_apply_every_key_once(worker_env, queue_url):
    seed = int(os.environ.get("JOBGUARD_TEST_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    with psycopg.connect(queue_url) as conn, conn.transaction():
        for i in range(JOBS):
            order = f"k-{i}"
            jobguard.enqueue_sync(conn, "credit", {"order": order, "amount": i},
                                  key=jobguard.key("credit", order))
    env = dict(worker_env, JOBGUARD_TEST_CREDIT_PAUSE="0.02")
    workers = [start_worker(env) for _ in range(WORKERS)]
    try:
        kills, stops = unleash(workers, lambda: start_worker(env), CHAOS_SECONDS, rng)
        finish = time.monotonic() + 60
        while time.monotonic() < finish:
            [(left,)] = rows(queue_url,
                             "select count(*) from jobguard_jobs where state <> 'completed'")
            if left == 0:
                break
            time.sleep(0.2)
    finally:
        stop_all(workers)
    context = f"seed {seed}, {kills} kills, {stops} stops"
    states = dict(rows(queue_url, "select state, count(*) from jobguard_jobs group by state"))
    assert states == {"completed": JOBS}, context
    applied = rows(queue_url, "select job_key, count(*) from worker_ledger group by job_key")
    assert len(applied) == JOBS, context
    assert {count for _, count in applied} == {1}, context
    [(guarded,)] = rows(queue_url, "select count(*) from processed_jobs where kind = 'credit'")
    assert guarded == JOBS, context
    assert kills + stops > 5, context
