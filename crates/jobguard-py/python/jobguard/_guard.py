"""The guard on the caller's own connection, inside the transaction the caller opened.

One statement claims the key: the guide's ``insert ... on conflict do nothing returning``, the
text the Rust core gives for the table. A concurrent delivery of the same key waits on the
primary key until this transaction ends, then is a duplicate if it committed, or claims the key
if it rolled back. What the earlier delivery left is read only when asked for; a claim with a
payload runs, on PostgreSQL, the Rust guard's own claim, which returns the holding row in the
same round trip, since the payload's fingerprint must be compared at once.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import os
from typing import Any

from . import _keys
from ._drivers import AsyncDriver, Row, SyncDriver, driver_for
from ._migrate import DEFAULT_TABLE, is_not_migrated, migrate, migrate_sync, not_migrated
from ._outcome import Duplicate
from .errors import GuardVanished, HeldNotRead, KeyReused, NotApplied, UnsupportedConnection
from .metrics import record_outcome

__all__ = ["DEFAULT_TABLE", "Guard", "guard", "guard_sync", "migrate", "migrate_sync"]
_UNSET = object()


class _ClaimTokens:
    """The claim token each claim writes (the guard table's `claim_token`): 8 random bytes drawn
    once per process, then a counter. Unique per claim without a system call per claim (the
    random read cost more than the rest of the guard's Python put together); drawn again in a
    forked child, so prefork workers (Celery's) never share a prefix."""

    def __init__(self) -> None:
        self._reseed()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self._prefix = int.from_bytes(os.urandom(8), "big") << 64
        self._count = itertools.count(1)

    def next(self) -> bytes:
        return (self._prefix | next(self._count)).to_bytes(16, "big")


_tokens = _ClaimTokens()


class Guard:
    """The claim of one key in the caller's transaction.

    ``applied`` is true when this delivery holds the key: do the effect on the same
    connection, and it commits with the guard row. ``duplicate`` is true when an earlier
    delivery applied it: skip the effect.

    What the earlier delivery left (``first_applied_at``, ``result``) is read when asked for,
    so that a duplicate that only skips its effect costs the claim alone, as the guide's
    hand-written guard does: ``g.held()`` (``await g.held()`` on an async connection) returns
    it as a :class:`Duplicate`; on a sync connection the attributes also read it on first use.
    A claim given a payload reads it at once, since it compares the payload's fingerprint.
    """

    __slots__ = (
        "_driver", "key", "kind", "_fingerprint", "_sql", "applied", "_held", "_result",
        "_encoded", "_table", "_schema",
    )

    def __init__(self, conn: Any, key: str, payload: Any, table: str, schema: str | None):
        if not isinstance(key, str):
            raise _keys.InvalidKey(
                f"the job key is a {type(key).__name__}: build it with jobguard.key"
            )
        driver = self._driver = driver_for(conn)
        self.key = key
        self.kind = _keys.kind_of(key)
        self._fingerprint = None if payload is None else _keys.fingerprint_bytes(payload)
        self._sql = _keys.guard_sql(driver.dialect, table, schema)
        self._table, self._schema = table, schema
        self.applied = False
        # What the earlier delivery left, once read: a Duplicate.
        self._held: Duplicate | None = None
        self._result: Any = _UNSET

    @property
    def duplicate(self) -> bool:
        """True when an earlier delivery applied the key."""
        return not self.applied

    @property
    def first_applied_at(self) -> _dt.datetime | None:
        """When an earlier delivery applied the key (UTC); ``None`` when this one applies it."""
        held = self._held_now()
        return None if held is None else held.first_applied_at

    @property
    def result(self) -> Any:
        """The result the earlier delivery stored (JSON), or ``None``; ``None`` when this
        delivery applies the key."""
        held = self._held_now()
        return None if held is None else held.result

    def held(self) -> Any:
        """What the earlier delivery left, as a :class:`Duplicate`, or ``None`` when this
        delivery applies the key. Reads the guard row once, in this transaction (a new
        statement, so it sees a row committed while the claim waited). On an async connection
        it is a coroutine: ``await g.held()``."""
        d = self._driver
        if isinstance(d, AsyncDriver):
            return self._held_async(d)
        if self.applied:
            return None
        if self._held is None and isinstance(d, SyncDriver):
            self._read(d.fetchone(self._sql["record"], [self.key]))
        return self._held

    async def _held_async(self, d: AsyncDriver) -> Duplicate | None:
        if self.applied:
            return None
        if self._held is None:
            self._read(await d.fetchone(self._sql["record"], [self.key]))
        return self._held

    def _held_now(self) -> Duplicate | None:
        if self.applied or self._held is not None:
            return self._held
        if self._driver.is_async:
            raise HeldNotRead(
                f"`{self.key}` is a duplicate whose first delivery is read on demand: "
                "`await g.held()` for its first_applied_at and result"
            )
        held: Duplicate | None = self.held()
        return held

    def set_result(self, result: Any) -> None:
        """Stores ``result`` (JSON) in the guard row when the block ends without an error, so
        that every later delivery reads it as ``g.result``."""
        if not self.applied:
            raise NotApplied(self.key)
        self._encoded = _keys.to_json(result, "result")
        self._result = result

    def _claim(self) -> tuple[str, list[Any]]:
        """The claim statement and its parameters: the bare insert when there is no payload to
        compare, else (on PostgreSQL) the claim that returns the holding row as well."""
        sql = self._sql["claim_bare" if self._fingerprint is None else "claim"]
        return sql, [self.key, self.kind, self._fingerprint, _tokens.next()]

    def _claimed(self, row: Row | None) -> bool:
        """Settles the claim's row; false when a record must still be read (SQLite, with a
        payload)."""
        if self._fingerprint is None or self._driver.dialect != "postgres":
            self.applied = row is not None
            return self.applied or self._fingerprint is None
        if row is None:
            self._read(None)
        elif row[0]:
            self.applied = True
        else:
            self._read(tuple(row[1:]))
        return True

    def _read(self, row: Row | None) -> None:
        """Takes the holding row (applied at in microseconds, fingerprint, result, token) and
        refuses a key first applied with another payload."""
        if row is None:
            raise GuardVanished(
                f"the guard row of `{self.key}` disappeared between the conflict and its read: "
                "guard rows are being deleted while jobs run; deliver the job again"
            )
        applied_at, fingerprint, result, _token = row
        first = _dt.datetime.fromtimestamp(applied_at / 1_000_000, tz=_dt.timezone.utc)
        if fingerprint is not None and self._fingerprint is not None:
            if bytes(fingerprint) != self._fingerprint:
                record_outcome(self.kind, "failed")
                raise KeyReused(self.key, first)
        self._held = Duplicate(first, self._driver.decode_json(result))

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

    def _raise_if_not_migrated(self, error: Exception) -> None:
        """Raises :class:`NotMigrated` when the claim failed for want of the guard table (or
        its function); any other failure is the driver's own to raise."""
        if is_not_migrated(error):
            raise not_migrated(self._table, self._schema, error) from error

    # Sync
    def __enter__(self) -> "Guard":
        d = self._driver
        if not isinstance(d, SyncDriver):
            raise UnsupportedConnection(
                f"{d.name} is asynchronous: use `async with jobguard.guard(...)`"
            )
        d.check()
        try:
            row = d.fetchone(*self._claim())
        except Exception as error:
            self._raise_if_not_migrated(error)
            raise
        if not self._claimed(row):
            self._read(d.fetchone(self._sql["record"], [self.key]))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        d = self._driver
        if self._finish(exc_type is not None) and isinstance(d, SyncDriver):
            d.execute(self._sql["store_result"], [self.key, d.encode_json(self._encoded)])

    # Async
    async def __aenter__(self) -> "Guard":
        d = self._driver
        if not isinstance(d, AsyncDriver):
            raise UnsupportedConnection(
                f"{d.name} is synchronous: use `with jobguard.guard_sync(...)`"
            )
        d.check()
        try:
            row = await d.fetchone(*self._claim())
        except Exception as error:
            self._raise_if_not_migrated(error)
            raise
        if not self._claimed(row):
            self._read(await d.fetchone(self._sql["record"], [self.key]))
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        d = self._driver
        if self._finish(exc_type is not None) and isinstance(d, AsyncDriver):
            await d.execute(self._sql["store_result"], [self.key, d.encode_json(self._encoded)])


def guard(
    conn: Any, key: str, payload: Any = None, *, table: str = DEFAULT_TABLE, schema: str | None = None
) -> Guard:
    """``async with jobguard.guard(conn, key, payload) as g:`` on an asyncpg, psycopg async,
    SQLAlchemy async or aiosqlite connection, inside the transaction the caller opened.

    ``if g.applied:`` do the effect on ``conn``; it commits with the guard row. A duplicate
    leaves ``g.applied`` false and ``g.result`` set. A key first applied with another payload
    raises :class:`KeyReused` inside the transaction, so the effect rolls back.
    """
    return Guard(conn, key, payload, table, schema)


def guard_sync(
    conn: Any, key: str, payload: Any = None, *, table: str = DEFAULT_TABLE, schema: str | None = None
) -> Guard:
    """``with jobguard.guard_sync(conn, key, payload) as g:`` on a psycopg, SQLAlchemy or
    sqlite3 connection, inside the transaction the caller opened; see :func:`guard`."""
    return Guard(conn, key, payload, table, schema)
