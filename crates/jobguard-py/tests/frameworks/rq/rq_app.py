"""The RQ jobs the kill tests run on ``rq worker -w jobguard.rq.GuardedWorker``: one guarded
credit job.

Configured from the environment: DATABASE_URL, JOBGUARD_TEST_KILL_WORKER (kill the worker with
its work horse).

``credit`` retries a transient failure after about 0.2 s, 0.4 s, ... (at most 1 s), up to 10
times: the retry tests stay short. Its ``job_timeout`` is the enqueuer's.
"""

from __future__ import annotations

import os

import psycopg

import jobguard
import jobguard.rq

import kills

URL = os.environ["DATABASE_URL"]
WORKER = os.environ.get("JOBGUARD_TEST_KILL_WORKER") == "1"


def connect() -> psycopg.Connection:
    return psycopg.connect(URL)


def effect(conn: psycopg.Connection, key: str) -> None:
    conn.execute("insert into ledger (job_key, pid) values (%s, %s)", (key, os.getpid()))
    kills.misbehave(conn, key)
    kills.record(conn, key, "applied")
    kills.die_here("before-commit", key, parent=WORKER)


def duplicate(outcome: jobguard.Duplicate, order: str) -> None:
    kills.record_duplicate(URL, jobguard.key("credit", order))


@jobguard.rq.guarded(
    key=lambda order: jobguard.key("credit", order),
    db=connect,
    on_duplicate=duplicate,
    max_retries=10,
    retry_backoff=0.2,
    retry_backoff_max=1.0,
)
def guarded_credit(conn: psycopg.Connection, order: str) -> dict:
    effect(conn, jobguard.key("credit", order))
    return {"credited": order}


def naive_credit(order: str) -> dict:
    with connect() as conn:
        effect(conn, jobguard.key("credit", order))
    return {"credited": order}


def credit(order: str) -> dict:
    out = (naive_credit if kills.unguarded() else guarded_credit)(order)
    # Committed; RQ has not marked the job finished yet.
    kills.die_here("after-commit", jobguard.key("credit", order), parent=WORKER)
    return out


# The job RQ runs is `credit`, around the guarded function: GuardedWorker reads the guard's
# retry policy from it.
credit.jobguard_rq = guarded_credit.jobguard_rq  # type: ignore[attr-defined]
