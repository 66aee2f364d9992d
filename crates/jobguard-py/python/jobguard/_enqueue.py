"""``jobguard.enqueue``: a job for jobguard's own queue, in the caller's transaction.

A Python web app hands work to Rust workers transactionally: the job row commits with the
request's writes, or neither exists. The statements are the Rust ``Queue::enqueue_tx``'s own,
from the core, and so is the rule: one live (available or running) job per key, enforced by the
queue's unique index; enqueueing a key a live job holds returns that job, and a live job with
another kind or payload under the key is :class:`KeyReused`. The payload rules (at most
``MAX_PAYLOAD_BYTES`` of JSON, no NUL character) are the core's too, checked before anything is
written: a payload that breaks them is :class:`PayloadError`.

The queue's tables are created by ``App.migrate`` (the Rust queue's statements, from the core) or
by the Rust side (any ``jobguard worker`` or ``Queue`` migrates them on start); enqueueing before
they exist is :class:`NotMigrated`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any, Iterator, Mapping, Sequence

from . import _keys
from ._drivers import Driver, Row, driver_for
from ._migrate import is_not_migrated
from ._unique import Unique, resolve, run_async, run_sync, steps
from .errors import KeyReused, NotInTransaction, NotMigrated, UnsupportedConnection

DEFAULT_QUEUE = "default"
DEFAULT_QUEUE_TABLE = "jobguard_jobs"
DEFAULT_MAX_ATTEMPTS = 10
# A live job holding the key can finish between the insert and the read; then the insert
# succeeds on the next round (as in Rust).
_ROUNDS = 3


@dataclasses.dataclass(frozen=True)
class Enqueued:
    """The job's id, and whether this call inserted it (false: a job held the key). Under a
    unique policy, ``replaced`` says the enqueue replaced the payload and run time of the
    waiting job that held the key, and ``existing_state`` the state of the job that held it."""

    id: int
    inserted: bool
    replaced: bool = False
    existing_state: str | None = None


class _Job:
    def __init__(
        self, d: Driver, kind: str, payload: Any, key: str | None, queue: str,
        max_attempts: int, delay: float, table: str, schema: str | None,
    ) -> None:
        _keys.key(kind, "x")  # the kind's rules, as a key's kind
        _keys.key(queue, "x")  # a queue is named by the same rules
        if key is None:
            # The same kind and payload are the same operation.
            key = _keys.key(kind, _keys.fingerprint(payload))
        elif not isinstance(key, str):
            raise _keys.InvalidKey(f"the job key is a {type(key).__name__}: build it with jobguard.key")
        else:
            _keys.parse_key(key)
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an integer >= 1, not {max_attempts!r}")
        if delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, not {delay!r}")
        self.kind, self.key, self.queue = kind, key, queue
        self.text = _keys.to_json(payload)
        _keys.check_job_payload(key, self.text)
        self.value = json.loads(self.text)
        self.sql = _keys.queue_sql(d.dialect, table, schema)
        self.params = [kind, key, queue, self.text, max_attempts, int(delay * 1_000_000)]

    def held(self, d: Driver, row: tuple[Any, ...]) -> Enqueued:
        job_id, kind, payload = row
        if kind != self.kind or d.decode_json(payload) != self.value:
            raise KeyReused(
                self.key, None,
                message=f"job key `{self.key}` is held by a job that is waiting or running with "
                "another payload or kind: nothing was enqueued; give different work its own "
                "key, or wait for that job to finish",
            )
        return Enqueued(int(job_id), False)

    def raise_if_not_migrated(self, error: Exception, table: str) -> None:
        if is_not_migrated(error):
            raise NotMigrated(
                f"the queue table `{table}` does not exist or was made by an older jobguard; "
                "nothing was enqueued: run `await app.migrate()` of a jobguard.App (sync code: "
                "`app.migrate_sync()`), or start the worker with `python -m jobguard worker "
                "module:app --migrate`, on this database once first"
            ) from error

    def lost(self) -> Exception:
        return RuntimeError(f"the live job of `{self.key}` kept changing while enqueueing")


async def enqueue(
    conn: Any, kind: str, payload: Any, key: str | None = None, queue: str = DEFAULT_QUEUE, *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS, delay: float = 0.0,
    table: str = DEFAULT_QUEUE_TABLE, schema: str | None = None,
    unique: Unique | None = None,
) -> Enqueued:
    """Enqueues a job of ``kind`` into jobguard's queue inside the transaction open on
    ``conn`` (asyncpg, psycopg async, SQLAlchemy async, aiosqlite), for Rust workers to run.

    Visible to workers when the transaction commits; nothing is enqueued if it rolls back. On a
    connection that commits each statement (asyncpg outside ``transaction()``, psycopg with
    ``autocommit=True``) the enqueue is a transaction of its own, committed on return.
    ``key`` names the business operation (default: derived from ``kind`` and the payload's
    fingerprint); a key an available or running job holds returns that job
    (``inserted=False``). ``delay`` is in seconds, by the database clock. A payload over
    ``MAX_PAYLOAD_BYTES`` of JSON or with a NUL character raises :class:`PayloadError`, and
    nothing is written. ``unique`` (a :class:`jobguard.Unique`) enqueues under a unique-job
    policy, as the Rust queue does.
    """
    d: Any = driver_for(conn)
    if not d.is_async:
        raise UnsupportedConnection(f"{d.name} is synchronous: use jobguard.enqueue_sync")
    own = own_transaction(d)
    job = _Job(d, kind, payload, key, queue, max_attempts, delay, table, schema)
    if unique is not None:
        resolve(job, unique, delay)
        try:
            # The policy's steps read, then write: on their own, in one transaction of theirs.
            async with d.transaction() if own else contextlib.nullcontext():
                done = await run_async(d, steps(job, unique, d.dialect, table, schema,
                                                d.encode_json, d.decode_json))
        except Exception as error:
            job.raise_if_not_migrated(error, table)
            raise
        return Enqueued(**dataclasses.asdict(done))
    # On PostgreSQL the insert also wakes idle workers when it inserted: one round trip. On a
    # connection that commits each statement it is the enqueue's whole transaction.
    insert = job.sql.get("enqueue_notifying", job.sql["enqueue"])
    for _ in range(_ROUNDS):
        try:
            row = await d.fetchone(insert, job.params)
        except Exception as error:
            job.raise_if_not_migrated(error, table)
            raise
        if row is not None:
            return Enqueued(int(row[0]), True)
        held = await d.fetchone(job.sql["live_job"], [job.key])
        if held is not None:
            return job.held(d, held)
    raise job.lost()


class _Batch:
    """What :func:`enqueue_batch` and :func:`enqueue_batch_sync` do with ``entries`` (the
    keyword arguments of :func:`enqueue`, ``kind`` and ``payload`` among them), whatever runs
    the statements: on PostgreSQL, every entry without a unique policy checked, then those jobs
    in one statement, each key once and the keys sorted, so that two batches sharing keys wait
    for each other in the same order; then the rest (on SQLite, every entry), one by one in key
    order, each checked as :func:`enqueue` checks it."""

    def __init__(self, d: Driver, entries: Sequence[Mapping[str, Any]], table: str,
                 schema: str | None) -> None:
        self.entries, self.table = entries, table
        self.order = sorted(range(len(entries)), key=lambda i: entries[i].get("key") or "")
        self.sql = _keys.queue_sql(d.dialect, table, schema)
        self.jobs: dict[int, _Job] = {}
        if "enqueue_many_notifying" in self.sql:
            for i in self.order:
                e = entries[i]
                if e.get("unique") is None:
                    self.jobs[i] = _Job(d, e["kind"], e["payload"], e.get("key"),
                                        e.get("queue", DEFAULT_QUEUE),
                                        e.get("max_attempts", DEFAULT_MAX_ATTEMPTS),
                                        e.get("delay", 0.0), table, schema)
        self.first: dict[str, int] = {}
        for i, job in self.jobs.items():
            self.first.setdefault(job.key, i)
        self.out: list[Enqueued | None] = [None] * len(entries)

    def insert(self) -> tuple[str, list[Any]] | None:
        """The one statement for the jobs without a policy, each key once; None when none."""
        if not self.first:
            return None
        batch = sorted(self.first.values(), key=lambda i: self.jobs[i].key)
        columns = [list(column) for column in zip(*(self.jobs[i].params for i in batch))]
        return self.sql["enqueue_many_notifying"], [*columns, [0] * len(batch)]

    def inserted(self, rows: list[Row]) -> None:
        for job_id, key in rows:
            self.out[self.first[key]] = Enqueued(int(job_id), True)

    def failed(self, error: Exception) -> None:
        next(iter(self.jobs.values())).raise_if_not_migrated(error, self.table)

    def rest(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Each entry the statement did not insert, as :func:`enqueue`'s arguments."""
        for i in self.order:
            if self.out[i] is None:
                yield i, {k: v for k, v in self.entries[i].items() if k not in ("table", "schema")}


async def enqueue_batch(
    conn: Any, entries: Sequence[Mapping[str, Any]], table: str = DEFAULT_QUEUE_TABLE,
    schema: str | None = None,
) -> list[Enqueued]:
    """Enqueues each entry (the keyword arguments of :func:`enqueue`, ``kind`` and ``payload``
    among them) as :func:`enqueue` would one by one in key order, in the transaction open on
    ``conn`` (or one of its own on a connection that commits each statement): what each got, in
    the order given. On PostgreSQL the jobs without a unique policy go in one statement, which
    notifies the queues that received jobs; a key a live job held, a key's later entries and
    jobs under a policy then go one by one, as :func:`enqueue` settles them. SQLite takes them
    one by one."""
    d: Any = driver_for(conn)
    if not d.is_async:
        raise UnsupportedConnection(f"{d.name} is synchronous: use enqueue_many_sync")
    if own_transaction(d):
        async with d.transaction():
            return await enqueue_batch(conn, entries, table, schema)
    batch = _Batch(d, entries, table, schema)
    insert = batch.insert()
    if insert is not None:
        try:
            batch.inserted(await d.fetchall(*insert))
        except Exception as error:
            batch.failed(error)
            raise
    for i, e in batch.rest():
        batch.out[i] = await enqueue(conn, e.pop("kind"), e.pop("payload"), table=table,
                                     schema=schema, **e)
    return batch.out  # type: ignore[return-value]


def enqueue_batch_sync(
    conn: Any, entries: Sequence[Mapping[str, Any]], table: str = DEFAULT_QUEUE_TABLE,
    schema: str | None = None,
) -> list[Enqueued]:
    """:func:`enqueue_batch` on a psycopg, SQLAlchemy or sqlite3 connection."""
    d: Any = driver_for(conn)
    if d.is_async:
        raise UnsupportedConnection(f"{d.name} is asynchronous: use `await enqueue_many`")
    if own_transaction(d):
        with d.transaction():
            return enqueue_batch_sync(conn, entries, table, schema)
    batch = _Batch(d, entries, table, schema)
    insert = batch.insert()
    if insert is not None:
        try:
            batch.inserted(d.fetchall(*insert))
        except Exception as error:
            batch.failed(error)
            raise
    for i, e in batch.rest():
        batch.out[i] = enqueue_sync(conn, e.pop("kind"), e.pop("payload"), table=table,
                                    schema=schema, **e)
    return batch.out  # type: ignore[return-value]


def enqueue_sync(
    conn: Any, kind: str, payload: Any, key: str | None = None, queue: str = DEFAULT_QUEUE, *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS, delay: float = 0.0,
    table: str = DEFAULT_QUEUE_TABLE, schema: str | None = None,
    unique: Unique | None = None,
) -> Enqueued:
    """:func:`enqueue` on a psycopg, SQLAlchemy or sqlite3 connection."""
    d: Any = driver_for(conn)
    if d.is_async:
        raise UnsupportedConnection(f"{d.name} is asynchronous: use `await jobguard.enqueue`")
    own = own_transaction(d)
    job = _Job(d, kind, payload, key, queue, max_attempts, delay, table, schema)
    if unique is not None:
        resolve(job, unique, delay)
        try:
            with d.transaction() if own else contextlib.nullcontext():
                done = run_sync(d, steps(job, unique, d.dialect, table, schema,
                                         d.encode_json, d.decode_json))
        except Exception as error:
            job.raise_if_not_migrated(error, table)
            raise
        return Enqueued(**dataclasses.asdict(done))
    # On PostgreSQL the insert also wakes idle workers when it inserted: one round trip.
    insert = job.sql.get("enqueue_notifying", job.sql["enqueue"])
    for _ in range(_ROUNDS):
        try:
            row = d.fetchone(insert, job.params)
        except Exception as error:
            job.raise_if_not_migrated(error, table)
            raise
        if row is not None:
            return Enqueued(int(row[0]), True)
        held = d.fetchone(job.sql["live_job"], [job.key])
        if held is not None:
            return job.held(d, held)
    raise job.lost()


def own_transaction(d: Driver) -> bool:
    """Whether an enqueue on ``d`` is a transaction of its own: true on a connection that
    commits each statement (asyncpg outside ``transaction()``, psycopg with
    ``autocommit=True``), where the job is committed, and workers woken, when the call returns.
    Any other connection must have a transaction open, which the job then commits or rolls
    back with: :class:`NotInTransaction` (nothing written) when it has none, or when a savepoint
    is open in it."""
    if d.commits_each_statement():
        return True
    try:
        d.check()
    except NotInTransaction as error:
        raise NotInTransaction(
            f"{error}; or, to enqueue on its own, pass a connection that commits each statement "
            "(asyncpg outside a transaction, psycopg with autocommit=True)"
        ) from None
    return False
