"""``jobguard.App``: Python jobs on jobguard's own queue.

Jobs are defined where the code is, and receive the connection of the transaction that
completes them and claims their key, in the user's own driver::

    app = jobguard.App(db=lambda: asyncpg.create_pool(DATABASE_URL))

    @app.job("credit", key=lambda order, account, amount: jobguard.key("credit", order))
    async def credit(conn, order, account, amount):
        await conn.execute("insert into ledger (account, amount) values ($1, $2)", account, amount)

    async with conn.transaction():          # the caller's transaction
        await credit.enqueue(conn, order="o-1", account=7, amount=500)

    await app.run_worker()                  # or: python -m jobguard worker myapp.jobs:app

A job's payload is its keyword arguments, as JSON; its key names the business operation (by
default, derived from the kind and the payload's fingerprint). The worker runs each job in one
transaction on a connection of ``db``: the statement that completes the job under its lease
and claims its key (the Rust worker's own text), the body, the commit. A key already applied
completes the job as a duplicate without calling the body.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import inspect
from typing import Any, Callable

from . import _keys
from ._enqueue import (
    DEFAULT_QUEUE, DEFAULT_QUEUE_TABLE, Enqueued, enqueue, enqueue_batch, enqueue_batch_sync,
    enqueue_sync,
)
from ._migrate import DEFAULT_TABLE
from ._periodic import DEFAULT_GRACE, Periodic
from ._pools import is_async_db
from ._queue_sql import Backoff
from ._unique import Unique
from .errors import InvalidSchedule, UnsupportedConnection

DEFAULT_MAX_ATTEMPTS = 10


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """How a job kind is run: its body, key function, queue and limits."""

    kind: str
    fn: Callable[..., Any]
    key: Callable[..., str] | None
    queue: str
    max_attempts: int
    signature: inspect.Signature
    is_async: bool
    unique: Unique | None = None
    batch: bool = False


class Job:
    """A job kind defined with ``@app.job``: call it to run the body directly, or
    ``enqueue`` it into the queue in the caller's transaction."""

    def __init__(self, app: "App", spec: JobSpec) -> None:
        self.app, self.spec = app, spec
        self.__wrapped__ = spec.fn
        self.__doc__ = spec.fn.__doc__
        self.__name__ = getattr(spec.fn, "__name__", spec.kind)

    def __call__(self, conn: Any, /, **kwargs: Any) -> Any:
        return self.spec.fn(conn, **kwargs)

    def _job_key(self, payload: dict[str, Any]) -> str | None:
        if self.spec.key is None:
            return None
        key = self.spec.key(**payload)
        if not isinstance(key, str):
            raise _keys.InvalidKey(
                f"the key function of `{self.spec.kind}` returned a {type(key).__name__}: "
                "return jobguard.key(...)"
            )
        return key

    def _args(
        self, kwargs: dict[str, Any], delay: float, run_at: _dt.datetime | None,
        unique: Unique | None = None,
    ) -> dict[str, Any]:
        self.spec.signature.bind(None, **kwargs)  # a payload that cannot bind is refused here
        if run_at is not None:
            if run_at.tzinfo is None:
                raise ValueError("run_at must be timezone-aware (e.g. datetime.now(timezone.utc))")
            delay = max(delay, (run_at - _dt.datetime.now(_dt.timezone.utc)).total_seconds(), 0.0)
        return dict(
            kind=self.spec.kind, payload=kwargs, key=self._job_key(kwargs),
            queue=self.spec.queue, max_attempts=self.spec.max_attempts, delay=delay,
            table=self.app.table, schema=self.app.schema,
            unique=_unique_of(unique if unique is not None else self.spec.unique),
        )

    async def enqueue(
        self, conn: Any, /, *, delay: float = 0.0, run_at: _dt.datetime | None = None,
        unique: Unique | None = None, **kwargs: Any,
    ) -> Enqueued:
        """Enqueues this job with ``kwargs`` as its arguments, inside the transaction open on
        ``conn`` (asyncpg, psycopg async, SQLAlchemy async, aiosqlite): visible to workers when
        it commits, never enqueued when it rolls back. A key a waiting or running job holds
        returns that job (``inserted=False``). ``delay`` (seconds) or ``run_at`` (an aware
        datetime) schedules it later. ``unique`` (a :class:`jobguard.Unique`) overrides the
        job's unique policy for this call. On a connection that commits each statement
        (asyncpg outside ``transaction()``, psycopg with ``autocommit=True``), a transaction
        of its own, committed on return."""
        args = self._args(kwargs, delay, run_at, unique)
        return await enqueue(conn, args.pop("kind"), args.pop("payload"), **args)

    def enqueue_sync(
        self, conn: Any, /, *, delay: float = 0.0, run_at: _dt.datetime | None = None,
        unique: Unique | None = None, **kwargs: Any,
    ) -> Enqueued:
        """:meth:`enqueue` on a psycopg, SQLAlchemy or sqlite3 connection."""
        args = self._args(kwargs, delay, run_at, unique)
        return enqueue_sync(conn, args.pop("kind"), args.pop("payload"), **args)

    async def enqueue_many(
        self, conn: Any, jobs: list[dict[str, Any]], /, *, delay: float = 0.0,
    ) -> list[Enqueued]:
        """Enqueues one job per dict of arguments in ``jobs``, in the caller's transaction, as
        one by one in key order (so that two transactions enqueueing the same keys wait for
        each other rather than deadlock), on PostgreSQL in one statement for the jobs a live
        job's key does not hold. On a connection that commits each statement, in one
        transaction of their own: all of them or none."""
        prepared = [self._args(kwargs, delay, None) for kwargs in jobs]
        return await enqueue_batch(conn, prepared, table=self.app.table, schema=self.app.schema)

    def enqueue_many_sync(
        self, conn: Any, jobs: list[dict[str, Any]], /, *, delay: float = 0.0,
    ) -> list[Enqueued]:
        """:meth:`enqueue_many` on a psycopg, SQLAlchemy or sqlite3 connection."""
        prepared = [self._args(kwargs, delay, None) for kwargs in jobs]
        return enqueue_batch_sync(conn, prepared, table=self.app.table, schema=self.app.schema)


class App:
    """The job kinds of a Python service on jobguard's queue, and the pool its workers run on.

    ``db`` is the pool the worker takes connections from. Async jobs (``async def``): an
    asyncpg pool, a psycopg 3 ``AsyncConnectionPool`` or a SQLAlchemy ``AsyncEngine``; sync
    jobs (``def``, run on threads): a psycopg 3 ``ConnectionPool``, a SQLAlchemy ``Engine``
    (PostgreSQL or SQLite), or a function returning a new sqlite3 connection. A function
    returning a pool or engine is called when the worker starts, so that a module can define the
    app before an event loop runs. A job whose kind of body does not match the driver is
    refused when it is defined (:class:`UnsupportedConnection`). ``table`` and
    ``guard_table`` are the queue's jobs table and the guard table, shared with Rust workers.
    ``retry`` is the worker's retry policy (the Rust worker's defaults)."""

    def __init__(
        self, db: Any, *, table: str = DEFAULT_QUEUE_TABLE, guard_table: str = DEFAULT_TABLE,
        schema: str | None = None, guard_schema: str | None = None,
        retry: Backoff | None = None,
    ) -> None:
        self.db = db
        self.table, self.schema = table, schema
        self.guard_table, self.guard_schema = guard_table, guard_schema
        self.retry = retry or Backoff()
        self.jobs: dict[str, Job] = {}
        self.schedules: list[Periodic] = []
        # Whether db is a pool of an async driver; None for a factory, known once called.
        self.is_async = is_async_db(db)

    def job(
        self, kind: str, *, key: Callable[..., str] | None = None, queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS, unique: Unique | None = None,
        batch: bool = False,
    ) -> Callable[[Callable[..., Any]], Job]:
        """Defines the job kind ``kind``, run by ``fn(conn, **payload)``.

        ``key(**payload)`` names the business operation (``jobguard.key(kind, ...)``); without
        it the key is derived from the kind and the payload's fingerprint. ``max_attempts``
        bounds its attempts (as does the worker's retry policy, whichever is less). ``unique``
        (a :class:`jobguard.Unique`) is its unique-job policy, as the Rust queue's. ``batch``
        lets a worker with ``batch_size`` above 1 run several of its jobs in one transaction
        (docs/batches.md): for jobs that write rows of their own, never for jobs that update
        the same rows."""
        _keys.key(kind, "x")  # a kind follows the key rules
        _keys.key(queue, "x")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an integer >= 1, not {max_attempts!r}")
        _unique_of(unique)
        if not isinstance(batch, bool):
            raise TypeError(f"batch must be True or False, not {batch!r}")

        def define(fn: Callable[..., Any]) -> Job:
            if kind in self.jobs:
                raise ValueError(f"job kind `{kind}` is already defined on this app")
            is_async = inspect.iscoroutinefunction(fn)
            self.check_driver(kind, is_async)
            signature = inspect.signature(fn)
            if not signature.parameters:
                raise TypeError(f"job `{kind}` must take the connection as its first parameter")
            job = Job(self, JobSpec(kind, fn, key, queue, max_attempts, signature, is_async,
                                    unique, batch))
            self.jobs[kind] = job
            return job

        return define

    def check_driver(self, kind: str, is_async: bool, pool_is_async: bool | None = None) -> None:
        """Refuses a job whose body does not match the pool's driver (sync body on an async
        pool, or the reverse); ``pool_is_async`` once a factory's pool is known."""
        pool_is_async = self.is_async if pool_is_async is None else pool_is_async
        if pool_is_async is None or pool_is_async == is_async:
            return
        if pool_is_async:
            raise UnsupportedConnection(
                f"job `{kind}` is a plain function but the app's pool is asynchronous: define "
                "it with `async def`, it receives the async connection (or give the app a sync "
                "pool: psycopg ConnectionPool, SQLAlchemy Engine, a sqlite3 factory)"
            )
        raise UnsupportedConnection(
            f"job `{kind}` is `async def` but the app's pool is synchronous: define it with "
            "`def` (it runs on a thread with the sync connection), or give the app an async "
            "pool (asyncpg, psycopg AsyncConnectionPool, SQLAlchemy AsyncEngine)"
        )

    async def migrate(self) -> None:
        """Creates the queue's tables and the guard table on ``db`` when missing, with the
        statements, lock and schema marker of the Rust ``Worker::migrate``: a table made here
        is the Rust worker's and the ``jobguard`` CLI's, and the reverse. Idempotent, and one
        read once done on PostgreSQL, so every worker may run it at start."""
        from ._migrate_queue import migrate_tables, migrate_tables_sync
        from ._pools import open_database

        db = await open_database(self.db)
        try:
            async with db.session() as s:
                await s.call(
                    migrate_tables if db.is_async else migrate_tables_sync,
                    table=self.table, schema=self.schema, guard_table=self.guard_table,
                    guard_schema=self.guard_schema,
                )
        finally:
            await db.close()

    def migrate_sync(self) -> None:
        """:meth:`migrate` from sync code, for an app on a sync driver (psycopg
        ``ConnectionPool``, SQLAlchemy ``Engine``, a sqlite3 connection factory)."""
        import asyncio

        if self.is_async:
            raise UnsupportedConnection(
                "the app's pool is asynchronous: use `await app.migrate()`"
            )
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(self.migrate())
            return
        raise UnsupportedConnection(
            "app.migrate_sync() was called inside a running event loop: use `await app.migrate()`"
        )

    def periodic(
        self, cron: str, *, name: str, zone: str = "UTC", missed: str = "skip",
        payload: dict[str, Any] | None = None, queue: str | None = None, kind: str | None = None,
        grace: float | None = None, firing_field: str | None = None,
    ) -> Callable[[Job], Job]:
        """Enqueues the job at every firing of ``cron`` (``"0 3 * * *"``; six fields with
        seconds first), exactly once per firing however many workers (Python or Rust) run the
        schedule ``name``: put it above ``@app.job``. The worker runs it (see
        :mod:`jobguard._periodic`); ``payload`` is the job's keyword arguments, ``zone`` an IANA
        time zone, ``missed`` what to do with firings missed while no worker ran (``skip``,
        ``latest``, ``all``, ``all:N``), ``queue`` the job's queue (the job's own by default),
        ``firing_field`` a payload field set to each firing's time.

        Called with ``kind=`` instead of as a decorator, it schedules a job kind defined
        elsewhere on this app. Bad input is :class:`InvalidSchedule` naming the schedule: here
        for the cron expression, zone, policy and payload rules, when the worker starts for a
        kind the app does not define."""
        def schedule(kind: str, job_queue: str, max_attempts: int) -> Periodic:
            periodic = Periodic(
                name, cron, kind, dict(payload or {}), zone=zone, queue=queue or job_queue,
                missed=missed, grace=DEFAULT_GRACE if grace is None else grace,
                max_attempts=max_attempts, firing_field=firing_field,
            )
            if any(s.name == name for s in self.schedules):
                raise InvalidSchedule(name, "two schedules have this name; give each its own")
            self.schedules.append(periodic)
            return periodic

        if kind is not None:
            schedule(kind, queue or DEFAULT_QUEUE, DEFAULT_MAX_ATTEMPTS)

        def define(job: Job) -> Job:
            if not isinstance(job, Job):
                raise InvalidSchedule(name, "@app.periodic schedules a job: put it above "
                                      "@app.job(...)")
            periodic = schedule(job.spec.kind, job.spec.queue, job.spec.max_attempts)
            try:
                job.spec.signature.bind(None, **periodic.payload_at(0))
            except TypeError as error:
                self.schedules.remove(periodic)
                raise InvalidSchedule(name, f"the payload does not bind to `{job.spec.kind}`'s "
                                      f"parameters: {error}") from None
            return job

        return define

    async def run_worker(self, **options: Any) -> Any:
        """Runs a worker for this app's kinds until SIGTERM or SIGINT (or ``stop``); see
        :class:`jobguard.worker.Worker` for the options. Returns its stats."""
        from .worker import Worker

        return await Worker(self, **options).run()


def _unique_of(unique: Any) -> Unique | None:
    if unique is not None and not isinstance(unique, Unique):
        raise TypeError(f"unique must be a jobguard.Unique, not {type(unique).__name__}")
    return unique
