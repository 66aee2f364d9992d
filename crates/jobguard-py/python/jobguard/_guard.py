"""The guard on the caller's own connection, inside the transaction the caller opened.

One statement claims the key: on PostgreSQL the claim function the Rust library creates,
``select * from <table>_claim(...)``; on SQLite ``insert ... on conflict do nothing
returning``. A concurrent delivery of the same key waits on the primary key until this
transaction ends, then is a duplicate if it committed, or claims the key if it rolled back.
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import Any

from . import _keys
from ._drivers import Driver, driver_for
from .errors import GuardVanished, KeyReused, NotApplied, UnsupportedConnection
from .metrics import record_outcome

DEFAULT_TABLE = "processed_jobs"
_UNSET = object()


def _micros(value: int | None) -> _dt.datetime | None:
    if value is None:
        return None
    return _dt.datetime.fromtimestamp(value / 1_000_000, tz=_dt.timezone.utc)


class Guard:
    """The claim of one key in the caller's transaction.

    ``applied`` is true when this delivery holds the key: do the effect on the same
    connection, and it commits with the guard row. ``duplicate`` is true when an earlier
    delivery applied it: skip the effect; ``first_applied_at`` and ``result`` are what it left.
    """

    def __init__(self, driver: Driver, key: str, payload: Any, table: str, schema: str | None):
        self._driver = driver
        self.key = key
        self.kind = _keys.kind_of(key)
        self._fingerprint = None if payload is None else _keys.fingerprint_bytes(payload)
        self._sql = _keys.guard_sql(driver.dialect, table, schema)
        self.applied = False
        self.first_applied_at: _dt.datetime | None = None
        self.result: Any = None
        self._result: Any = _UNSET

    @property
    def duplicate(self) -> bool:
        """True when an earlier delivery applied the key."""
        return not self.applied

    def set_result(self, result: Any) -> None:
        """Stores ``result`` (JSON) in the guard row when the block ends without an error, so
        that every later delivery reads it as ``g.result``."""
        if not self.applied:
            raise NotApplied(self.key)
        self._encoded = _keys.to_json(result, "result")
        self._result = result

    def _claim_params(self) -> list[Any]:
        return [self.key, self.kind, self._fingerprint, os.urandom(16)]

    def _settle(self, claimed: bool, held: tuple | None) -> None:
        if claimed:
            self.applied = True
            return
        if held is None:
            raise GuardVanished(
                f"the guard row of `{self.key}` disappeared between the conflict and its read: "
                "guard rows are being deleted while jobs run; deliver the job again"
            )
        applied_at, fingerprint, result, _token = held
        self.first_applied_at = _micros(applied_at)
        if fingerprint is not None and self._fingerprint is not None:
            if bytes(fingerprint) != self._fingerprint:
                record_outcome(self.kind, "failed")
                raise KeyReused(self.key, self.first_applied_at)
        self.result = self._driver.decode_json(result)

    def _finish(self, failed: bool) -> bool:
        """Whether the result should be written now; counts the outcome."""
        if not self.applied:
            record_outcome(self.kind, "duplicate")
            return False
        if failed:
            record_outcome(self.kind, "failed")
            return False
        record_outcome(self.kind, "applied")
        return self._result is not _UNSET

    # The claim, per dialect: the statement the Rust guard runs, then the row's read.
    def _pg_rows(self, row: tuple | None) -> tuple[bool, tuple | None]:
        if row is None:
            return False, None
        claimed, applied_at, fingerprint, result, token = row
        if claimed:
            return True, None
        return False, (applied_at, fingerprint, result, token)

    # Sync
    def _claim_sync(self) -> None:
        d = self._driver
        d.check()
        if d.dialect == "postgres":
            claimed, held = self._pg_rows(d.fetchone(self._sql["claim"], self._claim_params()))
        else:
            claimed = d.fetchone(self._sql["claim"], self._claim_params()) is not None
            held = None if claimed else d.fetchone(self._sql["record"], [self.key])
        self._settle(claimed, held)

    def __enter__(self) -> "Guard":
        if self._driver.is_async:
            raise UnsupportedConnection(
                f"{self._driver.name} is asynchronous: use `async with jobguard.guard(...)`"
            )
        self._claim_sync()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._finish(exc_type is not None):
            self._driver.execute(
                self._sql["store_result"], [self.key, self._driver.encode_json(self._encoded)]
            )

    # Async
    async def _claim_async(self) -> None:
        d = self._driver
        d.check()
        if d.dialect == "postgres":
            row = await d.fetchone(self._sql["claim"], self._claim_params())
            claimed, held = self._pg_rows(row)
        else:
            claimed = await d.fetchone(self._sql["claim"], self._claim_params()) is not None
            held = None if claimed else await d.fetchone(self._sql["record"], [self.key])
        self._settle(claimed, held)

    async def __aenter__(self) -> "Guard":
        if not self._driver.is_async:
            raise UnsupportedConnection(
                f"{self._driver.name} is synchronous: use `with jobguard.guard_sync(...)`"
            )
        await self._claim_async()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._finish(exc_type is not None):
            await self._driver.execute(
                self._sql["store_result"], [self.key, self._driver.encode_json(self._encoded)]
            )


def _guard(conn: Any, key: str, payload: Any, table: str, schema: str | None) -> Guard:
    if not isinstance(key, str):
        raise _keys.InvalidKey(f"the job key is a {type(key).__name__}: build it with jobguard.key")
    return Guard(driver_for(conn), key, payload, table, schema)


def guard(
    conn: Any, key: str, payload: Any = None, *, table: str = DEFAULT_TABLE, schema: str | None = None
) -> Guard:
    """``async with jobguard.guard(conn, key, payload) as g:`` on an asyncpg, psycopg async,
    SQLAlchemy async or aiosqlite connection, inside the transaction the caller opened.

    ``if g.applied:`` do the effect on ``conn``; it commits with the guard row. A duplicate
    leaves ``g.applied`` false and ``g.result`` set. A key first applied with another payload
    raises :class:`KeyReused` inside the transaction, so the effect rolls back.
    """
    return _guard(conn, key, payload, table, schema)


def guard_sync(
    conn: Any, key: str, payload: Any = None, *, table: str = DEFAULT_TABLE, schema: str | None = None
) -> Guard:
    """``with jobguard.guard_sync(conn, key, payload) as g:`` on a psycopg, SQLAlchemy or
    sqlite3 connection, inside the transaction the caller opened; see :func:`guard`."""
    return _guard(conn, key, payload, table, schema)


def _migration(d: Driver, table: str, schema: str | None):
    """The migration's statements in the Rust library's order. A step whose params are
    ``_CHECK`` reads the table's marker: when it is this schema's, the rest is skipped (a
    `create index if not exists` would still wait for every transaction writing the table)."""
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


async def migrate(conn: Any, *, table: str = DEFAULT_TABLE, schema: str | None = None) -> None:
    """Creates the guard table (and on PostgreSQL its claim function) exactly as the Rust
    library does: the same statements, the same per-table lock and schema marker, so the two
    libraries can migrate one database in any order. Idempotent. Runs in the caller's
    transaction when one is open (as a savepoint where the driver nests), else in its own."""
    d = driver_for(conn)
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


def migrate_sync(conn: Any, *, table: str = DEFAULT_TABLE, schema: str | None = None) -> None:
    """:func:`migrate` for psycopg, SQLAlchemy and sqlite3 connections."""
    d = driver_for(conn)
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
