"""``jobguard.migrate``: the guard table, created exactly as the Rust library creates it.

Run it once before the first guard, where the worker starts: a guard on a database without
its table raises :class:`jobguard.NotMigrated`. It takes a connection or what the job-system
wrappers take as ``db=``, so a worker's start hook can pass the same object::

    await jobguard.migrate(pool)          # asyncpg pool, AsyncEngine, psycopg AsyncConnectionPool
    jobguard.migrate_sync(engine)         # Engine, psycopg ConnectionPool, a connection factory
"""

from __future__ import annotations

from typing import Any, Iterator

from . import _keys
from ._drivers import Driver, driver_for
from ._transactions import _Async, _Sync
from .errors import NotMigrated, UnsupportedConnection

DEFAULT_TABLE = "processed_jobs"

_UNDEFINED = {
    "42P01",  # undefined_table
    "42883",  # undefined_function: the claim's held function
    "42703",  # undefined_column: a table made by an older schema
}
_SQLITE_UNDEFINED = ("no such table", "no such column")


def is_not_migrated(error: BaseException) -> bool:
    """Whether a driver's error on one of jobguard's statements says its table, function or
    column is missing: asyncpg and psycopg errors by SQLSTATE, SQLite's by message, and
    SQLAlchemy's through the driver error it wraps."""
    seen: BaseException | None = error
    for _ in range(4):
        if seen is None:
            return False
        if getattr(seen, "sqlstate", None) in _UNDEFINED:
            return True
        if type(seen).__name__ == "OperationalError" and str(seen).startswith(_SQLITE_UNDEFINED):
            return True
        seen = getattr(seen, "orig", None) or seen.__cause__
    return False


def not_migrated(table: str, schema: str | None, error: BaseException) -> NotMigrated:
    """The :class:`NotMigrated` for the guard table ``table``, naming the fix."""
    name = f"{schema}.{table}" if schema else table
    return NotMigrated(
        f"the guard table `{name}` does not exist or was made by an older jobguard "
        f"({type(error).__name__}: {str(error).splitlines()[0]}); nothing was written: run "
        "`await jobguard.migrate(db)` (sync code: `jobguard.migrate_sync(db)`) once before the "
        "first guard, e.g. when the worker starts"
    )


def _migration(d: Driver, table: str, schema: str | None) -> Iterator[tuple[str, list[Any], bool]]:
    """The migration's statements in the Rust library's order. A step marked as a check reads
    the table's marker: when it is this schema's, the rest is skipped (a `create index if not
    exists` would still wait for every transaction writing the table)."""
    sql = _keys.guard_sql(d.dialect, table, schema)
    if d.dialect == "postgres":
        yield sql["migrated"], [sql["quoted"], sql["marker"]], True
        yield sql["migrate_lock"], [sql["migrate_lock_key"]], False
        yield sql["migrated"], [sql["quoted"], sql["marker"]], True
        yield sql["migrate_lock_timeout"], [], False
        for statement in sql["create"]:
            yield statement, [], False
        yield sql["mark_migrated"], [], False
    else:
        for statement in sql["create"]:
            yield statement, [], False


def _connection(db: Any) -> Driver | None:
    """The driver of ``db`` when it is a connection; ``None`` when it is a pool, an engine or
    a factory, for the wrappers' runners to open a transaction on."""
    try:
        return driver_for(db)
    except UnsupportedConnection:
        return None


async def migrate(db: Any, *, table: str = DEFAULT_TABLE, schema: str | None = None) -> None:
    """Creates the guard table (and on PostgreSQL its claim function) exactly as the Rust
    library does: the same statements, the same per-table lock and schema marker, so the two
    libraries can migrate one database in any order. Idempotent, and cheap once done (one
    read of the marker on PostgreSQL), so every worker may run it when it starts.

    ``db`` is an async connection (asyncpg, psycopg, SQLAlchemy, aiosqlite: run in its open
    transaction, as a savepoint where the driver nests, else in its own) or what the async
    wrappers take as ``db=`` (an asyncpg pool, a SQLAlchemy ``AsyncEngine``, a psycopg
    ``AsyncConnectionPool``): a connection is taken for one transaction."""
    d: Any = _connection(db)
    if d is None:
        async def body(conn: Any) -> None:
            await migrate(conn, table=table, schema=schema)

        await _Async(db).run(body)
        return
    if not d.is_async:
        raise UnsupportedConnection(f"{d.name} is synchronous: use jobguard.migrate_sync")
    steps = list(_migration(d, table, schema))
    async with d.transaction():
        for statement, params, is_check in steps:
            if is_check:
                row = await d.fetchone(statement, params)
                if row is not None and row[0]:
                    return
            else:
                await d.execute(statement, params)


def migrate_sync(db: Any, *, table: str = DEFAULT_TABLE, schema: str | None = None) -> None:
    """:func:`migrate` for sync code: ``db`` is a psycopg, SQLAlchemy (``Connection``,
    ``Session``) or sqlite3 connection, or what the sync wrappers and Celery's ``guard_db=``
    take (a SQLAlchemy ``Engine``, a psycopg ``ConnectionPool``, a function returning a new
    psycopg or sqlite3 connection)."""
    d: Any = _connection(db)
    if d is None:
        _Sync(db).run(lambda conn: migrate_sync(conn, table=table, schema=schema))
        return
    if d.is_async:
        raise UnsupportedConnection(f"{d.name} is asynchronous: use `await jobguard.migrate`")
    steps = list(_migration(d, table, schema))
    with d.transaction():
        for statement, params, is_check in steps:
            if is_check:
                row = d.fetchone(statement, params)
                if row is not None and row[0]:
                    return
            else:
                d.execute(statement, params)
