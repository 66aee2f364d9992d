"""The queue's tables, created from Python exactly as the Rust ``Queue::migrate`` creates them.

``App.migrate`` runs this and :func:`jobguard.migrate` (the guard table) on the app's own
database, so a Python service needs no Rust binary before its first job. The statements are the
core's (``jobguard_core::sql::{postgres, sqlite}::queue::create``), the list the Rust queue
runs; on PostgreSQL under the same per-table advisory lock and with the same schema marker left
as the table's comment, so a table either side made is migrated for the other, and any number
of Python and Rust workers may migrate at once.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator

from . import _native
from ._drivers import Driver, driver_for
from ._migrate import migrate, migrate_sync
from .errors import InvalidName, UnsupportedConnection


@functools.lru_cache(maxsize=32)
def _queue_migration(dialect: str, table: str, schema: str | None) -> dict[str, Any]:
    return _native.queue_migration(dialect, table, schema)


def queue_migration(dialect: str, table: str, schema: str | None = None) -> dict[str, Any]:
    """The core's migration of the jobs table ``table`` for ``dialect``: ``create`` and, on
    PostgreSQL, the marker and lock statements; on SQLite, which statements are ``optional``."""
    try:
        return _queue_migration(dialect, table, schema)
    except ValueError as error:
        raise InvalidName(str(error)) from None


def _steps(d: Driver, table: str, schema: str | None) -> Iterator[tuple[str, list[Any], str]]:
    return migration_steps(d.dialect, queue_migration(d.dialect, table, schema))


def migration_steps(dialect: str, sql: dict[str, Any]) -> Iterator[tuple[str, list[Any], str]]:
    """The steps of a migration the core describes (``sql``, as ``_native.queue_migration``
    returns it), each ``(statement, params, how)``: ``check`` reads the table's marker (the
    rest is skipped when it is this schema's), ``optional`` may fail with `duplicate column
    name` (SQLite has no ``add column if not exists``), ``run`` runs. Run in one transaction."""
    if dialect == "postgres":
        yield sql["migrated"], [sql["quoted"], sql["marker"]], "check"
        yield sql["migrate_lock"], [sql["migrate_lock_key"]], "run"
        yield sql["migrated"], [sql["quoted"], sql["marker"]], "check"
        yield sql["migrate_lock_timeout"], [], "run"
        for statement in sql["create"]:
            yield statement, [], "run"
        yield sql["mark_migrated"], [], "run"
    else:
        optional = sql.get("optional") or [False] * len(sql["create"])
        for statement, skippable in zip(sql["create"], optional):
            yield statement, [], "optional" if skippable else "run"


def _duplicate_column(error: BaseException) -> bool:
    orig = getattr(error, "orig", None) or error  # SQLAlchemy wraps the driver's error
    return "duplicate column name" in str(orig)


async def migrate_queue(conn: Any, *, table: str, schema: str | None = None) -> None:
    """Creates the queue's tables on an async connection, in its open transaction or one of
    its own."""
    d: Any = driver_for(conn)
    if not d.is_async:
        raise UnsupportedConnection(f"{d.name} is synchronous: use migrate_queue_sync")
    steps = list(_steps(d, table, schema))
    async with d.transaction():
        for statement, params, how in steps:
            if how == "check":
                row = await d.fetchone(statement, params)
                if row is not None and row[0]:
                    return
                continue
            try:
                await d.execute(statement, params)
            except Exception as error:
                if how != "optional" or not _duplicate_column(error):
                    raise


def migrate_queue_sync(conn: Any, *, table: str, schema: str | None = None) -> None:
    """:func:`migrate_queue` on a sync connection."""
    d: Any = driver_for(conn)
    if d.is_async:
        raise UnsupportedConnection(f"{d.name} is asynchronous: use migrate_queue")
    steps = list(_steps(d, table, schema))
    with d.transaction():
        for statement, params, how in steps:
            if how == "check":
                row = d.fetchone(statement, params)
                if row is not None and row[0]:
                    return
                continue
            try:
                d.execute(statement, params)
            except Exception as error:
                if how != "optional" or not _duplicate_column(error):
                    raise


async def migrate_tables(conn: Any, *, table: str, schema: str | None, guard_table: str,
                         guard_schema: str | None) -> None:
    """The queue's tables, then the guard table, on an async connection."""
    await migrate_queue(conn, table=table, schema=schema)
    await migrate(conn, table=guard_table, schema=guard_schema)


def migrate_tables_sync(conn: Any, *, table: str, schema: str | None, guard_table: str,
                        guard_schema: str | None) -> None:
    """:func:`migrate_tables` on a sync connection (run on the worker's thread for it)."""
    migrate_queue_sync(conn, table=table, schema=schema)
    migrate_sync(conn, table=guard_table, schema=guard_schema)
