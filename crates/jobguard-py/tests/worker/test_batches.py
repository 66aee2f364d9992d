"""Batches in the Python worker, on each PostgreSQL driver: a backlog runs in batches with every
key applied once, duplicates included; a failing job rolls its batch back and the others apply
one per transaction; a key reused with another payload is dead-lettered alone; a batch whose
leases were taken over is fenced off whole; and the grouping itself, over random fetches."""

from __future__ import annotations

import asyncio
import random

import pytest

import jobguard
from jobguard._batches import group
from jobguard._pools import open_database
from jobguard._queue_sql import worker_sql
from jobguard.worker import Worker
from conftest import rows
from ledger_app import DRIVERS, SQLITE_DRIVERS, make_app
from test_worker import enqueue, enqueue_job, enqueue_raw, ledger, producer

POSTGRES_DRIVERS = [d for d in DRIVERS if d not in SQLITE_DRIVERS]


@pytest.fixture(params=POSTGRES_DRIVERS)
def driver(request):
    return request.param


def credits(first: int, count: int) -> list[dict]:
    return [{"order": f"o-{i}", "amount": i} for i in range(first, first + count)]


async def test_a_backlog_runs_in_batches_and_applies_each_key_once(driver, queue_url):
    app, calls = make_app(driver, queue_url, batch=True)
    await enqueue(driver, queue_url, app.jobs["credit"], *credits(0, 10))
    first = await app.run_worker(concurrency=2, batch_size=4, until_idle=True,
                                 handle_signals=False)
    assert first.applied == 10
    # The same ten keys again (their first jobs completed, so the queue takes them), among
    # thirty new ones: the ten are duplicates inside batches, the thirty apply.
    await enqueue(driver, queue_url, app.jobs["credit"], *credits(0, 40))
    stats = await app.run_worker(concurrency=2, batch_size=8, until_idle=True,
                                 handle_signals=False)
    assert (stats.applied, stats.duplicates) == (30, 10)
    assert stats.failed == stats.dead == stats.fenced == 0
    assert stats.batches > 0 and stats.batches_rolled_back == 0
    assert ledger(queue_url) == {jobguard.key("credit", f"o-{i}"): 1 for i in range(40)}
    assert set(calls.values()) == {1}
    assert rows(queue_url, "select state, count(*) from jobguard_jobs group by state") == [
        ("completed", 50)]


async def test_a_failing_job_rolls_its_batch_back_and_the_others_apply_alone(driver, queue_url):
    retry = jobguard.Backoff(max_attempts=5, base=0.01, max_delay=0.02, jitter=0.0)
    app, calls = make_app(driver, queue_url, batch=True, retry=retry)
    async with producer(driver, queue_url) as conn:
        for payload in credits(0, 12):
            await enqueue_job(driver, conn, app.jobs["credit"], **payload)
            if payload["amount"] == 5:
                await enqueue_job(driver, conn, app.jobs["broken"], order="o-bad")
    totals = {"batches": 0, "rolled_back": 0, "applied": 0}
    for _ in range(50):
        stats = await app.run_worker(concurrency=1, batch_size=6, until_idle=True,
                                     handle_signals=False, poll_interval=0.01)
        totals["batches"] += stats.batches
        totals["rolled_back"] += stats.batches_rolled_back
        totals["applied"] += stats.applied
        if ("dead", 1) in rows(queue_url, "select state, count(*) from jobguard_jobs "
                                          "group by state"):
            break
        await asyncio.sleep(0.02)
    assert totals["rolled_back"] >= 1 and totals["applied"] == 12
    # Every credit's effect once, though those batched with the broken job ran twice.
    assert ledger(queue_url) == {jobguard.key("credit", f"o-{i}"): 1 for i in range(12)}
    assert calls["o-bad"] >= 3
    [(state, attempt)] = rows(queue_url, "select state, attempt from jobguard_jobs "
                                         "where kind = 'broken'")
    assert (state, attempt) == ("dead", 3)
    assert rows(queue_url, "select count(*) from jobguard_jobs where kind = 'credit' "
                           "and state = 'completed'") == [(12,)]


async def test_a_key_reused_with_another_payload_in_a_batch_is_dead_lettered_alone(
        driver, queue_url):
    app, calls = make_app(driver, queue_url, batch=True)
    await enqueue(driver, queue_url, app.jobs["credit"], {"order": "o-1", "amount": 1})
    await app.run_worker(until_idle=True, handle_signals=False)
    async with producer(driver, queue_url) as conn:
        # Another producer reuses the key for another amount, between new credits.
        await enqueue_raw(driver, conn, "credit", {"order": "o-1", "amount": 2},
                          jobguard.key("credit", "o-1"))
    await enqueue(driver, queue_url, app.jobs["credit"], *credits(2, 9))
    stats = await app.run_worker(concurrency=1, batch_size=5, until_idle=True,
                                 handle_signals=False)
    assert (stats.applied, stats.dead) == (9, 1) and stats.batches_rolled_back >= 1
    assert ledger(queue_url) == {jobguard.key("credit", f"o-{i}"): 1 for i in [1, *range(2, 11)]}
    [(error,)] = rows(queue_url, "select last_error from jobguard_jobs where state = 'dead'")
    assert "credit:o-1" in error
    assert calls["o-1"] == 1


async def test_a_batch_whose_leases_were_taken_over_is_fenced_off(driver, queue_url):
    app, calls = make_app(driver, queue_url, batch=True)
    await enqueue(driver, queue_url, app.jobs["credit"], *credits(0, 4))
    stale, fresh = Worker(app, lease=0.2, batch_size=4), Worker(app, lease=30, batch_size=4)
    for w in (stale, fresh):
        w._db = await open_database(app.db)
        w._sql = worker_sql(w._db.dialect, app.table, app.guard_table)
    try:
        taken = await stale._fetch(4)
        await asyncio.sleep(0.3)  # the leases expire while the stale worker stalls
        async with fresh._db.session() as s:
            assert await s.execute(fresh._sql["rescue"], [10, "[]", fresh._kinds_param()]) == 4
        again = await fresh._fetch(4)
        assert sorted(j.id for j in again) == sorted(j.id for j in taken)
        # Woken up, the stale worker's batch completes and claims nothing, calls no body.
        assert await stale._run_batch(taken) == ["fenced"] * 4
        assert calls == {} and ledger(queue_url) == {}
        assert await fresh._run_batch(again) == ["applied"] * 4
    finally:
        for w in (stale, fresh):
            await w._db.close()
    assert ledger(queue_url) == {jobguard.key("credit", f"o-{i}"): 1 for i in range(4)}


async def test_slow_batches_past_their_lease_beside_a_second_worker_apply_each_key_once(
        driver, queue_url, monkeypatch):
    """Batches of slow jobs that run past their lease, one failing, while a second worker
    fetches and rescues on the same queue: a batch's rows stay locked while it runs, so no
    rescue takes them from under it; a batch rolled back late has its jobs' leases expired,
    and whichever worker holds them afterwards runs each once."""
    monkeypatch.setenv("JOBGUARD_TEST_SLOW", "0.12")
    retry = jobguard.Backoff(max_attempts=5, base=0.01, max_delay=0.02, jitter=0.0)
    app, calls = make_app(driver, queue_url, batch=True, retry=retry)
    async with producer(driver, queue_url) as conn:
        for i in range(16):
            await enqueue_job(driver, conn, app.jobs["slow"], order=f"s-{i}")
            if i == 6:
                await enqueue_job(driver, conn, app.jobs["broken"], order="s-bad")
    totals = {"batches": 0, "rolled_back": 0, "applied": 0, "fenced": 0}
    for _ in range(40):
        # A batch of four runs about 0.5 s, past its 0.3 s lease.
        workers = [Worker(app, lease=0.3, batch_size=4, concurrency=2, until_idle=True,
                          handle_signals=False, poll_interval=0.02) for _ in range(2)]
        for stats in await asyncio.gather(*(w.run() for w in workers)):
            totals["batches"] += stats.batches
            totals["rolled_back"] += stats.batches_rolled_back
            totals["applied"] += stats.applied
            totals["fenced"] += stats.fenced
        if rows(queue_url, "select count(*) from jobguard_jobs where state not in "
                           "('completed', 'dead')") == [(0,)]:
            break
    assert totals["batches"] >= 1 and totals["rolled_back"] >= 1
    assert ledger(queue_url) == {jobguard.key("slow", f"s-{i}"): 1 for i in range(16)}
    assert totals["applied"] == 16
    assert rows(queue_url, "select kind, state, count(*) from jobguard_jobs "
                           "group by kind, state order by kind") == [
        ("broken", "dead", 1), ("slow", "completed", 16)]


@pytest.mark.parametrize("driver", ["sqlite3"])
async def test_batches_are_refused_on_sqlite_and_bad_sizes_everywhere(driver, queue_url):
    app, _ = make_app(driver, queue_url, batch=True)
    with pytest.raises(jobguard.UnsupportedConnection, match="PostgreSQL"):
        await app.run_worker(batch_size=4, until_idle=True, handle_signals=False)
    for size in (0, -1, 2.5):
        with pytest.raises(ValueError, match="batch_size"):
            Worker(app, batch_size=size)
    with pytest.raises(TypeError, match="batch"):
        app.job("other", batch="yes")


def test_grouping_keeps_every_job_once_in_fetch_order_and_batches_only_a_backlog():
    rng = random.Random(7)
    for _ in range(2000):
        jobs = [(i, rng.random() < 0.7) for i in range(rng.randrange(0, 40))]
        free, size = rng.randrange(1, 8), rng.randrange(1, 10)
        groups = group(jobs, free, size, lambda job: job[1])
        assert sorted(job for g in groups for job in g) == jobs
        assert all(g == sorted(g) for g in groups)
        if size == 1 or len(jobs) <= free:
            assert all(len(g) == 1 for g in groups)
            continue
        batched = [g for g in groups if g[0][1]]
        assert all(len(g) == 1 for g in groups if not g[0][1])
        assert all(all(job[1] for job in g) and len(g) <= size for g in batched)
        # Full batches but the last one.
        assert all(len(g) == size for g in batched[:-1])
