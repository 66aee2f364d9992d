"""What the worker runs its statements through: a :class:`Session` (one connection of the
user's pool, in the user's driver) taken from a :class:`Database` (the pool). Each driver
implements both, async ones in :mod:`jobguard._async_pools`, sync ones on threads in
:mod:`jobguard._sync_pools`; :mod:`jobguard._pools` picks one for the object an app is given.
"""

from __future__ import annotations

import contextlib
from typing import Any, Awaitable, Callable, Sequence

from .errors import UnsupportedConnection

#: A row as the worker reads it.
Row = tuple[Any, ...]


class Session:
    """One connection taken from the pool: ``conn`` is the driver's own object, which a job's
    body receives."""

    conn: Any

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        raise NotImplementedError

    async def execute(self, sql: str, params: Sequence[Any]) -> int:
        """Runs ``sql``; the number of rows it changed."""
        raise NotImplementedError

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """Begins a transaction (on SQLite ``begin immediate``): committed when the block
        ends, rolled back when it raises."""
        raise NotImplementedError

    async def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        rows = await self.fetch(sql, params)
        return rows[0] if rows else None

    async def call(self, fn: Callable[..., Any], /, **kwargs: Any) -> Any:
        """Runs ``fn(conn, **kwargs)``: a job's body, or a migration, on this connection."""
        return await fn(self.conn, **kwargs)


class Database:
    """A pool the worker takes sessions from."""

    dialect = "postgres"
    is_async = True
    name = ""
    #: Whether JSON columns come back decoded.
    decodes_json = False

    def session(self) -> contextlib.AbstractAsyncContextManager[Session]:
        raise NotImplementedError

    async def listen(self, channel: str, woken: Callable[[str], None]) -> Callable[[], Awaitable[None]]:
        """Calls ``woken(payload)`` for each notification on ``channel``; returns the coroutine
        function that stops listening. Raises when the database cannot listen."""
        raise UnsupportedConnection(f"{self.name} has no notifications: the worker polls")

    async def abandon(self) -> list[Any]:
        """Ends the transactions of job bodies that cannot be cancelled (sync bodies on their
        threads) at shutdown, so that their leases can be given back; the sessions it could
        not end. Async bodies are cancelled, and their transactions roll back."""
        return []

    async def opened(self) -> "Database":
        """This database, ready for sessions."""
        return self

    async def close(self) -> None:
        """Closes a pool the worker opened itself (from a factory)."""


def _sqlite_in_transaction(dbapi_connection: Any) -> bool:
    """Whether the sqlite3 (or SQLAlchemy's aiosqlite adapter) connection has a transaction
    open."""
    inner = getattr(dbapi_connection, "_connection", dbapi_connection)  # aiosqlite's adapter
    inner = getattr(inner, "_conn", inner)  # aiosqlite.Connection's sqlite3 connection
    return bool(getattr(inner, "in_transaction", False))
