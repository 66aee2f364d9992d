"""The Python worker of jobguard's queue: fetch, run, settle, on the user's own pool.

Each job runs in one transaction on a connection of the app's pool: the statement that
completes the job under its lease token and claims its key in the guard table (the Rust
worker's own text, from the core), then the job's body on that connection, then the commit. So
the job's effect, its guard row and its completion commit together or not at all:

- a key already applied completes the job as a duplicate, without calling the body;
- a worker whose lease expired and was taken over gets no row from that statement: it is
  fenced off, and neither calls the body nor commits anything;
- an exception rolls everything back, and the job is retried after the core's backoff, or
  dead-lettered on its last attempt (the lesser of its own and the retry policy's), exactly as
  a Rust job; a transient database error (serialization failure, deadlock, lost connection) runs
  the job again at once, a few times, then gives its lease back without counting the attempt.

The loop fetches only the kinds the app defines, so Rust and Python workers share one queue,
each running its own kinds; a kind no running worker defines stays waiting. It wakes on the
queue's notification (``LISTEN``), with a poll as fallback; it extends the leases of jobs
fetched but not started, and gives back expired leases of dead workers (the rescue). SIGTERM
and SIGINT stop fetching, let running jobs finish within ``shutdown_timeout`` and give back the
rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as _dt
import json
import logging
import random
import signal
import inspect
from typing import Any, AsyncIterator, Callable, Mapping, Protocol, Sequence

from . import _keys, _native
from ._batches import group
from ._enqueue import DEFAULT_QUEUE
from ._guard import _tokens
from ._migrate import is_not_migrated
from ._periodic import FIRING_KEY_PREFIX, Periodic, Scheduler, check_schedules
from ._pools import Database, open_database
from ._session import Row, Session
from ._queue_sql import Backoff, worker_sql
from ._retry import transient_reason
from .errors import GuardVanished, KeyReused, NotMigrated, UnsupportedConnection
from .metrics import record_outcome



class JobKind(Protocol):
    """What the worker reads of a job kind (``app.JobSpec``)."""

    @property
    def kind(self) -> str: ...
    @property
    def fn(self) -> Callable[..., Any]: ...
    @property
    def key(self) -> Callable[..., str] | None: ...
    @property
    def signature(self) -> inspect.Signature: ...
    @property
    def is_async(self) -> bool: ...
    @property
    def batch(self) -> bool: ...


class DefinedJob(Protocol):
    """A job the app defines (``app.Job``), as the worker reads it."""

    @property
    def spec(self) -> JobKind: ...


class WorkerApp(Protocol):
    """What the worker reads of an :class:`~jobguard.App`: its jobs, schedules, database,
    tables and retry policy (the app imports the worker, not the reverse)."""

    db: Any
    table: str
    schema: str | None
    guard_table: str
    guard_schema: str | None
    retry: Backoff

    @property
    def jobs(self) -> Mapping[str, DefinedJob]: ...
    @property
    def schedules(self) -> Sequence[Periodic]: ...
    def check_driver(self, kind: str, is_async: bool, pool_is_async: bool | None = None
                     ) -> None: ...

log = logging.getLogger("jobguard.worker")

# Runs of one job within one attempt when its transaction failed for a transient reason, the
# Rust worker's (the core's): past them the job is given back, its attempt not counted.
_TRANSIENT_RUNS = _native.TRANSIENT_RUNS
# Where enqueues notify, a fetch reads the queue from its head at most this often (seconds);
# the others start a margin (microseconds) behind the newest job a fetch took. The head of the
# fetch's index holds an entry for every job completed since the last vacuum, which a fetch
# from the head walks: 2 ms a fetch after 40,000 jobs, against 0.03 ms once vacuumed.
_HEAD_EVERY = 0.1
_FLOOR_MARGIN_US = 1_000_000


@dataclasses.dataclass(frozen=True)
class LeasedJob:
    """A job a fetch leased to this worker: ``token`` fences every statement on it."""

    id: int
    kind: str
    key: str
    payload: Any
    attempt: int
    max_attempts: int
    token: int
    replayed: bool


@dataclasses.dataclass
class WorkerStats:
    """How the jobs a worker ran ended."""

    applied: int = 0
    duplicates: int = 0
    failed: int = 0
    dead: int = 0
    fenced: int = 0
    released: int = 0
    batches: int = 0
    batches_rolled_back: int = 0

    def count(self, outcome: str) -> None:
        name = {"duplicate": "duplicates"}.get(outcome, outcome)
        setattr(self, name, getattr(self, name) + 1)


class _Fenced(Exception):
    """The job's lease was taken over: nothing was completed or claimed."""


class Worker:
    """Runs an :class:`~jobguard.App`'s kinds from one queue.

    ``concurrency`` jobs at once, each holding one connection of the pool while it runs (the
    worker needs one more for its fetches and heartbeats, and one to listen); leases of
    ``lease`` seconds, extended every third of it until the job starts; a poll every
    ``poll_interval`` seconds when no notification comes; ``shutdown_timeout`` seconds for
    running jobs to finish on SIGTERM or SIGINT. ``until_idle`` returns once the queue has no
    job due for its kinds and nothing runs.

    ``batch_size`` above 1 (PostgreSQL) runs up to that many jobs of kinds defined with
    ``batch=True`` in one transaction when a backlog builds: one statement completes them
    under their lease tokens and claims their keys, their bodies run in fetch order, one commit.
    Any error rolls the whole batch back, and its jobs run again one per transaction."""

    def __init__(
        self, app: WorkerApp, *, queue: str = DEFAULT_QUEUE, concurrency: int = 10,
        lease: float = 30.0, poll_interval: float = 1.0, shutdown_timeout: float = 30.0,
        until_idle: bool = False, handle_signals: bool = True, batch_size: int = 1,
    ) -> None:
        _keys.key(queue, "x")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, not {batch_size!r}")
        if lease <= 0 or poll_interval <= 0 or shutdown_timeout < 0:
            raise ValueError("lease and poll_interval must be > 0, shutdown_timeout >= 0")
        if not app.jobs:
            raise ValueError("the app defines no jobs: define them with @app.job(...) first")
        self.app, self.queue, self.concurrency = app, queue, concurrency
        self.lease, self.poll_interval = lease, poll_interval
        self.shutdown_timeout, self.until_idle = shutdown_timeout, until_idle
        self.handle_signals = handle_signals
        self.batch_size = batch_size
        self.kinds = sorted(app.jobs)
        # Groups beyond the free slots (a fetch for batches that brought jobs of kinds that do
        # not batch) wait here for one.
        self._slots = asyncio.Semaphore(concurrency)
        self.stats = WorkerStats()
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        # Leases fetched and not settled (id -> token), and those of jobs not yet started,
        # which the heartbeats extend.
        self._leased: dict[int, int] = {}
        self._waiting: dict[int, int] = {}
        self._db: Database | None = None
        self._sql: dict[str, str] = {}
        # Connections the last jobs ended on, kept for the next ones while jobs keep coming;
        # only while the worker serves (`execute` called alone gives its connection back).
        self._kept: list[tuple[contextlib.AbstractAsyncContextManager[Session], Session]] = []
        self._keeping = False
        # Whether enqueues wake this worker (its listener is up): then a job's end does not
        # call for a fetch when the last one found the queue short.
        self._listening = False
        # Where a fetch between two reads of the head starts (run at in microseconds, id), and
        # when the head was last read (monotonic seconds).
        self._floor: tuple[int, int] | None = None
        self._head_read_at = float("-inf")

    def stop(self) -> None:
        """Stops fetching; running jobs finish within ``shutdown_timeout``."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> WorkerStats:
        """Runs until :meth:`stop`, SIGTERM or SIGINT (or idle, with ``until_idle``)."""
        db = self._db = await open_database(self.app.db)
        try:
            for job in self.app.jobs.values():
                self.app.check_driver(job.spec.kind, job.spec.is_async, db.is_async)
            check_schedules(self.app.schedules, self.app.jobs)
            self._sql = worker_sql(
                db.dialect, self.app.table, self.app.guard_table, self.app.schema,
                self.app.guard_schema,
            )
            if self.batch_size > 1 and "claim_completing_many" not in self._sql:
                raise UnsupportedConnection(
                    "batches run on PostgreSQL: on SQLite keep batch_size at 1")
            return await self._serve(db)
        finally:
            await db.close()

    async def _serve(self, db: Database) -> WorkerStats:
        loop = asyncio.get_running_loop()
        signals = self._install_signals(loop)
        unlisten = None
        if "notify_channel" in self._sql:
            try:
                unlisten = await db.listen(self._sql["notify_channel"], self._notified)
            except Exception as error:  # noqa: BLE001 - the poll still finds every job
                log.warning("cannot listen for new jobs (%s); polling every %ss",
                            error, self.poll_interval)
        self._listening = unlisten is not None
        # Leases a dead worker left expired are given back before the first fetch, so that a
        # worker started after a crash (or with `until_idle`) runs them at once.
        await self._rescue()
        keepers = [loop.create_task(self._heartbeats()), loop.create_task(self._rescues())]
        if self.app.schedules:
            scheduler = Scheduler(self.app.schedules, db.dialect, table=self.app.table,
                                  schema=self.app.schema)
            keepers.append(loop.create_task(scheduler.run(db.session, self._stopping)))
        running: set[asyncio.Task[Any]] = set()
        self._keeping = True
        try:
            await self._fetch_loop(running)
        finally:
            await self._drain(running)
            self._keeping = False
            await self._give_back_kept()
            for task in keepers:
                task.cancel()
            # A keeper's statement on a sync driver may wait on its thread for a lock a sync
            # body that outlived the shutdown holds (SQLite's write lock): not waited for.
            await asyncio.wait(keepers, timeout=None if db.is_async else 1.0)
            if unlisten is not None:
                with contextlib.suppress(Exception):
                    await unlisten()
            for sig in signals:
                loop.remove_signal_handler(sig)
        return self.stats

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        if not self.handle_signals:
            return []
        installed: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        return installed

    def _notified(self, queue: str) -> None:
        if queue == self.queue:
            self._wake.set()

    async def _fetch_loop(self, running: set[asyncio.Task[Any]]) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            free = self.concurrency - len(running)
            if free <= 0:
                await self._wait(running, None)
                continue
            self._wake.clear()
            limit = free * self.batch_size if self._batching() else free
            try:
                jobs = await self._fetch(limit)
            except NotMigrated:
                raise
            except Exception as error:  # noqa: BLE001 - the database may come back
                log.warning("fetching jobs failed (%s); trying again in %ss",
                            error, self.poll_interval)
                await self._wait(running, self.poll_interval)
                continue
            for jobs_of_one in group(jobs, free, self.batch_size, self._batches):
                task = loop.create_task(self._process_group(jobs_of_one))
                running.add(task)
                task.add_done_callback(running.discard)
            if len(jobs) == limit:
                continue
            if self.until_idle and not jobs and not running:
                return
            # Short of the limit: the queue has nothing more for now, and a job's end adds
            # nothing to it. Where enqueues notify, the next fetch waits for a notification (or
            # the poll), not for the next job to end: a fetch per finished job would find
            # nothing, and each empty one gave the kept connections back. Without
            # notifications (SQLite, a listener that failed), and with `until_idle` (which
            # must see the queue empty with nothing running), a job's end still wakes it.
            ends = running if self.until_idle or not self._listening else set()
            if not await self._wait(ends, self.poll_interval):
                # A poll interval without a notification or a job's end: idle, so the
                # connections kept between jobs go back to the pool.
                await self._give_back_kept()

    async def _wait(self, running: set[asyncio.Task[Any]], timeout: float | None) -> bool:
        """Until a notification, a job of ``running`` ending, a stop, or ``timeout``; false
        when the timeout passed first."""
        waiters = [asyncio.ensure_future(self._wake.wait())]
        waiters += list(running)
        done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        waiters[0].cancel()
        return bool(done)

    def _fetch_statement(self, limit: int) -> tuple[str, list[Any]]:
        """The fetch to run now, and its parameters: from the head of the queue, or, where
        enqueues notify and the head was read less than ``_HEAD_EVERY`` ago, from a margin
        behind the newest job a fetch took, past the index entries of the jobs completed before
        it. A job that becomes waiting behind that place (an enqueue whose transaction was
        open longer than the margin, a lease given back) is fetched by the next read of the
        head: the next fetch once ``_HEAD_EVERY`` has passed, at the latest the poll."""
        params = [self.queue, limit, int(self.lease * 1_000_000), self._kinds_param()]
        now = asyncio.get_running_loop().time()
        if (self._floor is not None and self._listening and not self.until_idle
                and "fetch_after" in self._sql and now - self._head_read_at < _HEAD_EVERY):
            return self._sql["fetch_after"], [*params, *self._floor]
        self._head_read_at = now
        return self._sql["fetch"], params

    def _read_head_next(self) -> None:
        """The next fetch reads the queue from its head: jobs were given back behind the
        floor."""
        self._head_read_at = float("-inf")

    async def _fetch(self, limit: int) -> list[LeasedJob]:
        assert self._db is not None
        statement, params = self._fetch_statement(limit)
        try:
            # A kept connection too: the fetch runs at every notification (and, with a
            # backlog, at jobs' ends), and a connection given back to the pool each time costs
            # a reset's round trip before the jobs it fetched can start.
            async with self._job_session() as s:
                rows = await s.fetch(statement, params)
        except Exception as error:
            if is_not_migrated(error):
                raise NotMigrated(
                    f"the queue table `{self.app.table}` or the guard table "
                    f"`{self.app.guard_table}` does not exist or was made by an older jobguard: "
                    "run `await app.migrate()` (sync code: `app.migrate_sync()`), or start "
                    "this worker with `python -m jobguard worker module:app --migrate`, on this "
                    "database once first"
                ) from error
            raise
        jobs = []
        for row in rows:
            payload = row[3]
            if not self._db.decodes_json and isinstance(payload, (str, bytes)):
                payload = json.loads(payload)
            job = LeasedJob(int(row[0]), row[1], row[2], payload, int(row[4]), int(row[5]),
                            int(row[7]), bool(row[9]))
            self._leased[job.id] = job.token
            self._waiting[job.id] = job.token
            jobs.append(job)
        if rows and "fetch_after" in self._sql:
            floor = (max(int(row[8]) for row in rows) - _FLOOR_MARGIN_US, 0)
            self._floor = floor if self._floor is None else max(self._floor, floor)
        return jobs

    def _batching(self) -> bool:
        return self.batch_size > 1 and any(j.spec.batch for j in self.app.jobs.values())

    def _batches(self, job: LeasedJob) -> bool:
        return self.app.jobs[job.kind].spec.batch

    def _kinds_param(self) -> Any:
        return json.dumps(self.kinds) if self._db and self._db.dialect == "sqlite" else self.kinds

    async def _process_group(self, jobs: list[LeasedJob]) -> None:
        async with self._slots:
            if self._stopping.is_set():  # waited for a slot past the stop: given back
                for job in jobs:
                    self._leased.pop(job.id, None)
                    self._waiting.pop(job.id, None)
                    await self._release(job)
                return
            if len(jobs) > 1 and await self._process_batch(jobs):
                return
            for job in jobs:
                await self._process(job)

    async def _process(self, job: LeasedJob) -> None:
        try:
            outcome = await self.execute(job)
        finally:
            self._leased.pop(job.id, None)
            self._waiting.pop(job.id, None)
        self._ended(job, outcome)

    def _ended(self, job: LeasedJob, outcome: str) -> None:
        self.stats.count(outcome)
        record_outcome(job.kind, outcome)
        log.debug("job %s (%s, key %s, attempt %d): %s", job.id, job.kind, job.key,
                  job.attempt, outcome)

    async def _process_batch(self, jobs: list[LeasedJob]) -> bool:
        """Runs ``jobs`` in one transaction; False when it rolled back, its jobs to run again
        one per transaction (their leases still held, and extended meanwhile)."""
        try:
            outcomes = await self._run_batch(jobs)
        except Exception as error:  # noqa: BLE001 - each job then runs and settles alone
            log.info("a batch of %d jobs rolled back (%r); they run one per transaction",
                     len(jobs), error)
            self.stats.batches_rolled_back += 1
            for job in jobs:
                if job.id in self._leased:
                    self._waiting[job.id] = job.token
            return False
        self.stats.batches += 1
        for job, outcome in zip(jobs, outcomes):
            self._leased.pop(job.id, None)
            self._waiting.pop(job.id, None)
            self._ended(job, outcome)
        return True

    async def _run_batch(self, jobs: list[LeasedJob]) -> list[str]:
        """One transaction: completes ``jobs`` under their leases and claims their keys in one
        statement, runs the bodies of those that claimed theirs in fetch order, commits. How
        each ended: ``applied``, ``duplicate`` (its key held, also by an earlier job of the
        batch) or ``fenced``. Raises (and rolls everything back) on any error, including a job
        that cannot run or a key reused with another payload: alone, the job settles as the
        per-job path settles it."""
        prints = [self._check(job, self.app.jobs[job.kind]) for job in jobs]
        async with self._job_session() as s:
            async with s.transaction():
                rows = await s.fetch(self._sql["claim_completing_many"], [
                    [job.id for job in jobs], [job.token for job in jobs],
                    [job.key for job in jobs], [job.kind for job in jobs], prints,
                    [_tokens.next() for _ in jobs],
                ])
                # The jobs' rows are locked until this transaction ends: no heartbeat needed.
                for job in jobs:
                    self._waiting.pop(job.id, None)
                unclaimed = sorted({job.key for job, row in zip(jobs, rows)
                                    if row[0] and not row[1]})
                held = {}
                if unclaimed:
                    held = {row[0]: row for row in await s.fetch(self._sql["held"], [unclaimed])}
                outcomes = []
                for job, fingerprint, row in zip(jobs, prints, rows):
                    if not row[0]:
                        outcomes.append("fenced")
                    elif row[1]:
                        await s.call(self.app.jobs[job.kind].spec.fn, **job.payload)
                        outcomes.append("applied")
                    else:
                        self._check_held(job, fingerprint, held.get(job.key))
                        outcomes.append("duplicate")
        return outcomes

    @staticmethod
    def _check_held(job: LeasedJob, fingerprint: bytes, held: Row | None) -> None:
        """A key the batch did not claim is a duplicate when its guard row holds the same
        payload's fingerprint (or none)."""
        if held is None:
            raise GuardVanished(
                f"the guard row of `{job.key}` disappeared between the conflict and its read: "
                "guard rows are being pruned while jobs run")
        if held[2] is not None and bytes(held[2]) != fingerprint:
            first = _dt.datetime.fromtimestamp(held[1] / 1e6, tz=_dt.timezone.utc)
            raise KeyReused(job.key, first)

    async def execute(self, job: LeasedJob) -> str:
        """Runs one leased job and settles it; how it ended: ``applied``, ``duplicate``,
        ``failed`` (to run again), ``dead`` or ``fenced``."""
        spec = self.app.jobs[job.kind].spec
        try:
            fingerprint = self._check(job, self.app.jobs[job.kind])
        except Exception as error:  # noqa: BLE001 - a bad job is dead-lettered, never retried
            return await self._settle(job, f"the job cannot run: {error}", fatal=True)
        for run in range(1, _TRANSIENT_RUNS + 1):
            try:
                return await self._attempt(job, spec, fingerprint)
            except _Fenced:
                log.warning("job %s: its lease was taken over; the new holder runs it", job.id)
                return "fenced"
            except KeyReused as error:
                return await self._settle(job, str(error), fatal=True)
            except Exception as error:  # noqa: BLE001 - every failure is settled
                reason = transient_reason(error)
                if reason is None:
                    log.warning("job %s (%s) failed: %r", job.id, job.key, error)
                    return await self._settle(job, _message(error), fatal=False)
                if run == _TRANSIENT_RUNS:
                    log.warning("job %s (%s) did not commit (%s) %d times; giving it back",
                                job.id, job.key, reason, run)
                    return await self._give_back(job)
                await asyncio.sleep(_native.transient_backoff(run, random.random()))
        raise AssertionError("unreachable")

    def _check(self, job: LeasedJob, defined: DefinedJob) -> bytes:
        """The payload binds to the body's parameters and the key function accepts it; the
        payload's fingerprint. Raises what makes the job impossible to run."""
        if not isinstance(job.payload, dict):
            raise TypeError(f"its payload is a JSON {type(job.payload).__name__}, not an object "
                            "of the job's arguments")
        try:
            defined.spec.signature.bind(None, **job.payload)
        except TypeError as error:
            raise TypeError(f"its payload does not bind to `{job.kind}`'s parameters: {error}") from None
        # A periodic firing's key names the schedule and the firing, not the payload.
        if defined.spec.key is not None and not job.key.startswith(FIRING_KEY_PREFIX):
            try:
                computed = defined.spec.key(**job.payload)
            except Exception as error:
                raise ValueError(f"the key function raised {error!r}") from None
            if computed != job.key:
                log.warning("job %s: stored key %s differs from its key function's %r; the "
                            "stored key is the one claimed", job.id, job.key, computed)
        return _keys.fingerprint_bytes(job.payload)

    @contextlib.asynccontextmanager
    async def _job_session(self) -> AsyncIterator[Session]:
        """A connection of the pool for one job's transaction, or for a fetch. One that ended
        without an error is kept for the next job or fetch instead of going back to the pool,
        while jobs keep coming (given back after a poll interval idle, and at shutdown): giving it
        back costs a round trip on some drivers (asyncpg's reset query, SQLAlchemy's rollback
        on return), as much as a third of a no-op job's. One that raised goes back to the pool,
        which drops it if it is broken, as does every one outside :meth:`run`. Each job still
        runs in a transaction of its own."""
        assert self._db is not None
        if self._kept:
            held, session = self._kept.pop()
        else:
            held = self._db.session()
            session = await held.__aenter__()
        try:
            yield session
        except BaseException as error:
            await held.__aexit__(type(error), error, error.__traceback__)
            raise
        if self._keeping:
            self._kept.append((held, session))
        else:
            await held.__aexit__(None, None, None)

    async def _give_back_kept(self) -> None:
        while self._kept:
            held, _ = self._kept.pop()
            try:
                await held.__aexit__(None, None, None)
            except Exception as error:  # noqa: BLE001 - the pool drops what it cannot reset
                log.debug("giving a kept connection back failed: %s", error)

    async def _attempt(self, job: LeasedJob, spec: Any, fingerprint: bytes) -> str:
        assert self._db is not None
        async with self._job_session() as s:
            async with s.transaction():
                row = await self._complete_and_claim(s, job, fingerprint)
                # The job's row is locked until this transaction ends: no heartbeat needed.
                self._waiting.pop(job.id, None)
                claimed = row[0]
                if claimed is None:
                    raise GuardVanished(
                        f"the guard row of `{job.key}` disappeared between the conflict and its "
                        "read: guard rows are being pruned while jobs run"
                    )
                if not claimed:
                    held = row[2]
                    if held is not None and bytes(held) != fingerprint:
                        first = _dt.datetime.fromtimestamp(row[1] / 1e6, tz=_dt.timezone.utc)
                        raise KeyReused(job.key, first)
                    return "duplicate"
                # A sync body runs on the session's thread, an async one here.
                await s.call(spec.fn, **job.payload)
            return "applied"

    async def _complete_and_claim(self, s: Any, job: LeasedJob, fingerprint: bytes) -> Row:
        """Completes the job under its lease and claims its key, in the open transaction: the
        claim's row (claimed, then the holding row's applied at and fingerprint). Raises
        :class:`_Fenced` when the lease no longer holds, having claimed nothing."""
        token = _tokens.next()
        if "claim_completing" in self._sql:  # PostgreSQL: one statement
            row = await s.fetchone(self._sql["claim_completing"], [
                job.key, job.kind, fingerprint, token, job.id, job.token,
            ])
            if row is None:
                raise _Fenced()
            claimed: Row = row
            return claimed
        # SQLite, under the write lock `begin immediate` took: complete, then claim, as the
        # Rust worker does.
        if not await s.execute(self._sql["complete"], [job.id, job.token]):
            raise _Fenced()
        if await s.fetchone(self._sql["claim"], [job.key, job.kind, fingerprint, token]):
            return (True, None, None)
        held = await s.fetchone(self._sql["record"], [job.key])
        if held is None:
            return (None, None, None)
        return (False, held[0], held[1])

    async def _settle(self, job: LeasedJob, message: str, fatal: bool) -> str:
        """Retries a failed attempt after the backoff, or dead-letters it when it was fatal or
        its last attempt. Fenced when the lease no longer holds."""
        assert self._db is not None
        retry = self.app.retry
        dead = fatal or job.attempt >= retry.last_attempt(job.max_attempts)
        if dead:
            statement, params = self._sql["dead"], [job.id, job.token, message]
        else:
            delay = int(retry.delay(job.attempt) * 1_000_000)
            statement, params = self._sql["retry"], [job.id, job.token, delay, message]
        try:
            async with self._db.session() as s:
                changed = await s.execute(statement, params)
        except Exception as error:  # noqa: BLE001 - the rescue settles it once its lease expires
            log.warning("job %s: settling it failed (%s); it runs again when its lease expires",
                        job.id, error)
            return "failed"
        if not changed:
            return "fenced"
        if dead:
            log.warning("job %s (%s) dead-lettered: %s", job.id, job.key, message)
        return "dead" if dead else "failed"

    async def _give_back(self, job: LeasedJob) -> str:
        """Gives back a job whose transaction did not commit for a transient reason however
        often it ran: it runs again after the retry policy's delay for its attempt, which is not
        counted (the core's ``give_back``, as the Rust worker gives it back)."""
        delay = int(self.app.retry.delay(job.attempt) * 1_000_000)
        return await self._hand_back(job, "give_back", [job.id, job.token, delay])

    async def _release(self, job: LeasedJob) -> str:
        """Gives the lease back: the job runs again now, its attempt not counted."""
        return await self._hand_back(job, "release", [job.id, job.token])

    async def _hand_back(self, job: LeasedJob, statement: str, params: list[Any]) -> str:
        """Runs the core's ``statement`` that ends the job's lease without counting its
        attempt; ``failed`` (it runs again) or ``fenced`` (the lease no longer held)."""
        assert self._db is not None
        try:
            async with self._db.session() as s:
                changed = await s.execute(self._sql[statement], params)
        except Exception as error:  # noqa: BLE001 - the rescue settles it once its lease expires
            log.warning("job %s: giving it back failed (%s)", job.id, error)
            return "failed"
        self.stats.released += bool(changed)
        self._read_head_next()
        return "failed" if changed else "fenced"

    async def _heartbeats(self) -> None:
        """Extends the leases of jobs fetched and not started, every third of a lease."""
        assert self._db is not None
        while True:
            await asyncio.sleep(self.lease / 3)
            leases = dict(self._waiting)
            if not leases:
                continue
            try:
                kept = await self._extend(leases)
            except Exception as error:  # noqa: BLE001 - the next beat tries again
                log.warning("extending leases failed: %s", error)
                continue
            # A job that started meanwhile is no longer extended (its transaction holds its
            # row, and may have completed it): only one still waiting lost its lease.
            for lost in (set(leases) - kept) & set(self._waiting):
                log.warning("job %s: its lease was lost before it started", lost)

    async def _extend(self, leases: dict[int, int]) -> set[int]:
        """Extends ``leases`` (id -> token) by a lease from now; the ids whose lease held."""
        assert self._db is not None
        micros = int(self.lease * 1_000_000)
        async with self._db.session() as s:
            if "heartbeat_many" in self._sql:
                held = [{"id": i, "token": t} for i, t in leases.items()]
                rows = await s.fetch(self._sql["heartbeat_many"], [json.dumps(held), micros])
                return {int(row[0]) for row in rows}
            # SQLite: one statement per lease, in one transaction (one write lock).
            kept = set()
            async with s.transaction():
                for job_id, token in leases.items():
                    if await s.execute(self._sql["heartbeat"], [job_id, token, micros]):
                        kept.add(job_id)
            return kept

    async def _rescues(self) -> None:
        """Gives back the jobs whose lease expired (a worker that died), or dead-letters them
        on their last attempt, as the Rust worker's rescue does."""
        every = max(min(self.lease / 2, 30.0), 0.05)
        while True:
            await asyncio.sleep(every)
            await self._rescue()

    async def _rescue(self) -> None:
        assert self._db is not None
        mine = json.dumps([f"{i}:{t}" for i, t in self._leased.items()])
        try:
            async with self._db.session() as s:
                # Of this app's kinds only: another kind's policy is its own workers'.
                rescued = await s.execute(self._sql["rescue"],
                                          [self.app.retry.max_attempts, mine,
                                           self._kinds_param()])
        except Exception as error:  # noqa: BLE001 - the next round tries again
            log.warning("rescuing expired leases failed: %s", error)
            return
        if rescued:
            log.info("gave back %d jobs whose lease expired", rescued)
            self._read_head_next()  # they wait where they were enqueued
            self._wake.set()  # no notification announces them

    async def _drain(self, running: set[asyncio.Task[Any]]) -> None:
        """Lets running jobs finish within the shutdown timeout; cancels the rest, whose
        transactions roll back, and gives their leases back."""
        if not running:
            return
        _, pending = await asyncio.wait(set(running), timeout=self.shutdown_timeout)
        if not pending:
            return
        leases = dict(self._leased)
        for task in pending:
            task.cancel()
        assert self._db is not None
        # Sync bodies run on threads and cannot be cancelled: their transactions are ended
        # (PostgreSQL) or, where they cannot be (SQLite's write lock), left to the rescue.
        stuck = await self._db.abandon()
        # A cancelled async job rolls back at once; an ended sync one when its body returns.
        await asyncio.wait(pending, timeout=None if self._db.is_async else 1.0)
        if stuck:
            log.warning("stopped: %d sync jobs still run and hold the database; their leases "
                        "expire and are rescued", len(stuck))
        else:
            for job_id, token in leases.items():
                try:
                    async with self._db.session() as s:
                        if await s.execute(self._sql["release"], [job_id, token]):
                            self.stats.released += 1
                except Exception as error:  # noqa: BLE001 - the rescue gives it back later
                    log.warning("job %s: giving it back at shutdown failed (%s)", job_id, error)
        log.info("stopped: %d jobs did not finish in %ss and were given back",
                 len(pending), self.shutdown_timeout)


def _message(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
