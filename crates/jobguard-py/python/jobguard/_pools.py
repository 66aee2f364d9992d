"""The database a worker runs on: the user's own pool or engine, in the user's own driver.

A worker takes a connection from the pool for each unit of work (a fetch, a job's transaction,
a settle, the heartbeats, the rescue), runs the core's statements on it with the driver's
placeholders, and gives it back. The job's body receives that same connection, inside the
transaction that completes the job and claims its key. Async drivers (asyncpg, psycopg's
``AsyncConnectionPool``, a SQLAlchemy ``AsyncEngine``) are in :mod:`jobguard._async_pools`;
sync ones (psycopg's ``ConnectionPool``, a SQLAlchemy ``Engine``, a sqlite3 connection factory)
run on threads, in :mod:`jobguard._sync_pools`, behind the same :class:`Session`.
"""

from __future__ import annotations

import inspect
from typing import Any

from . import _sync_pools
from ._async_pools import AsyncpgDatabase, PsycopgAsyncDatabase, SqlalchemyAsyncDatabase
from ._session import Database, Session
from .errors import UnsupportedConnection

__all__ = ["Database", "Session", "database_of", "is_async_db", "is_factory", "open_database"]


def _module(db: Any) -> str:
    return type(db).__module__.split(".")[0]


def database_of(db: Any, owned: bool = False) -> Database:
    """The worker's view of ``db``: an asyncpg pool, a psycopg 3 pool (async or sync), a
    SQLAlchemy ``Engine`` or ``AsyncEngine``, or a sqlite3 connection (made by a factory)."""
    module = _module(db)
    if module == "asyncpg" and hasattr(db, "acquire"):
        return AsyncpgDatabase(db, owned)
    if module == "psycopg_pool" and type(db).__name__ == "AsyncConnectionPool":
        return PsycopgAsyncDatabase(db, owned)
    if module == "sqlalchemy" and type(db).__name__ == "AsyncEngine":
        return SqlalchemyAsyncDatabase(db, owned)
    sync = _sync_pools.sync_database_of(db, owned)
    if sync is not None:
        return _sync_pools.ThreadedDatabase(sync)
    raise UnsupportedConnection(
        f"{type(db).__module__}.{type(db).__qualname__} is not a pool jobguard's worker knows: "
        "pass an asyncpg pool, a psycopg_pool.AsyncConnectionPool or ConnectionPool, a "
        "SQLAlchemy Engine or AsyncEngine, or a function returning a new sqlite3 connection"
    )


def is_factory(db: Any) -> bool:
    """Whether ``db`` is a function returning the pool (or connection) rather than one."""
    return (callable(db) and not hasattr(db, "acquire") and not hasattr(db, "connection")
            and not hasattr(db, "connect"))


def is_async_db(db: Any) -> bool | None:
    """Whether ``db`` is a pool of an async driver; ``None`` for a factory, known once called."""
    if is_factory(db):
        return None
    return database_of(db).is_async


async def open_database(db: Any) -> Database:
    """The database of ``db``, a pool or a function returning one (or an awaitable of one),
    opened: a pool made by a factory is the worker's, closed when it stops. A factory that
    returns a sqlite3 connection is called again for each of the worker's threads."""
    owned = False
    if is_factory(db):
        factory, db = db, db()
        if inspect.isawaitable(db):
            db = await db
        if _sync_pools.is_connection(db):
            return _sync_pools.ThreadedDatabase(_sync_pools.factory_database(factory, db))
        owned = True
    database = database_of(db, owned)
    if isinstance(database, PsycopgAsyncDatabase):
        await db.open()
    return await database.opened()
