"""``python -m jobguard worker`` processes while their PostgreSQL crashes and restarts in
immediate mode (every connection cut, no checkpoint): every key is applied exactly once, none
lost or left waiting. The server is a throwaway cluster of the test's own (``cluster.py``); the
shared one is never restarted."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

import jobguard
from chaos import Fleet, python_worker, wait_until_settled
from cluster import Cluster, bin_dir
from conftest import rows
from ledger_app import LEDGER

JOBS = 1000


@pytest.fixture(params=["asyncpg", "psycopg_async"])
def driver(request: pytest.FixtureRequest) -> str:
    """Both async pools: a restart drops every connection of the pool at once."""
    return str(request.param)
WORKERS = 3
# Jobs completed before the restart: the restart lands while the workers are busy.
RESTART_AFTER = 30


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    bin = bin_dir()
    if bin is None:
        message = ("PostgreSQL's initdb and pg_ctl were not found (on PATH or in "
                   "/usr/lib/postgresql/*/bin): install the postgresql package")
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    cluster = Cluster(bin)
    try:
        yield cluster
    finally:
        cluster.delete()


def completed(url: str) -> int:
    [(n,)] = rows(url, "select count(*) from jobguard_jobs where state = 'completed'")
    return n


def test_an_immediate_restart_of_postgres_loses_no_job_and_applies_none_twice(
        cluster, cli, driver):
    url = cluster.url
    cli("worker", "--until-idle", url=url)  # the queue's and the guard's tables
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(LEDGER)
    with psycopg.connect(url) as conn, conn.transaction():
        for i in range(JOBS):
            order = f"k-{i}"
            jobguard.enqueue_sync(conn, "credit", {"order": order, "amount": i},
                                  key=jobguard.key("credit", order))
    env = dict(os.environ, DATABASE_URL=url, JOBGUARD_TEST_DRIVER=driver,
               JOBGUARD_TEST_CREDIT_PAUSE="0.05")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                      env.get("PYTHONPATH")]))
    with Fleet([python_worker(env)] * WORKERS):
        while (before := completed(url)) < RESTART_AFTER:
            time.sleep(0.05)
        cluster.restart_immediate()
        wait_until_settled(url, seconds=120)

    context = f"{before} jobs completed before the restart"
    assert before < JOBS, context
    states = dict(rows(url, "select state, count(*) from jobguard_jobs group by state"))
    assert states == {"completed": JOBS}, context
    applied = rows(url, "select job_key, count(*) from worker_ledger group by job_key")
    assert len(applied) == JOBS, context
    assert {count for _, count in applied} == {1}, context
    [(guarded,)] = rows(url, "select count(*) from processed_jobs where kind = 'credit'")
    assert guarded == JOBS, context
