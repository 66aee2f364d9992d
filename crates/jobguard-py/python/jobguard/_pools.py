"""The database a worker runs on: the user's own pool, in the user's own driver.

A worker takes a connection from the pool for each unit of work (a fetch, a job's transaction,
a settle, the heartbeats, the rescue), runs the core's statements on it with the driver's
placeholders, and gives it back. The job's body receives that same connection, inside the
transaction that completes the job and claims its key.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from ._drivers import convert
from .errors import UnsupportedConnection

log = logging.getLogger("jobguard.worker")


class Session:
    """One connection taken from the pool: ``conn`` is the driver's own object, which a job's
    body receives."""

    conn: Any

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[tuple]:
        raise NotImplementedError

    async def execute(self, sql: str, params: Sequence[Any]) -> int:
        """Runs ``sql``; the number of rows it changed."""
        raise NotImplementedError

    def transaction(self) -> Any:
        raise NotImplementedError

    async def fetchone(self, sql: str, params: Sequence[Any]) -> tuple | None:
        rows = await self.fetch(sql, params)
        return rows[0] if rows else None


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
        raise NotImplementedError

    async def close(self) -> None:
        """Closes a pool the worker opened itself (from a factory)."""


class _AsyncpgSession(Session):
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[tuple]:
        return list(await self.conn.fetch(sql, *params))

    async def execute(self, sql: str, params: Sequence[Any]) -> int:
        status = await self.conn.execute(sql, *params)
        return int(status.rsplit(" ", 1)[-1]) if status and status[-1].isdigit() else 0

    def transaction(self) -> Any:
        return self.conn.transaction()


class AsyncpgDatabase(Database):
    name = "asyncpg"

    def __init__(self, pool: Any, owned: bool = False) -> None:
        self.pool, self.owned = pool, owned

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        async with self.pool.acquire() as conn:
            yield _AsyncpgSession(conn)

    async def listen(self, channel: str, woken: Callable[[str], None]) -> Callable[[], Awaitable[None]]:
        conn = await self.pool.acquire()

        def notified(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
            woken(payload)

        try:
            await conn.add_listener(channel, notified)
        except BaseException:
            await self.pool.release(conn)
            raise

        async def stop() -> None:
            try:
                await conn.remove_listener(channel, notified)
            except Exception:  # noqa: BLE001 - a dead connection stops listening anyway
                pass
            await self.pool.release(conn)

        return stop

    async def close(self) -> None:
        if self.owned:
            await self.pool.close()


class _PsycopgSession(Session):
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def _run(self, sql: str, params: Sequence[Any]) -> Any:
        text, args = convert(sql, params, "pyformat")
        return await self.conn.execute(text, args if params else None)

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[tuple]:
        if self._in_transaction():
            return await (await self._run(sql, params)).fetchall()
        async with self.conn.transaction():
            return await (await self._run(sql, params)).fetchall()

    async def execute(self, sql: str, params: Sequence[Any]) -> int:
        if self._in_transaction():
            return (await self._run(sql, params)).rowcount
        async with self.conn.transaction():
            return (await self._run(sql, params)).rowcount

    def _in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return self.conn.autocommit or self.conn.info.transaction_status != TransactionStatus.IDLE

    def transaction(self) -> Any:
        return self.conn.transaction()


class PsycopgAsyncDatabase(Database):
    name = "psycopg (async)"
    decodes_json = True

    def __init__(self, pool: Any, owned: bool = False) -> None:
        self.pool, self.owned = pool, owned

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        async with self.pool.connection() as conn:
            yield _PsycopgSession(conn)

    async def listen(self, channel: str, woken: Callable[[str], None]) -> Callable[[], Awaitable[None]]:
        import asyncio

        import psycopg

        kwargs = {k: v for k, v in (self.pool.kwargs or {}).items() if k != "autocommit"}
        conn = await psycopg.AsyncConnection.connect(self.pool.conninfo, autocommit=True, **kwargs)
        await conn.execute(f'listen "{channel}"')

        async def receive() -> None:
            async for notify in conn.notifies():
                woken(notify.payload)

        task = asyncio.get_running_loop().create_task(receive())

        async def stop() -> None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await conn.close()

        return stop

    async def close(self) -> None:
        if self.owned:
            await self.pool.close()


def database_of(db: Any, owned: bool = False) -> Database:
    """The worker's view of ``db``: an asyncpg pool or a psycopg 3 ``AsyncConnectionPool``."""
    module = type(db).__module__.split(".")[0]
    if module == "asyncpg" and hasattr(db, "acquire"):
        return AsyncpgDatabase(db, owned)
    if module == "psycopg_pool" and type(db).__name__ == "AsyncConnectionPool":
        return PsycopgAsyncDatabase(db, owned)
    raise UnsupportedConnection(
        f"{type(db).__module__}.{type(db).__qualname__} is not a pool jobguard's worker knows: "
        "pass an asyncpg pool or a psycopg_pool.AsyncConnectionPool"
    )


def is_async_db(db: Any) -> bool | None:
    """Whether ``db`` is a pool of an async driver; ``None`` for a factory, known once called."""
    if callable(db) and not hasattr(db, "acquire") and not hasattr(db, "connection"):
        return None
    return database_of(db).is_async


async def open_database(db: Any) -> Database:
    """The database of ``db``, a pool or a function returning one (or an awaitable of one),
    opened: a pool made by a factory is the worker's, closed when it stops."""
    owned = False
    if callable(db) and not hasattr(db, "acquire") and not hasattr(db, "connection"):
        db = db()
        if inspect.isawaitable(db):
            db = await db
        owned = True
    database = database_of(db, owned)
    if isinstance(database, PsycopgAsyncDatabase):
        await db.open()
    return database
