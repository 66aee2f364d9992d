"""The guard table migrated once per process and database, before a framework's first job.

The job-system wrappers (``jobguard.celery``, ``jobguard.arq``, ``jobguard.taskiq``,
``jobguard.dramatiq``, ``jobguard.rq``) call
:func:`migrate_once` / :func:`migrate_once_sync` with their ``db=`` before each guarded run. The
first call in a process runs :func:`jobguard.migrate` on that object (on PostgreSQL one read of
the schema marker once the table is there); later calls return at once. So a worker started on
a fresh database applies its first job instead of failing it with ``NotMigrated``.

When the table is missing and cannot be created (the database user may not create tables, the
database is read-only), the call raises :class:`jobguard.NotMigrated`, whose one-line message
names the cause and the fix, and logs it once per process at error on ``jobguard``. The
wrappers count ``NotMigrated`` as a failure that may pass (an operator runs the migration): the
job is retried with its backoff, and reported once its retries are spent. A failure that may
pass by itself (a lost connection, a lock timeout) is raised as it is, for the same retries.
Nothing is remembered after a failure: the next job tries again.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Awaitable, Callable, TypeVar

from ._migrate import migrate, migrate_sync
from ._retry import transient_reason
from .errors import NotMigrated

__all__ = [
    "cannot_migrate", "migrate_once", "migrate_once_sync", "run_migrated", "run_migrated_sync",
]

log = logging.getLogger("jobguard")
T = TypeVar("T")


class _Migrated:
    """The (db, table) pairs this process migrated: weakly keyed by the db object where it
    allows (so a pool that is closed and dropped is forgotten), by its id otherwise."""

    def __init__(self) -> None:
        self._weak: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
        self._strong: dict[int, tuple[Any, set[str]]] = {}
        self._reported: set[tuple[int, str]] = set()
        self._lock = threading.Lock()

    def _tables(self, db: Any, create: bool) -> set[str] | None:
        try:
            tables = self._weak.get(db)
            if tables is None and create:
                tables = self._weak.setdefault(db, set())
            return tables
        except TypeError:  # not weakly referenceable, or unhashable
            entry = self._strong.get(id(db))
            if entry is None and create:
                entry = self._strong.setdefault(id(db), (db, set()))
            return None if entry is None else entry[1]

    def done(self, db: Any, table: str) -> bool:
        with self._lock:
            tables = self._tables(db, create=False)
            return tables is not None and table in tables

    def mark(self, db: Any, table: str) -> None:
        with self._lock:
            tables = self._tables(db, create=True)
            assert tables is not None
            tables.add(table)
            self._reported.discard((id(db), table))

    def forget(self, db: Any, table: str) -> None:
        with self._lock:
            tables = self._tables(db, create=False)
            if tables is not None:
                tables.discard(table)

    def first_report(self, db: Any, table: str) -> bool:
        """True the first time a failure to migrate ``db`` is reported in this process."""
        with self._lock:
            seen = (id(db), table) in self._reported
            self._reported.add((id(db), table))
            return not seen


_migrated = _Migrated()


def cannot_migrate(table: str, error: BaseException) -> NotMigrated:
    """The one-line :class:`NotMigrated` for a migration that failed for good."""
    cause = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return NotMigrated(
        f"the guard table `{table}` is not migrated and this worker could not create it "
        f"({type(error).__name__}: {cause}): run `jobguard.migrate_sync(db)` or "
        "`await jobguard.migrate(db)` once as a database user that may create tables, or grant "
        "this one CREATE on the schema; until then guarded jobs are retried, then reported "
        "and not applied"
    )


def _failed(db: Any, table: str, error: BaseException) -> BaseException:
    if transient_reason(error) is not None:
        return error
    not_migrated = cannot_migrate(table, error)
    if _migrated.first_report(db, table):
        log.error("%s", not_migrated)
    return not_migrated


async def migrate_once(db: Any, table: str) -> None:
    """Migrates ``db`` (what an async wrapper takes as ``db=``) once per process; see the
    module."""
    if _migrated.done(db, table):
        return
    try:
        await migrate(db, table=table)
    except Exception as error:
        failure = _failed(db, table, error)
        if failure is error:
            raise
        raise failure from error
    _migrated.mark(db, table)


def migrate_once_sync(db: Any, table: str) -> None:
    """:func:`migrate_once` for a sync ``db=`` (Celery's ``guard_db=``)."""
    if _migrated.done(db, table):
        return
    try:
        migrate_sync(db, table=table)
    except Exception as error:
        failure = _failed(db, table, error)
        if failure is error:
            raise
        raise failure from error
    _migrated.mark(db, table)


async def run_migrated(db: Any, table: str, call: Callable[[], Awaitable[T]]) -> T:
    """``await call()`` after :func:`migrate_once`; a guard that still finds the table
    missing (it was dropped since) makes the next job migrate again."""
    await migrate_once(db, table)
    try:
        return await call()
    except NotMigrated:
        _migrated.forget(db, table)
        raise


def run_migrated_sync(db: Any, table: str, call: Callable[[], T]) -> T:
    """:func:`run_migrated` for sync code."""
    migrate_once_sync(db, table)
    try:
        return call()
    except NotMigrated:
        _migrated.forget(db, table)
        raise
