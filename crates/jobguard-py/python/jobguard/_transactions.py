"""One transaction on what a user passes as ``db=`` instead of a connection: an async pool or
engine (``_Async``), or a sync engine, pool or connection factory (``_Sync``). ``@guarded`` and
``migrate`` open theirs here, so the guard's modules need not import each other."""

from __future__ import annotations

from typing import Any, Callable

from .errors import UnsupportedConnection


class _Async:
    """Opens a transaction on an asyncpg pool or a SQLAlchemy AsyncEngine."""

    def __init__(self, db: Any) -> None:
        self.db = db

    async def run(self, body: Callable[[Any], Any]) -> Any:
        module = type(self.db).__module__.split(".")[0]
        if module == "asyncpg":
            async with self.db.acquire() as conn, conn.transaction():
                return await body(conn)
        if module == "sqlalchemy":
            async with self.db.begin() as conn:
                return await body(conn)
        if module == "psycopg_pool":
            async with self.db.connection() as conn, conn.transaction():
                return await body(conn)
        raise UnsupportedConnection(
            f"db={type(self.db).__qualname__}: pass an asyncpg pool, a SQLAlchemy AsyncEngine "
            "or a psycopg AsyncConnectionPool"
        )


class _Sync:
    """Opens a transaction on a SQLAlchemy Engine, a psycopg pool or a connection factory."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def run(self, body: Callable[[Any], Any]) -> Any:
        module = type(self.db).__module__.split(".")[0]
        if module == "sqlalchemy":
            with self.db.begin() as conn:
                return body(conn)
        if module == "psycopg_pool":
            with self.db.connection() as conn, conn.transaction():
                return body(conn)
        if callable(self.db):
            conn = self.db()
            try:
                import sqlite3

                if isinstance(conn, sqlite3.Connection):
                    conn.execute("begin immediate")
                    try:
                        out = body(conn)
                    except BaseException:
                        conn.rollback()
                        raise
                    conn.commit()
                    return out
                with conn.transaction():
                    return body(conn)
            finally:
                conn.close()
        raise UnsupportedConnection(
            f"db={type(self.db).__qualname__}: pass a SQLAlchemy Engine, a psycopg "
            "ConnectionPool, or a function returning a new connection"
        )
