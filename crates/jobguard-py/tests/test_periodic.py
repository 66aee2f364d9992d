"""Periodic schedules in Python (``@app.periodic``, ``jobguard.Scheduler``), each round run at a
time the test gives: downtime under ``skip``, ``latest`` and ``all`` on PostgreSQL and SQLite, a
restarted scheduler and two at once enqueueing each firing once, firings around a DST change as
croner gives them, and bad input refused with the schedule named."""

from __future__ import annotations

import asyncio
import datetime as _dt
from typing import Any

import aiosqlite
import asyncpg
import pytest

import jobguard
from jobguard import _native
from jobguard._periodic import on_connection
from test_cross_language import cli  # noqa: F401  (the fixture)

MINUTE = 60
# A minute boundary: 2026-12-06T03:00:00Z.
T0 = 1_796_526_000


@pytest.fixture(params=["postgres", "sqlite"])
def backend(request: Any) -> str:
    return request.param


@pytest.fixture
def url(backend: str, request: Any) -> str:
    if backend == "postgres":
        return request.getfixturevalue("pg_url")
    return "sqlite:" + request.getfixturevalue("sqlite_path")


@pytest.fixture
async def connect(url: str, backend: str, cli: Any) -> Any:  # noqa: F811
    """``await connect()``: one more connection of the backend, on a database whose queue's
    tables the Rust worker made."""
    cli("worker", "--until-idle", url=url)
    opened: list[Any] = []

    async def open_one() -> Any:
        if backend == "postgres":
            conn = await asyncpg.connect(url)
        else:
            conn = await aiosqlite.connect(url.removeprefix("sqlite:"), isolation_level=None,
                                           timeout=60)
        opened.append(conn)
        return conn

    yield open_one
    for conn in opened:
        await conn.close()


def schedules() -> list[jobguard.Periodic]:
    return [
        jobguard.Periodic(f"every-minute-{missed}", "* * * * *", "noop", {"id": "x"},
                          missed=missed, firing_field="id")
        for missed in ("skip", "latest", "all", "all:3")
    ]


async def jobs(conn: Any, backend: str) -> dict[str, list[str]]:
    """Per schedule, the firing times of its jobs in the queue."""
    sql = "select job_key from jobguard_jobs where kind = 'noop' order by job_key"
    if backend == "postgres":
        keys = [r[0] for r in await conn.fetch(sql)]
    else:
        keys = [r[0] for r in await (await conn.execute(sql)).fetchall()]
    out: dict[str, list[str]] = {}
    for key in keys:
        _, parts = jobguard.parse_key(key)
        out.setdefault(parts[0], []).append(":".join(parts[1:]))
    return out


def at(n: int) -> str:
    return _native.format_firing(T0 + n * MINUTE)


async def test_downtime_each_policy_does_what_it_says(connect, backend):
    conn = await connect()
    first = jobguard.Scheduler(schedules(), backend, table="jobguard_jobs")
    await first.migrate(on_connection(conn))
    await first.register(on_connection(conn), T0)
    assert await first.tick(on_connection(conn), T0 + 5) == []

    # No scheduler for 10 firings; one starts 5 s after the tenth.
    restarted = jobguard.Scheduler(schedules(), backend, table="jobguard_jobs")
    firings = await restarted.tick(on_connection(conn), T0 + 10 * MINUTE + 5)
    outcome = {(f.schedule.removeprefix("every-minute-"), f.outcome): [] for f in firings}
    for f in firings:
        outcome[(f.schedule.removeprefix("every-minute-"), f.outcome)].append(f.at)
    minutes = lambda *ns: [T0 + n * MINUTE for n in ns]  # noqa: E731
    assert outcome[("skip", "enqueued")] == minutes(10)
    assert outcome[("skip", "missed")] == minutes(*range(1, 10))
    assert outcome[("latest", "enqueued")] == minutes(9, 10)
    assert outcome[("latest", "missed")] == minutes(*range(1, 9))
    assert outcome[("all", "enqueued")] == minutes(*range(1, 11))
    assert ("all", "missed") not in outcome
    assert outcome[("all:3", "enqueued")] == minutes(7, 8, 9, 10)
    assert outcome[("all:3", "missed")] == minutes(*range(1, 7))
    assert await jobs(conn, backend) == {
        "every-minute-skip": [at(10)],
        "every-minute-latest": [at(9), at(10)],
        "every-minute-all": [at(n) for n in range(1, 11)],
        "every-minute-all:3": [at(n) for n in (7, 8, 9, 10)],
    }
    # Restarted again at the same moment: every firing is taken, none is enqueued again.
    again = jobguard.Scheduler(schedules(), backend, table="jobguard_jobs")
    assert await again.tick(on_connection(conn), T0 + 10 * MINUTE + 6) == []


async def test_two_schedulers_at_once_enqueue_each_firing_once(connect, backend):
    one, two = await connect(), await connect()
    setup = jobguard.Scheduler(schedules(), backend, table="jobguard_jobs")
    await setup.migrate(on_connection(one))
    await setup.register(on_connection(one), T0)
    a = jobguard.Scheduler(schedules(), backend, table="jobguard_jobs")
    b = jobguard.Scheduler(schedules(), backend, table="jobguard_jobs")
    now = T0 + 3 * MINUTE + 1
    ours, theirs = await asyncio.gather(a.tick(on_connection(one), now),
                                        b.tick(on_connection(two), now))
    per_firing: dict[tuple[str, int], list[str]] = {}
    for f in ours + theirs:
        if f.outcome != "missed":
            per_firing.setdefault((f.schedule, f.at), []).append(f.outcome)
    # A scheduler that read the row after the other recorded a firing leaves it out; one
    # that planned it too finds it taken.
    assert all(sorted(o) in (["enqueued"], ["already_enqueued", "enqueued"])
               for o in per_firing.values()), per_firing
    found = await jobs(conn=one, backend=backend)
    assert found["every-minute-all"] == [at(1), at(2), at(3)]
    assert found["every-minute-skip"] == [at(3)]


async def test_schedulers_creating_the_schedules_table_at_once_take_turns(connect, backend):
    # `create table if not exists` run at one instant by several sessions races in
    # PostgreSQL's catalog (a unique violation on pg_type); the migration lock the Rust
    # scheduler takes makes them take turns.
    if backend != "postgres":
        pytest.skip("SQLite serialises writers itself")
    conns = [await connect() for _ in range(8)]
    for _ in range(5):
        await conns[0].execute("drop table if exists jobguard_jobs_schedules")
        starting = [jobguard.Scheduler(schedules(), backend, table="jobguard_jobs")
                    for _ in conns]
        await asyncio.gather(*(s.migrate(on_connection(c)) for s, c in zip(starting, conns)))
        await asyncio.gather(*(s.register(on_connection(c), T0)
                               for s, c in zip(starting, conns)))
    listed = await conns[0].fetch("select name from jobguard_jobs_schedules order by name")
    assert [r[0] for r in listed] == sorted(s.name for s in schedules())


async def test_a_firing_whose_job_completed_is_not_enqueued_again(connect, backend, url, cli):  # noqa: F811
    conn = await connect()
    every_minute = schedules()[0]
    first = jobguard.Scheduler([every_minute], backend, table="jobguard_jobs")
    await first.migrate(on_connection(conn))
    await first.register(on_connection(conn), T0)
    [fired] = await first.tick(on_connection(conn), T0 + MINUTE + 1)
    assert fired.outcome == "enqueued"
    cli("worker", "--until-idle", url=url)  # the Rust worker runs the firing's noop job
    # A scheduler that planned the same firing before the row moved on (stopped, slow) comes
    # to it now: the key is kept through completion, so it finds the job, not a free key.
    late = jobguard.Scheduler([every_minute], backend, table="jobguard_jobs")
    again = await late._fire(on_connection(conn), every_minute, T0 + MINUTE, T0 + MINUTE + 2)
    assert (again.outcome, again.job) == ("already_enqueued", fired.job)
    assert await jobs(conn, backend) == {"every-minute-skip": [at(1)]}


async def test_a_stalled_scheduler_does_not_fire_again_what_was_completed_and_pruned(
        connect, backend, url, cli):  # noqa: F811
    # A scheduler reads the schedule's row, then stalls before it fires, while another fires
    # the same time, the Rust worker completes its job and `jobguard prune` deletes the
    # completed row: the firing's key is free again, yet the stalled one enqueues nothing.
    conn = await connect()
    every_minute = schedules()[0]
    stalled = jobguard.Scheduler([every_minute], backend, table="jobguard_jobs")
    await stalled.migrate(on_connection(conn))
    await stalled.register(on_connection(conn), T0)
    reached, resume = asyncio.Event(), asyncio.Event()
    fire = stalled._fire

    async def fire_after_a_stall(*args: Any) -> Any:
        reached.set()
        await resume.wait()
        return await fire(*args)

    stalled._fire = fire_after_a_stall  # type: ignore[method-assign]
    round_ = asyncio.create_task(stalled.tick(on_connection(await connect()), T0 + MINUTE + 1))
    await reached.wait()

    other = jobguard.Scheduler([every_minute], backend, table="jobguard_jobs")
    [fired] = await other.tick(on_connection(conn), T0 + MINUTE + 1)
    assert fired.outcome == "enqueued"
    cli("worker", "--until-idle", url=url)
    cli("prune", "--keep-completed", "0s", url=url)
    assert await jobs(conn, backend) == {}, "the firing's completed job was pruned"

    resume.set()
    [again] = await round_
    assert (again.at, again.outcome) == (T0 + MINUTE, "already_enqueued")
    assert await jobs(conn, backend) == {}, "the firing was not enqueued again"


def test_firings_around_a_dst_change_are_croners_each_once():
    # Paris springs forward at 2026-03-29 01:00 UTC (02:00 local becomes 03:00): 02:30 local
    # does not exist and fires at the first instant after the gap; in autumn (2026-10-25
    # 01:00 UTC, 03:00 local back to 02:00) 02:30 comes twice and fires once, the first time.
    nightly = jobguard.Periodic("paris", "30 2 * * *", "noop", {"id": "x"}, zone="Europe/Paris")
    utc = lambda *args: int(_dt.datetime(*args, tzinfo=_dt.timezone.utc).timestamp())  # noqa: E731
    spring = nightly.firings(utc(2026, 3, 27, 12), utc(2026, 3, 30, 12))
    assert spring == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]
    autumn = nightly.firings(utc(2026, 10, 24, 12), utc(2026, 10, 26, 12))
    assert autumn == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]
    assert len({_native.firing_key("paris", t) for t in spring + autumn}) == 5


def test_bad_input_is_refused_naming_the_schedule():
    app = jobguard.App(db=lambda: None)

    @app.job("report")
    async def report(conn, recipients):
        pass

    cases = [
        (dict(cron="every night"), "not a cron expression"),
        (dict(cron="0 0 30 2 *"), "never fires"),
        (dict(cron="0 3 * * *", zone="Mars/Olympus"), "unknown time zone `Mars/Olympus`"),
        (dict(cron="0 3 * * *", missed="sometimes"), "missed-firings policy"),
        (dict(cron="0 3 * * *", payload={"to": "ops"}), "does not bind"),
        (dict(cron="0 3 * * *", payload={"recipients": "\x00"}), "payload"),
    ]
    for options, reason in cases:
        with pytest.raises(jobguard.InvalidSchedule, match=reason) as refused:
            app.periodic(options.pop("cron"), name="nightly", **options)(report)
        assert refused.value.schedule == "nightly" and "schedule `nightly`" in str(refused.value)
    with pytest.raises(jobguard.InvalidSchedule, match="above @app.job"):
        app.periodic("0 3 * * *", name="plain")(lambda conn: None)
    app.periodic("0 3 * * *", name="nightly", payload={"recipients": "ops"})(report)
    with pytest.raises(jobguard.InvalidSchedule, match="two schedules have this name"):
        app.periodic("0 4 * * *", name="nightly", payload={"recipients": "ops"})(report)
    assert [s.name for s in app.schedules] == ["nightly"]


async def test_a_kind_the_app_does_not_define_is_refused_when_the_worker_starts(pg_url, cli):  # noqa: F811
    cli("worker", "--until-idle", url=pg_url)
    app = jobguard.App(db=lambda: asyncpg.create_pool(pg_url, min_size=1, max_size=2))

    @app.job("report")
    async def report(conn, recipients):
        pass

    app.periodic("* * * * * *", name="orphan", kind="invoice", payload={"n": 1})
    with pytest.raises(jobguard.InvalidSchedule, match="no job of kind `invoice`") as refused:
        await app.run_worker(handle_signals=False)
    assert refused.value.schedule == "orphan"
    conn = await asyncpg.connect(pg_url)
    try:
        assert await conn.fetchval("select count(*) from jobguard_jobs") == 0
        assert await conn.fetchval("select to_regclass('jobguard_jobs_schedules')") is None
    finally:
        await conn.close()
