"""Periodic jobs for Python: a job enqueued at each firing of a cron expression, exactly once
per firing however many schedulers (Python or Rust workers) run the schedule, with no leader.

Each firing is one job whose key names the schedule and the firing's scheduled time in UTC
(``periodic:nightly-report:2026-12-06T03:00:00Z``), enqueued under the unique policy that
keeps the key while the job waits, runs, and after it completed or died: every scheduler
enqueues the same key for the same firing, the database keeps one job, and a restarted
scheduler finds the firing taken. Each schedule has a row in ``<jobs table>_schedules``, the
table the Rust worker uses, written in the transaction that enqueues the firing, so
``jobguard schedules`` shows Python schedules too.

Every rule comes from the Rust core through ``jobguard._native``: the cron expression and its
time zone (croner on chrono-tz), the firings due, the key of a firing, the missed-firings plan
(``skip``, ``latest``, ``all`` or ``all:N``), the firing's unique states and the schedules
table's statements. Python runs them; it holds no second copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any, AsyncContextManager, Callable, Mapping, Sequence

from . import _keys, _native
from ._drivers import driver_for
from ._enqueue import DEFAULT_QUEUE, _Job
from ._migrate_queue import migration_steps
from ._unique import Unique, run_async, steps
from .errors import InvalidSchedule, KeyReused
from .metrics import record_firing

log = logging.getLogger("jobguard.periodic")

#: How late a scheduler may reach a firing and still count it on time (seconds): the Rust
#: scheduler's default.
DEFAULT_GRACE = 60.0
# The longest the scheduler sleeps between two looks at the clock, and its wait after a round
# that failed: the Rust scheduler's.
_MAX_SLEEP = 60.0
_RETRY_AFTER = 1.0
_NEVER = -(2**63)

#: How every firing's key begins: ``periodic:<schedule>:<time>``.
FIRING_KEY_PREFIX = _native.parse_key(_native.firing_key("x", 0))[0] + ":"

#: What a firing's job keeps its key through: the core's firing policy.
FIRING_POLICY = Unique(states=_native.firing_unique_states())


@dataclasses.dataclass(frozen=True)
class Periodic:
    """A schedule: the job ``kind`` with ``payload`` (its keyword arguments) enqueued at every
    firing of ``cron`` (five fields, minute hour day-of-month month day-of-week, or six with
    seconds first) in the IANA time zone ``zone``, on ``queue``. ``missed`` says what to do with
    the firings that came due while no scheduler ran: ``skip``, ``latest`` (one catch-up) or
    ``all`` / ``all:N`` (each, up to N). A firing reached within ``grace`` seconds is on time.
    ``firing_field`` names a payload field set to each firing's time
    (``2026-12-06T03:00:00Z``), for a job that needs to know which firing it runs for.

    Checked when made, by the core: an invalid cron expression, an unknown zone, a bad name or
    policy, a payload that is not JSON or breaks the queue's payload rules is
    :class:`InvalidSchedule` naming the schedule."""

    name: str
    cron: str
    kind: str
    payload: dict[str, Any] = dataclasses.field(default_factory=dict)
    zone: str = "UTC"
    queue: str = DEFAULT_QUEUE
    missed: str = "skip"
    grace: float = DEFAULT_GRACE
    max_attempts: int = 10
    firing_field: str | None = None
    # The parsed expression, set when made.
    _cron: _native.Cron = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        name = self.name

        def refuse(reason: str) -> InvalidSchedule:
            return InvalidSchedule(str(name), reason)

        if not isinstance(name, str):
            raise refuse(f"the name is a {type(name).__name__}, not a string")
        try:
            _native.firing_key(name, 0)
        except ValueError as error:
            raise refuse(f"bad schedule name: {error}") from None
        try:
            cron = _native.Cron(self.cron, self.zone)
        except (ValueError, TypeError) as error:
            raise refuse(str(error)) from None
        try:
            missed = _native.missed_policy(self.missed)
        except (ValueError, TypeError) as error:
            raise refuse(str(error)) from None
        for what, value in (("kind", self.kind), ("queue", self.queue)):
            try:
                _keys.key(value, "x")
            except Exception as error:  # noqa: BLE001 - named with the schedule
                raise refuse(f"bad {what}: {error}") from None
        if not isinstance(self.payload, dict):
            raise refuse(f"the payload is a {type(self.payload).__name__}: give the job's "
                         "keyword arguments as a dict")
        try:
            _keys.check_job_payload(_native.firing_key(name, 0), _keys.to_json(self.payload))
        except Exception as error:  # noqa: BLE001 - named with the schedule
            raise refuse(f"the payload cannot be enqueued: {error}") from None
        if not self.grace >= 0:
            raise refuse(f"grace must be >= 0 seconds, not {self.grace!r}")
        object.__setattr__(self, "missed", missed)
        object.__setattr__(self, "_cron", cron)

    def payload_at(self, at: int) -> dict[str, Any]:
        """The payload of the firing at ``at``: with ``firing_field`` set to its time."""
        if self.firing_field is None:
            return self.payload
        return {**self.payload, self.firing_field: _native.format_firing(at)}

    def next_after(self, seconds: float) -> int | None:
        """The first firing strictly after ``seconds`` since the epoch."""
        return self._cron.next_after(int(seconds))

    def firings(self, after: int, through: int) -> list[int]:
        """The firings after ``after`` and at or before ``through``, oldest first."""
        return self._cron.due(after, through)[0]


@dataclasses.dataclass(frozen=True)
class Firing:
    """What became of one firing: ``enqueued`` (this scheduler enqueued its job),
    ``already_enqueued`` (another scheduler had, or this one before a restart) or ``missed``
    (left out by the policy). ``job`` holds the firing's key, unless it was missed."""

    schedule: str
    at: int
    outcome: str
    job: int | None


#: Opens a connection for one unit of work: an async context manager giving an object with
#: ``conn`` and async ``fetchone``, ``execute`` and ``transaction`` (a worker's session, or
#: :func:`on_connection`).
Opener = Callable[[], AsyncContextManager[Any]]


def on_connection(conn: Any) -> Opener:
    """An opener that hands out ``conn`` itself (asyncpg, psycopg async with autocommit,
    aiosqlite), for running a :class:`Scheduler` round by hand."""
    d = driver_for(conn)

    @contextlib.asynccontextmanager
    async def opened() -> Any:
        yield d

    return opened


class Scheduler:
    """Enqueues the firings of ``schedules``, each once, into the jobs table ``table``.

    A worker with schedules runs one (:meth:`run`); :meth:`tick` runs one round at a given
    time, for tests with a clock of their own. Two schedules of one name are
    :class:`InvalidSchedule`."""

    def __init__(self, schedules: Sequence[Periodic], dialect: str, *,
                 table: str, schema: str | None = None) -> None:
        names: set[str] = set()
        for schedule in schedules:
            if schedule.name in names:
                raise InvalidSchedule(schedule.name, "two schedules have this name; give each "
                                      "its own")
            names.add(schedule.name)
        self.schedules = list(schedules)
        self.dialect, self.table, self.schema = dialect, table, schema
        self.sql = _native.schedule_sql(dialect, table, schema)
        # Per schedule, the latest firing this scheduler has decided: the next round starts
        # after it.
        self._decided: dict[str, int] = {}

    async def migrate(self, open_session: Opener) -> None:
        """Creates the schedules table when missing: on PostgreSQL under the per-table
        migration lock and marker the Rust scheduler uses, so schedulers of either language
        starting at once take turns (``create table if not exists`` alone races in
        PostgreSQL's catalog)."""
        async with open_session() as s:
            async with s.transaction():
                for statement, params, how in migration_steps(self.dialect, self.sql):
                    if how == "check":
                        row = await s.fetchone(statement, params)
                        if row is not None and row[0]:
                            return
                    else:
                        await s.execute(statement, params)

    async def register(self, open_session: Opener, now: float) -> None:
        """Writes each schedule's row (its definition, and when it was first run)."""
        for schedule in self.schedules:
            await self._register_one(open_session, schedule, int(now))

    async def _register_one(self, open_session: Opener, schedule: Periodic, now: int
                            ) -> tuple[Any, ...]:
        async with open_session() as s:
            async with s.transaction():
                row: tuple[Any, ...] = await s.fetchone(self.sql["register"], [
                    schedule.name, schedule.cron, schedule.zone, schedule.kind, schedule.queue,
                    now,
                ])
                return row

    async def tick(self, open_session: Opener, now: float) -> list[Firing]:
        """One round at ``now`` (seconds since the epoch): for each schedule, the firings due
        since its last one (and since it was first run), enqueued or left out as its
        ``missed`` policy says. What became of each, oldest first per schedule."""
        firings: list[Firing] = []
        for schedule in self.schedules:
            firings += await self._tick_one(open_session, schedule, int(now))
        return firings

    async def _tick_one(self, open_session: Opener, schedule: Periodic, now: int) -> list[Firing]:
        async with open_session() as s:
            stored = await s.fetchone(self.sql["read"], [schedule.name])
        if stored is None:
            stored = await self._register_one(open_session, schedule, now)
        created_at, last_fired_at = int(stored[0]), stored[1]
        after = max(created_at, _NEVER if last_fired_at is None else int(last_fired_at),
                    self._decided.get(schedule.name, _NEVER))
        due, cut = schedule._cron.due(after, now)
        if cut:
            log.warning("schedule %s: more firings were missed than one round considers; the "
                        "oldest are not counted", schedule.name)
        enqueue, missed = _native.plan(due, now, int(schedule.grace), schedule.missed)
        firings: list[Firing] = []
        missed = list(missed)
        for at in enqueue:
            while missed and missed[0] < at:
                firings.append(self._missed(schedule, missed.pop(0)))
            firings.append(await self._fire(open_session, schedule, at, now))
            self._decide(schedule.name, at)
        firings += [self._missed(schedule, at) for at in missed]
        if due:
            self._decide(schedule.name, due[-1])
        return firings

    def _decide(self, name: str, at: int) -> None:
        self._decided[name] = max(self._decided.get(name, at), at)

    def _missed(self, schedule: Periodic, at: int) -> Firing:
        firing = Firing(schedule.name, at, "missed", None)
        record_firing(firing.schedule, firing.outcome)
        return firing

    async def _fire(self, open_session: Opener, schedule: Periodic, at: int, now: int) -> Firing:
        """Enqueues the firing at ``at`` and records it as the schedule's last, in one
        transaction that first takes the firing on the schedule's row (the core's ``advance``):
        a firing at or before the schedule's last is never enqueued again, even once its job
        completed and was pruned. A scheduler that took it first (committed or not) holds the
        row: this one waits for that one's commit, then takes nothing and reports its job."""
        key = _native.firing_key(schedule.name, at)
        done: Any = None  # the enqueue's outcome, when this transaction took the firing
        held: Any = None  # else the row of the job recorded for the firing
        async with open_session() as s:
            d = driver_for(s.conn)
            job = _Job(d, schedule.kind, schedule.payload_at(at), key, schedule.queue,
                       schedule.max_attempts, 0.0, self.table, self.schema)
            try:
                async with s.transaction():
                    took = await s.fetchone(self.sql["advance"], [schedule.name, at, now])
                    if took is None:
                        held = await s.fetchone(self.sql["firing_job"], [schedule.name, at])
                    else:
                        done = await run_async(s, steps(job, FIRING_POLICY, self.dialect,
                                                        self.table, self.schema, d.encode_json,
                                                        d.decode_json))
                        await s.execute(self.sql["fired"], [schedule.name, at, done.id, now])
            except KeyReused:
                # The schedule's payload changed since a scheduler enqueued this firing: it is
                # taken all the same.
                log.warning("schedule %s: the firing %s was enqueued with another payload or "
                            "kind; leaving it", schedule.name, key)
                firing = Firing(schedule.name, at, "already_enqueued", None)
                record_firing(firing.schedule, firing.outcome)
                return firing
        if done is None:
            job_id = None if held is None or held[0] is None else int(held[0])
            firing = Firing(schedule.name, at, "already_enqueued", job_id)
        else:
            outcome = "enqueued" if done.inserted else "already_enqueued"
            firing = Firing(schedule.name, at, outcome, done.id)
        record_firing(firing.schedule, firing.outcome)
        log.debug("schedule %s: firing %s %s (job %s)", schedule.name,
                  _native.format_firing(at), firing.outcome, firing.job)
        return firing

    def next_firing(self, now: float) -> int | None:
        """The next firing of any schedule strictly after ``now``."""
        nexts = [n for n in (s.next_after(now) for s in self.schedules) if n is not None]
        return min(nexts) if nexts else None

    async def run(self, open_session: Opener, stopping: asyncio.Event) -> None:
        """Creates the table and registers the schedules, then runs a round at every firing,
        until ``stopping`` is set."""
        while not stopping.is_set():
            try:
                await self.migrate(open_session)
                await self.register(open_session, time.time())
                break
            except Exception as error:  # noqa: BLE001 - the database may come back
                log.warning("cannot record the schedules (%s); retrying", error)
                await _sleep(stopping, _RETRY_AFTER)
        while not stopping.is_set():
            try:
                await self.tick(open_session, time.time())
                now = time.time()
                upcoming = self.next_firing(now)
                wait = _MAX_SLEEP if upcoming is None else min(max(upcoming - now, 0.0), _MAX_SLEEP)
            except Exception as error:  # noqa: BLE001 - the database may come back
                log.warning("enqueueing periodic firings failed (%s); retrying", error)
                wait = _RETRY_AFTER
            await _sleep(stopping, wait)


async def _sleep(stopping: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stopping.wait(), timeout=seconds)


def check_schedules(schedules: Sequence[Periodic], jobs: Mapping[str, Any]) -> None:
    """Refuses, before anything is enqueued, a schedule whose kind the app does not define or
    whose payload does not bind to that job's parameters."""
    for schedule in schedules:
        job = jobs.get(schedule.kind)
        if job is None:
            defined = ", ".join(sorted(jobs)) or "none"
            raise InvalidSchedule(schedule.name, f"no job of kind `{schedule.kind}` is defined "
                                  f"on this app (defined: {defined}); define it with @app.job")
        try:
            job.spec.signature.bind(None, **schedule.payload_at(0))
        except TypeError as error:
            raise InvalidSchedule(schedule.name, f"the payload does not bind to "
                                  f"`{schedule.kind}`'s parameters: {error}") from None
