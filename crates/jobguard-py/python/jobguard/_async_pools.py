"""The worker on async drivers: an asyncpg pool, psycopg's ``AsyncConnectionPool`` and a
SQLAlchemy ``AsyncEngine`` (PostgreSQL over asyncpg or psycopg, SQLite over aiosqlite). Wake-ups
come from asyncpg's listener or psycopg's ``notifies()`` on a connection of their own."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from ._drivers import _sqlalchemy_dialect, convert
from ._session import Database, Row, Session, _sqlite_in_transaction


class _AsyncpgSession(Session):
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        rows: list[Row] = list(await self.conn.fetch(sql, *params))
        return rows

    async def execute(self, sql: str, params: Sequence[Any]) -> int:
        status: str = await self.conn.execute(sql, *params)
        return int(status.rsplit(" ", 1)[-1]) if status and status[-1].isdigit() else 0

    def transaction(self) -> Any:
        return self.conn.transaction()


async def _asyncpg_listen(conn: Any, channel: str, woken: Callable[[str], None],
                          release: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    def notified(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        woken(payload)

    try:
        await conn.add_listener(channel, notified)
    except BaseException:
        await release()
        raise

    async def stop() -> None:
        try:
            await conn.remove_listener(channel, notified)
        except Exception:  # noqa: BLE001 - a dead connection stops listening anyway
            pass
        await release()

    return stop


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
        return await _asyncpg_listen(conn, channel, woken, lambda: self.pool.release(conn))

    async def close(self) -> None:
        if self.owned:
            await self.pool.close()


class _PsycopgSession(Session):
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def _run(self, sql: str, params: Sequence[Any]) -> Any:
        text, args = convert(sql, params, "pyformat")
        return await self.conn.execute(text, args if params else None)

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        if self._in_transaction():
            rows: list[Row] = await (await self._run(sql, params)).fetchall()
            return rows
        async with self.conn.transaction():
            rows = await (await self._run(sql, params)).fetchall()
            return rows

    async def execute(self, sql: str, params: Sequence[Any]) -> int:
        if self._in_transaction():
            return int((await self._run(sql, params)).rowcount)
        async with self.conn.transaction():
            return int((await self._run(sql, params)).rowcount)

    def _in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return bool(self.conn.autocommit
                    or self.conn.info.transaction_status != TransactionStatus.IDLE)

    def transaction(self) -> Any:
        return self.conn.transaction()


async def _psycopg_listen(conninfo: str, kwargs: dict[str, Any], channel: str,
                          woken: Callable[[str], None]) -> Callable[[], Awaitable[None]]:
    """Listens on a psycopg connection of its own, reading ``notifies()``."""
    import asyncio

    import psycopg

    kwargs = {k: v for k, v in kwargs.items() if k != "autocommit"}
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
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
        return await _psycopg_listen(self.pool.conninfo, dict(self.pool.kwargs or {}), channel,
                                     woken)

    async def close(self) -> None:
        if self.owned:
            await self.pool.close()


class _SqlalchemyAsyncSession(Session):
    def __init__(self, conn: Any, dialect: str) -> None:
        self.conn, self.dialect = conn, dialect
        self.style = conn.dialect.paramstyle

    async def _run(self, sql: str, params: Sequence[Any]) -> Any:
        text, args = convert(sql, params, self.style)
        return await self.conn.exec_driver_sql(text, args)

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        async with self._unit():
            return [tuple(row) for row in (await self._run(sql, params)).fetchall()]

    async def execute(self, sql: str, params: Sequence[Any]) -> int:
        async with self._unit():
            return int((await self._run(sql, params)).rowcount)

    @contextlib.asynccontextmanager
    async def _unit(self) -> AsyncIterator[None]:
        if self.conn.in_transaction():
            yield
            return
        async with self.transaction():
            yield

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        async with self.conn.begin() as tx:
            if self.dialect == "sqlite":
                # pysqlite and aiosqlite begin lazily, deferred; a job takes the write lock
                # when it begins, unless the engine's own `begin` event already did.
                raw = await self.conn.get_raw_connection()
                if not _sqlite_in_transaction(raw.dbapi_connection):
                    await self.conn.exec_driver_sql("begin immediate")
            yield tx


class SqlalchemyAsyncDatabase(Database):
    name = "SQLAlchemy (async)"

    def __init__(self, engine: Any, owned: bool = False) -> None:
        self.engine, self.owned = engine, owned
        self.dialect = _sqlalchemy_dialect(engine)
        self.decodes_json = self.dialect == "postgres"

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        async with self.engine.connect() as conn:
            yield _SqlalchemyAsyncSession(conn, self.dialect)

    async def listen(self, channel: str, woken: Callable[[str], None]) -> Callable[[], Awaitable[None]]:
        if self.dialect != "postgres":
            return await super().listen(channel, woken)
        driver = self.engine.dialect.driver
        if driver == "asyncpg":
            conn = await self.engine.connect()
            raw = await conn.get_raw_connection()
            return await _asyncpg_listen(raw.driver_connection, channel, woken, conn.close)
        if driver == "psycopg":
            url = self.engine.url.set(drivername="postgresql")
            return await _psycopg_listen(url.render_as_string(hide_password=False), {}, channel,
                                         woken)
        return await super().listen(channel, woken)

    async def close(self) -> None:
        if self.owned:
            await self.engine.dispose()
