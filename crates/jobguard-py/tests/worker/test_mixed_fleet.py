"""One queue, two languages: Rust ``jobguard worker`` processes running the built-in ``credit``
and ``python -m jobguard worker`` processes running ``deposit`` on one jobs table, SIGKILLed
and SIGSTOPped at random. Each worker fetches only its own kinds, so every key of each kind is
applied exactly once by a worker of its language, none is lost, dead-lettered or left waiting,
and the Rust CLI shows the Python jobs as it shows its own."""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

import psycopg
import pytest

import jobguard
from chaos import Fleet, Start, python_worker, seed, wait_until_settled
from conftest import rows
from test_cross_language import CLI

JOBS = 150  # of each kind
# The Python workers of the fleet, one per async pool (fleet_app's job is `async def`).
FLEET_DRIVERS = ["asyncpg", "psycopg_async"]


@pytest.fixture
def driver() -> str:
    """The driver of the queue's fixtures (the fleet's workers name their own)."""
    return "asyncpg"
CHAOS_SECONDS = 12


def rust_worker(url: str) -> Start:
    """Starts ``jobguard worker`` with short leases, as ``python_worker`` does."""
    return lambda: subprocess.Popen(
        [CLI, "worker", "--database-url", url, "--concurrency", "4", "--lease", "1s",
         "--poll", "100ms", "--shutdown-timeout", "5s", "--prune-schedule", "off"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def enqueue(url: str) -> None:
    """``JOBS`` Rust credits (each holding its transaction 20 ms after its insert, so that
    kills land before commits too) and as many Python deposits, interleaved, from Python."""
    with psycopg.connect(url) as conn, conn.transaction():
        for i in range(JOBS):
            order = f"k-{i}"
            jobguard.enqueue_sync(conn, "credit",
                                  {"order": order, "account": 7, "amount": i + 1, "hold_ms": 20},
                                  key=jobguard.key("credit", order))
            jobguard.enqueue_sync(conn, "deposit", {"order": order, "amount": i + 1},
                                  key=jobguard.key("deposit", order))


def listed(cli: Any, url: str, kind: str) -> dict[str, Any]:
    out = cli("jobs", "--kind", kind, "--limit", str(2 * JOBS), "--json", url=url)
    return json.loads(out.stdout)


# One run covers the drivers: each Python worker has its own.
def test_rust_and_python_workers_killed_at_random_each_apply_their_kinds_once(
        worker_env, queue_url, cli):
    run_seed = seed()
    rng = random.Random(run_seed)
    enqueue(queue_url)
    envs = [dict(worker_env, JOBGUARD_TEST_CREDIT_PAUSE="0.02", JOBGUARD_TEST_DRIVER=driver)
            for driver in FLEET_DRIVERS]
    starts = [rust_worker(queue_url), rust_worker(queue_url)]
    starts += [python_worker(env, "fleet_app:app") for env in envs]
    with Fleet(starts) as fleet:
        fleet.chaos(rng, CHAOS_SECONDS)
        wait_until_settled(queue_url)
    context = f"seed {run_seed}, {fleet.kills} kills, {fleet.stops} stops"

    states = rows(queue_url, "select kind, state, count(*) from jobguard_jobs group by 1, 2")
    assert sorted(states) == [("credit", "completed", JOBS), ("deposit", "completed", JOBS)], \
        context
    for ledger, kind in [("jobguard_ledger", "credit"), ("worker_ledger", "deposit")]:
        applied = rows(queue_url, f"select job_key, count(*) from {ledger} group by job_key")
        assert sorted(key for key, _ in applied) == sorted(
            jobguard.key(kind, f"k-{i}") for i in range(JOBS)), context
        assert {count for _, count in applied} == {1}, context
    guarded = rows(queue_url, "select kind, count(*) from processed_jobs group by kind")
    assert sorted(guarded) == [("credit", JOBS), ("deposit", JOBS)], context
    assert fleet.kills + fleet.stops > 5, context

    # The CLI lists the Python jobs as it lists its own: the same fields, the same states.
    rust, python = listed(cli, queue_url, "credit"), listed(cli, queue_url, "deposit")
    assert python["counts"] == {"available": 0, "running": 0, "completed": 2 * JOBS, "dead": 0}
    assert len(python["jobs"]) == len(rust["jobs"]) == JOBS
    for jobs in (rust["jobs"], python["jobs"]):
        assert {job["state"] for job in jobs} == {"completed"}
        assert {(job["queue"], job["unique_states"]) for job in jobs} == {
            ("default", "available,running")}
    assert [sorted(job) for job in python["jobs"]] == [sorted(job) for job in rust["jobs"]]
    shown = json.loads(cli("key", jobguard.key("deposit", "k-0"), "--json",
                           url=queue_url).stdout)
    assert shown["guard"]["kind"] == "deposit", shown


def test_jobguard_worker_leaves_python_kinds_waiting_unless_told_to_dead_letter_them(
        queue_url, cli):
    with psycopg.connect(queue_url) as conn, conn.transaction():
        jobguard.enqueue_sync(conn, "deposit", {"order": "k-1", "amount": 1},
                              key=jobguard.key("deposit", "k-1"))
    started = cli("worker", "--until-idle", url=queue_url)
    assert "other kinds left waiting" in started.stderr, started.stderr
    waiting = "select state, attempt from jobguard_jobs where kind = 'deposit'"
    assert rows(queue_url, waiting) == [("available", 0)]

    cli("worker", "--until-idle", "--dead-letter-unknown-kinds", url=queue_url)
    [(state, error)] = rows(queue_url,
                            "select state, last_error from jobguard_jobs where kind = 'deposit'")
    assert state == "dead"
    assert "unknown job kind `deposit`" in error, error
