"""The drivers the guard runs on: each says its dialect, whether it is inside an open
transaction, and runs jobguard's statements with its own placeholder style.

Statements come from the Rust core with ``$1``-style placeholders; they are rewritten here for
the driver, never reworded, so every driver sends the text the Rust guard sends.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from typing import Any, Sequence

Row = tuple[Any, ...]

from .errors import ConnectionClosed, InSavepoint, NotInTransaction, UnsupportedConnection

# A placeholder, or a string literal or comment to leave alone: the core's statements name
# their parameters in comments too (`-- ... ($2, ...)`), which a positional style must not count.
_PLACEHOLDER = re.compile(r"'(?:[^']|'')*'|--[^\n]*|\$(\d+)")


def convert(sql: str, params: Sequence[Any], style: str) -> tuple[str, Any]:
    """``sql`` with ``$n`` placeholders, and ``params``, in a DB-API ``paramstyle``."""
    if style == "numeric_dollar":
        return sql, tuple(params)
    order: list[int] = []

    def sub(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return match.group(0)
        n = int(match.group(1))
        order.append(n)
        if style == "pyformat":
            return f"%(p{n})s"
        if style == "format":
            return "%s"
        if style == "qmark":
            return "?"
        if style == "named":
            return f":p{n}"
        if style == "numeric":
            return f":{n}"
        raise UnsupportedConnection(f"placeholder style {style!r} is not supported")

    text = _PLACEHOLDER.sub(sub, sql) if params else sql
    if style in ("pyformat", "named"):
        return text, {f"p{n}": params[n - 1] for n in order}
    if style == "numeric":
        return text, tuple(params)
    return text, tuple(params[n - 1] for n in order)


_OUTSIDE = (
    "jobguard needs an open transaction on this connection, so that what it writes (a guard "
    "row, a job enqueued) commits or rolls back with your own writes: open one first ({how})"
)
_NESTED = (
    "jobguard.guard was called inside a savepoint (a nested transaction): rolling back to it "
    "would part the guard row from the effect; claim the key in the outermost transaction"
)


class Driver:
    """One connection of a known driver."""

    dialect: str  # "postgres" or "sqlite"
    is_async: bool
    name: str
    # Whether JSON columns come back already decoded.
    decodes_json = False

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def check(self) -> None:
        """Refuses a closed connection, no transaction, or a savepoint; writes nothing."""
        raise NotImplementedError

    def commits_each_statement(self) -> bool:
        """Whether a statement run now commits as it returns: no transaction is open and the
        connection opens none implicitly (asyncpg outside ``transaction()``, psycopg with
        ``autocommit=True``). Drivers that begin one implicitly (psycopg otherwise,
        SQLAlchemy, sqlite3) leave it to a commit the caller may never make: False."""
        return False

    def decode_json(self, value: Any) -> Any:
        if value is None:
            return None
        if self.decodes_json or not isinstance(value, (str, bytes)):
            return value
        return json.loads(value)

    def encode_json(self, text: str) -> Any:
        return text


class SyncDriver(Driver):
    """A driver whose statements run as plain calls."""

    is_async = False

    def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        raise NotImplementedError

    def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        raise NotImplementedError

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        raise NotImplementedError

    def transaction(self) -> Any:
        raise NotImplementedError


class AsyncDriver(Driver):
    """A driver whose statements are awaited."""

    is_async = True

    async def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        raise NotImplementedError

    async def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        raise NotImplementedError

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        raise NotImplementedError

    def transaction(self) -> Any:
        raise NotImplementedError


def _row(row: Any) -> Row | None:
    return None if row is None else tuple(row)


class AsyncpgDriver(AsyncDriver):
    dialect, name = "postgres", "asyncpg"

    def __init__(self, conn: Any) -> None:
        # A pool's proxy forwards every call through a wrapper: talk to its connection.
        raw = getattr(conn, "_con", None)
        super().__init__(raw if raw is not None else conn)

    def check(self) -> None:
        if not self.conn.is_in_transaction():
            if self.conn.is_closed():
                raise ConnectionClosed("the asyncpg connection is closed")
            raise NotInTransaction(_OUTSIDE.format(how="async with conn.transaction():"))
        # asyncpg keeps the outermost of its transaction blocks; nested ones are savepoints,
        # which it does not track: a block entered while this one is open is refused by the
        # guard entering through `jobguard.guarded`, and documented for direct use.

    def commits_each_statement(self) -> bool:
        return not self.conn.is_closed() and not self.conn.is_in_transaction()

    async def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        return _row(await self.conn.fetchrow(sql, *params))

    async def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        return [tuple(row) for row in await self.conn.fetch(sql, *params)]

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        await self.conn.execute(sql, *params)

    def transaction(self) -> Any:
        return self.conn.transaction()


def _psycopg_autocommits(conn: Any) -> bool:
    from psycopg.pq import TransactionStatus

    return (not conn.closed and conn.autocommit
            and conn.info.transaction_status == TransactionStatus.IDLE)


def _psycopg_check(conn: Any) -> None:
    from psycopg.pq import TransactionStatus

    if conn.closed:
        raise ConnectionClosed("the psycopg connection is closed")
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise ConnectionClosed(
            "the transaction on this connection already failed: roll it back and deliver again"
        )
    if status != TransactionStatus.INTRANS:
        raise NotInTransaction(_OUTSIDE.format(how="with conn.transaction():"))
    # psycopg counts its open transaction blocks; all but the outermost are savepoints.
    if getattr(conn, "_num_transactions", 0) > 1:
        raise InSavepoint(_NESTED)


class PsycopgDriver(SyncDriver):
    dialect, name = "postgres", "psycopg"
    decodes_json = True

    def check(self) -> None:
        _psycopg_check(self.conn)

    def commits_each_statement(self) -> bool:
        return _psycopg_autocommits(self.conn)

    def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        text, args = convert(sql, params, "pyformat")
        return _row(self.conn.execute(text, args if params else None).fetchone())

    def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        text, args = convert(sql, params, "pyformat")
        return [tuple(r) for r in self.conn.execute(text, args if params else None).fetchall()]

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        text, args = convert(sql, params, "pyformat")
        self.conn.execute(text, args if params else None)

    def transaction(self) -> Any:
        return self.conn.transaction()


class AsyncPsycopgDriver(AsyncDriver):
    dialect, name = "postgres", "psycopg (async)"
    decodes_json = True

    def check(self) -> None:
        _psycopg_check(self.conn)

    def commits_each_statement(self) -> bool:
        return _psycopg_autocommits(self.conn)

    async def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        text, args = convert(sql, params, "pyformat")
        cursor = await self.conn.execute(text, args if params else None)
        return _row(await cursor.fetchone())

    async def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        text, args = convert(sql, params, "pyformat")
        cursor = await self.conn.execute(text, args if params else None)
        return [tuple(row) for row in await cursor.fetchall()]

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        text, args = convert(sql, params, "pyformat")
        await self.conn.execute(text, args if params else None)

    def transaction(self) -> Any:
        return self.conn.transaction()


class Sqlite3Driver(SyncDriver):
    dialect, name = "sqlite", "sqlite3"

    def check(self) -> None:
        try:
            in_transaction = self.conn.in_transaction
        except sqlite3.ProgrammingError:
            raise ConnectionClosed("the sqlite3 connection is closed") from None
        if not in_transaction:
            raise NotInTransaction(_OUTSIDE.format(how='conn.execute("begin immediate")'))

    def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        text, args = convert(sql, params, "qmark")
        return _row(self.conn.execute(text, args).fetchone())

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        text, args = convert(sql, params, "qmark")
        self.conn.execute(text, args)

    @contextlib.contextmanager
    def transaction(self) -> Any:
        if self.conn.in_transaction:
            yield
            return
        self.conn.execute("begin immediate")
        try:
            yield
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.commit()


class AiosqliteDriver(AsyncDriver):
    dialect, name = "sqlite", "aiosqlite"

    def check(self) -> None:
        if not getattr(self.conn, "_running", True) or self.conn._connection is None:
            raise ConnectionClosed("the aiosqlite connection is closed")
        if not self.conn.in_transaction:
            raise NotInTransaction(_OUTSIDE.format(how='await conn.execute("begin immediate")'))

    async def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        text, args = convert(sql, params, "qmark")
        cursor = await self.conn.execute(text, args)
        return _row(await cursor.fetchone())

    async def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        text, args = convert(sql, params, "qmark")
        cursor = await self.conn.execute(text, args)
        return [tuple(row) for row in await cursor.fetchall()]

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        text, args = convert(sql, params, "qmark")
        await self.conn.execute(text, args)

    @contextlib.asynccontextmanager
    async def transaction(self) -> Any:
        if self.conn.in_transaction:
            yield
            return
        await self.conn.execute("begin immediate")
        try:
            yield
        except BaseException:
            await self.conn.rollback()
            raise
        await self.conn.commit()


def _sqlalchemy_dialect(conn: Any) -> str:
    name = conn.dialect.name
    if name == "postgresql":
        return "postgres"
    if name == "sqlite":
        return "sqlite"
    raise UnsupportedConnection(
        f"SQLAlchemy dialect {name!r} is not supported: jobguard runs on PostgreSQL and SQLite"
    )


def _sqlalchemy_check(conn: Any, closed: bool) -> None:
    if closed:
        raise ConnectionClosed("the SQLAlchemy connection is closed")
    if not conn.in_transaction():
        raise NotInTransaction(_OUTSIDE.format(how="with engine.begin() as conn:"))
    if conn.in_nested_transaction():
        raise InSavepoint(_NESTED)


def _sqlalchemy_setup(driver: Driver, conn: Any) -> str:
    """Sets the dialect and JSON decoding of a SQLAlchemy driver; returns its paramstyle."""
    driver.dialect = _sqlalchemy_dialect(conn)
    # psycopg and SQLAlchemy's asyncpg adapter decode json columns; sqlite3 does not.
    driver.decodes_json = driver.dialect == "postgres" and conn.dialect.driver != "pg8000"
    return str(conn.dialect.paramstyle)


def _sqlalchemy_transaction(conn: Any) -> Any:
    if conn.in_transaction():
        return contextlib.nullcontext()
    return conn.begin()


class SqlalchemyDriver(SyncDriver):
    name = "SQLAlchemy"

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self.style = _sqlalchemy_setup(self, conn)

    def check(self) -> None:
        _sqlalchemy_check(self.conn, self.conn.closed)

    def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        text, args = convert(sql, params, self.style)
        return _row(self.conn.exec_driver_sql(text, args).fetchone())

    def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        text, args = convert(sql, params, self.style)
        return [tuple(r) for r in self.conn.exec_driver_sql(text, args).fetchall()]

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        text, args = convert(sql, params, self.style)
        self.conn.exec_driver_sql(text, args)

    def transaction(self) -> Any:
        return _sqlalchemy_transaction(self.conn)


class AsyncSqlalchemyDriver(AsyncDriver):
    name = "SQLAlchemy (async)"

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self.style = _sqlalchemy_setup(self, conn)

    def check(self) -> None:
        _sqlalchemy_check(self.conn, self.conn.closed)

    async def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        text, args = convert(sql, params, self.style)
        result = await self.conn.exec_driver_sql(text, args)
        return _row(result.fetchone())

    async def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        text, args = convert(sql, params, self.style)
        result = await self.conn.exec_driver_sql(text, args)
        return [tuple(row) for row in result.fetchall()]

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        text, args = convert(sql, params, self.style)
        await self.conn.exec_driver_sql(text, args)

    def transaction(self) -> Any:
        return _sqlalchemy_transaction(self.conn)


def _module(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


# The driver class of each connection type seen, so that the guard's path does one dict
# lookup instead of the imports and isinstance checks below.
_KNOWN: dict[type, type[Driver]] = {}


def driver_for(conn: Any) -> Driver:
    """The driver of ``conn``: asyncpg, psycopg 3 (sync or async), SQLAlchemy (Connection,
    Session, async or not), sqlite3 or aiosqlite."""
    known = _KNOWN.get(type(conn))
    if known is not None:
        return known(conn)
    driver = _driver_for(conn)
    # A Session's driver wraps its connection, not the session: found again each time.
    if driver.conn is conn or isinstance(driver, AsyncpgDriver):
        _KNOWN[type(conn)] = type(driver)
    return driver


def _driver_for(conn: Any) -> Driver:
    if isinstance(conn, Driver):
        # A driver an integration made for a connection it owns (jobguard.django's).
        return conn
    module = _module(conn)
    if module == "asyncpg":
        import asyncpg

        if isinstance(conn, asyncpg.Connection):
            return AsyncpgDriver(conn)
        if hasattr(conn, "_con") and isinstance(conn._con, asyncpg.Connection):  # pool proxy
            return AsyncpgDriver(conn)
    if module == "psycopg":
        import psycopg

        if isinstance(conn, psycopg.AsyncConnection):
            return AsyncPsycopgDriver(conn)
        if isinstance(conn, psycopg.Connection):
            return PsycopgDriver(conn)
    if module == "sqlalchemy":
        from sqlalchemy.engine import Connection
        from sqlalchemy.orm import Session

        if isinstance(conn, Connection):
            return SqlalchemyDriver(conn)
        if isinstance(conn, Session):
            return SqlalchemyDriver(conn.connection())
        # SQLAlchemy's asyncio module needs greenlet, which SQLAlchemy 2.1 no longer installs:
        # without it, nothing here is an async SQLAlchemy object (a sync Engine, for one).
        try:
            from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
        except ImportError:
            AsyncConnection = AsyncSession = None  # type: ignore[assignment,misc]
        if AsyncConnection is not None and isinstance(conn, AsyncConnection):
            return AsyncSqlalchemyDriver(conn)
        if AsyncSession is not None and isinstance(conn, AsyncSession):
            raise UnsupportedConnection(
                "pass `await session.connection()` for an AsyncSession: its connection is "
                "opened by an await"
            )
    if isinstance(conn, sqlite3.Connection):
        return Sqlite3Driver(conn)
    if module == "aiosqlite":
        return AiosqliteDriver(conn)
    raise UnsupportedConnection(
        f"{type(conn).__module__}.{type(conn).__qualname__} is not a connection jobguard knows: "
        "pass an asyncpg, psycopg 3, SQLAlchemy, sqlite3 or aiosqlite connection"
    )
