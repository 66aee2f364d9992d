"""Unique-job policies on Python enqueue (``jobguard.Unique``): each policy as
docs/unique-jobs.md describes it, on PostgreSQL and SQLite, with the Rust queue's statements
and rules; concurrent enqueues of one key from two connections make one job; and a key a
Python enqueue holds is held for a Rust enqueue (the ``jobguard enqueue`` CLI), and the
reverse."""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import sqlite3
import threading
from typing import Any

import asyncpg
import psycopg
import pytest

import jobguard
from jobguard._drivers import convert
from jobguard._queue_sql import worker_sql
from test_cross_language import cli  # noqa: F401  (the fixture)

LIVE_AND_DONE = "available,running,completed"
EVERY_STATE = "available,running,completed,dead"


class Db:
    """One sync connection of a backend, running each call in its own transaction."""

    def __init__(self, backend: str, target: str) -> None:
        self.backend = backend
        if backend == "postgres":
            self.conn: Any = psycopg.connect(target, autocommit=True)
        else:
            self.conn = sqlite3.connect(target, isolation_level=None, timeout=60,
                                        check_same_thread=False)

    def enqueue(self, kind: str, payload: Any, key: str | None = None, **options: Any) -> Any:
        if self.backend == "postgres":
            with self.conn.transaction():
                return jobguard.enqueue_sync(self.conn, kind, payload, key, **options)
        self.conn.execute("begin immediate")
        try:
            done = jobguard.enqueue_sync(self.conn, kind, payload, key, **options)
        except BaseException:
            self.conn.execute("rollback")
            raise
        self.conn.execute("commit")
        return done

    def rows(self, sql: str, params: list[Any] = ()) -> list[tuple]:
        if self.backend == "sqlite":
            sql = sql.replace("%s", "?")
        return [tuple(r) for r in self.conn.execute(sql, list(params)).fetchall()]

    def lease(self, kind: str) -> list[tuple]:
        """Leases the waiting jobs of ``kind`` with the Rust worker's own fetch, as a worker
        that holds them."""
        fetch = worker_sql(self.backend, "jobguard_jobs", "processed_jobs")["fetch"]
        kinds: Any = json.dumps([kind]) if self.backend == "sqlite" else [kind]
        params = ["default", 10, 3_600_000_000, kinds]
        if self.backend == "postgres":
            text, args = convert(fetch, params, "pyformat")
            with self.conn.transaction():
                return self.conn.execute(text, args).fetchall()
        text, args = convert(fetch, params, "qmark")
        self.conn.execute("begin immediate")
        leased = self.conn.execute(text, args).fetchall()
        self.conn.execute("commit")
        return leased

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(params=["postgres", "sqlite"])
def backend(request: Any) -> str:
    return request.param


@pytest.fixture
def url(backend: str, request: Any) -> str:
    if backend == "postgres":
        return request.getfixturevalue("pg_url")
    return "sqlite:" + request.getfixturevalue("sqlite_path")


@pytest.fixture
def db(backend: str, url: str, cli: Any) -> Any:  # noqa: F811
    cli("worker", "--until-idle", url=url)  # the Rust side migrates the queue's tables
    opened = Db(backend, url if backend == "postgres" else url.removeprefix("sqlite:"))
    yield opened
    opened.close()


def noop(name: str) -> tuple[str, dict, str]:
    return "noop", {"id": name}, jobguard.key("noop", name)


def test_return_is_the_default_and_another_payload_is_a_reused_key(db):
    kind, payload, key = noop("a")
    policy = jobguard.Unique()
    first = db.enqueue(kind, payload, key, unique=policy)
    again = db.enqueue(kind, payload, key, unique=policy)
    assert first.inserted and not again.inserted
    assert again.id == first.id and again.existing_state == "available"
    with pytest.raises(jobguard.KeyReused):
        db.enqueue(kind, {"id": "a", "extra": 1}, key, unique=policy)
    assert db.rows("select count(*) from jobguard_jobs") == [(1,)]


def test_completed_and_dead_keep_the_key_when_the_policy_says(db, url, cli):  # noqa: F811
    done_kind, done_payload, done_key = noop("done")
    fail_payload = {"id": "x", "fatal": True}
    fail_key = jobguard.key("fail", "x")
    keep_done = jobguard.Unique(states=LIVE_AND_DONE)
    keep_all = jobguard.Unique(states=("available", "running", "completed", "dead"))
    first = db.enqueue(done_kind, done_payload, done_key, unique=keep_done)
    failed = db.enqueue("fail", fail_payload, fail_key, unique=keep_all)
    cli("worker", "--until-idle", url=url)  # the Rust worker completes one, kills the other
    assert db.rows("select id, state from jobguard_jobs order by id") == [
        (first.id, "completed"), (failed.id, "dead")]

    again = db.enqueue(done_kind, done_payload, done_key, unique=keep_done)
    assert (again.id, again.inserted, again.existing_state) == (first.id, False, "completed")
    dead = db.enqueue("fail", fail_payload, fail_key, unique=keep_all)
    assert (dead.id, dead.inserted, dead.existing_state) == (failed.id, False, "dead")
    # Completed does not keep the key of a policy that names only the live states, nor an
    # enqueue without a policy: each is new work.
    live_only = db.enqueue(done_kind, done_payload, done_key, unique=jobguard.Unique())
    assert live_only.inserted and live_only.id != first.id


def test_the_period_and_the_queue_are_appended_to_the_key(db):
    kind, payload, key = noop("fee")
    today = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    daily = db.enqueue(kind, payload, key, unique=jobguard.Unique(
        period=_dt.timedelta(days=1), by_queue=True))
    stored = db.rows("select job_key from jobguard_jobs where id = %s", [daily.id])
    assert stored == [(f"{key}:default:{today}",)]
    hourly = db.enqueue(kind, payload, key, unique=jobguard.Unique(period=3600))
    (hour_key,) = db.rows("select job_key from jobguard_jobs where id = %s", [hourly.id])[0]
    assert hour_key.startswith(f"{key}:{today}T") and len(hour_key) == len(f"{key}:{today}T10")


def test_reject_refuses_naming_the_job_that_holds_the_key(db):
    kind, payload, key = noop("r")
    policy = jobguard.Unique(states=LIVE_AND_DONE, on_conflict="reject")
    first = db.enqueue(kind, payload, key, unique=policy)
    with pytest.raises(jobguard.EnqueueRejected) as rejected:
        db.enqueue(kind, payload, key, unique=policy)
    assert rejected.value.existing_id == first.id and rejected.value.state == "available"
    assert f"taken by job {first.id} (available): nothing was enqueued" in str(rejected.value)
    assert db.rows("select count(*) from jobguard_jobs") == [(1,)]


def test_replace_rewrites_a_waiting_job_and_leaves_a_held_one(db):
    kind, _, key = noop("p")
    replace = jobguard.Unique(on_conflict="replace")
    first = db.enqueue(kind, {"id": "p", "v": 1}, key, unique=replace)
    second = db.enqueue(kind, {"id": "p", "v": 2}, key, unique=replace)
    assert (second.id, second.inserted, second.replaced) == (first.id, False, True)
    (payload, replaced), = db.rows("select payload, replaced from jobguard_jobs where id = %s",
                                   [first.id])
    payload = json.loads(payload) if isinstance(payload, str) else payload
    assert payload == {"id": "p", "v": 2} and replaced == 1

    assert [int(r[0]) for r in db.lease(kind)] == [first.id]  # a worker holds it now
    kept = db.enqueue(kind, {"id": "p", "v": 3}, key, unique=replace)
    assert (kept.id, kept.replaced, kept.existing_state) == (first.id, False, "running")
    with pytest.raises(jobguard.ReplaceRejected) as refused:
        db.enqueue(kind, {"id": "p", "v": 3}, key,
                   unique=jobguard.Unique(on_conflict="replace-or-reject"))
    assert refused.value.existing_id == first.id and refused.value.state == "running"
    with pytest.raises(jobguard.KeyReused):
        db.enqueue("other", {"id": "p"}, key, unique=replace)


def test_bad_policies_are_typed_errors_with_the_core_message():
    with pytest.raises(jobguard.InvalidUnique, match="missing: running"):
        jobguard.Unique(states="available,completed")
    with pytest.raises(jobguard.InvalidUnique, match="unknown job state `done`"):
        jobguard.Unique(states="available,running,done")
    with pytest.raises(jobguard.InvalidUnique, match="whole number of seconds"):
        jobguard.Unique(period=1.5)
    with pytest.raises(jobguard.InvalidUnique, match="whole number of seconds"):
        jobguard.Unique(period=0)
    with pytest.raises(jobguard.InvalidUnique, match="replace-or-reject"):
        jobguard.Unique(on_conflict="keep")
    app = jobguard.App(db=lambda: None)
    with pytest.raises(TypeError, match="jobguard.Unique"):
        app.job("fee", unique="reject")  # type: ignore[arg-type]
    assert jobguard.Unique(states=" running, available ,completed").states == LIVE_AND_DONE


def test_the_job_policy_and_a_per_call_override(db):
    app = jobguard.App(db=lambda: None)

    @app.job("noop", key=lambda id: jobguard.key("noop", id),
             unique=jobguard.Unique(states=LIVE_AND_DONE, on_conflict="reject"))
    def job(conn, id):  # noqa: A002 - the built-in noop's payload
        pass

    def enqueue(**options: Any) -> Any:
        if db.backend == "postgres":
            with db.conn.transaction():
                return job.enqueue_sync(db.conn, id="j", **options)
        db.conn.execute("begin immediate")
        try:
            return job.enqueue_sync(db.conn, id="j", **options)
        finally:
            db.conn.execute("commit")

    first = enqueue()
    with pytest.raises(jobguard.EnqueueRejected):
        enqueue()
    returned = enqueue(unique=jobguard.Unique(states=LIVE_AND_DONE))
    assert (returned.id, returned.inserted) == (first.id, False)
    mask = db.rows("select unique_states from jobguard_jobs where id = %s", [first.id])
    assert mask == [(1,)]


def _race(db: Db, url: str, key: str, policy: jobguard.Unique) -> list[Any]:
    """Two connections enqueue ``key`` at once, each in its own transaction, released by a
    barrier; what each got (an Enqueued or the error)."""
    target = url if db.backend == "postgres" else url.removeprefix("sqlite:")
    barrier = threading.Barrier(2)
    results: list[Any] = [None, None]

    def one(i: int) -> None:
        other = Db(db.backend, target)
        try:
            barrier.wait()
            results[i] = other.enqueue("noop", {"id": key}, jobguard.key("noop", key),
                                       unique=policy)
        except Exception as error:  # noqa: BLE001 - the test looks at it
            results[i] = error
        finally:
            other.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_concurrent_enqueues_of_one_key_from_two_connections_make_one_job(db, url):
    for n in range(10):
        key = f"race-{n}"
        got = _race(db, url, key, jobguard.Unique(states=LIVE_AND_DONE))
        assert all(isinstance(r, jobguard.Enqueued) for r in got), got
        assert sorted(r.inserted for r in got) == [False, True]
        assert got[0].id == got[1].id
        rejected = _race(db, url, key + "-r",
                         jobguard.Unique(states=LIVE_AND_DONE, on_conflict="reject"))
        inserted = [r for r in rejected if isinstance(r, jobguard.Enqueued)]
        refused = [r for r in rejected if isinstance(r, jobguard.EnqueueRejected)]
        assert len(inserted) == 1 and len(refused) == 1, rejected
        assert refused[0].existing_id == inserted[0].id
    counts = db.rows("select job_key, count(*) from jobguard_jobs group by job_key")
    assert len(counts) == 20 and {c for _, c in counts} == {1}


async def test_a_concurrent_enqueue_waits_for_the_first_transaction(pg_url, cli):  # noqa: F811
    cli("worker", "--until-idle", url=pg_url)
    first, second = await asyncpg.connect(pg_url), await asyncpg.connect(pg_url)
    policy = jobguard.Unique(states=EVERY_STATE)
    kind, payload, key = noop("w")
    try:
        tx = first.transaction()
        await tx.start()
        held = await jobguard.enqueue(first, kind, payload, key, unique=policy)
        async def later() -> Any:
            async with second.transaction():
                return await jobguard.enqueue(second, kind, payload, key, unique=policy)

        waiting = asyncio.ensure_future(later())
        await asyncio.sleep(0.2)  # let it reach the insert, which waits for the first commit
        await tx.commit()
        found = await waiting
        assert held.inserted and (found.id, found.inserted) == (held.id, False)
    finally:
        await first.close()
        await second.close()


def test_a_key_python_holds_is_held_for_a_rust_enqueue_and_back(db, url, cli):  # noqa: F811
    kind, payload, key = noop("x")
    policy = jobguard.Unique(states=LIVE_AND_DONE, period=86_400, on_conflict="reject")
    from_python = db.enqueue(kind, payload, key, unique=policy)
    rust = cli("enqueue", kind, "--payload", json.dumps(payload), "--unique-states",
               LIVE_AND_DONE, "--unique-period", "1d", "--on-conflict", "reject", "--json",
               url=url, check=False)
    assert rust.returncode == 1, rust.stderr
    report = json.loads(rust.stdout)
    assert report["rejected"] and report["existing_id"] == from_python.id
    cli("worker", "--until-idle", url=url)  # completed: the policy keeps the key still

    kind, payload, key = noop("y")
    rust = cli("enqueue", kind, "--payload", json.dumps(payload), "--unique-states",
               LIVE_AND_DONE, "--on-conflict", "reject", "--json", url=url)
    rust_id = json.loads(rust.stdout)["id"]
    cli("worker", "--until-idle", url=url)
    with pytest.raises(jobguard.EnqueueRejected) as rejected:
        db.enqueue(kind, payload, key,
                   unique=jobguard.Unique(states=LIVE_AND_DONE, on_conflict="reject"))
    assert (rejected.value.existing_id, rejected.value.state) == (rust_id, "completed")
    again = db.enqueue("noop", {"id": "x"}, jobguard.key("noop", "x"), unique=jobguard.Unique(
        states=LIVE_AND_DONE, period=86_400))
    assert (again.id, again.existing_state) == (from_python.id, "completed")
