"""Several ``python -m jobguard worker`` processes on one queue, SIGKILLed and SIGSTOPped at
random while they run, one job per transaction and in batches: every key is applied exactly
once, and no job is lost or left waiting."""

from __future__ import annotations

import random

import psycopg
import pytest

import jobguard
from chaos import Fleet, python_worker, seed, wait_until_settled
from conftest import rows

JOBS = 300
WORKERS = 3
CHAOS_SECONDS = 12


@pytest.fixture(params=["asyncpg", "psycopg_async", "psycopg"])
def driver(request: pytest.FixtureRequest) -> str:
    """Both async pools and the sync psycopg pool (its jobs on threads): the kills cost ~15 s
    each, so not every driver."""
    return str(request.param)


def test_workers_killed_and_stopped_at_random_apply_every_key_once(worker_env, queue_url):
    run_chaos(worker_env, queue_url, ())


@pytest.mark.parametrize("driver", ["asyncpg"])
def test_workers_running_batches_killed_and_stopped_at_random_apply_every_key_once(
        worker_env, queue_url):
    # A backlog of credits run in batches of up to 8, a tenth of them failing once after their
    # insert: their batch rolls back, and its jobs run again one per transaction.
    env = dict(worker_env, JOBGUARD_TEST_BATCH="1", JOBGUARD_TEST_FAIL_ONCE_MOD="10")
    run_chaos(env, queue_url, ("--batch-size", "8"))
    # Jobs a batch completed share its transaction's `now()`: batches did run.
    [(batched,)] = rows(queue_url, "select count(*) from (select finished_at from jobguard_jobs "
                                   "group by finished_at having count(*) > 1) b")
    assert batched > 0


def run_chaos(worker_env: dict[str, str], queue_url: str, extra: tuple[str, ...]) -> None:
    run_seed = seed()
    rng = random.Random(run_seed)
    with psycopg.connect(queue_url) as conn, conn.transaction():
        for i in range(JOBS):
            order = f"k-{i}"
            jobguard.enqueue_sync(conn, "credit", {"order": order, "amount": i},
                                  key=jobguard.key("credit", order))
    env = dict(worker_env, JOBGUARD_TEST_CREDIT_PAUSE="0.02")
    with Fleet([python_worker(env, extra=extra)] * WORKERS) as fleet:
        fleet.chaos(rng, CHAOS_SECONDS)
        wait_until_settled(queue_url)
    context = f"seed {run_seed}, {fleet.kills} kills, {fleet.stops} stops"
    states = dict(rows(queue_url, "select state, count(*) from jobguard_jobs group by state"))
    assert states == {"completed": JOBS}, context
    applied = rows(queue_url, "select job_key, count(*) from worker_ledger group by job_key")
    assert len(applied) == JOBS, context
    assert {count for _, count in applied} == {1}, context
    [(guarded,)] = rows(queue_url, "select count(*) from processed_jobs where kind = 'credit'")
    assert guarded == JOBS, context
    assert fleet.kills + fleet.stops > 5, context
