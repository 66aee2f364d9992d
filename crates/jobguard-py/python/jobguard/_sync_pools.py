"""The worker on sync drivers: psycopg's ``ConnectionPool``, a SQLAlchemy ``Engine``, and a
function returning a new sqlite3 connection.

The worker's loop stays on asyncio; every unit of work on a sync connection (a fetch, a job's
transaction with its body, a settle) runs on a thread of its own, a *lane*, which takes the
connection, runs the statements and the body, and gives the connection back, all on that one
thread (sqlite3 connections refuse to be used from another). A lane is taken for a session and
returned after it, so the worker holds as many threads as it has sessions open: ``concurrency``
jobs, a fetch, the heartbeats and the rescue.

A sync body cannot be cancelled. When the shutdown timeout passes with bodies still running,
the worker ends their transactions on PostgreSQL with ``pg_terminate_backend`` (the server
rolls them back, and the body's next statement or commit fails), so that their leases can be
given back at once; on SQLite a body keeps the write lock until it returns, so its lease is
left to expire and be rescued. Lanes are daemon threads: a process that exits does not wait for
a body still sleeping, and its uncommitted transaction is rolled back by the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Sequence

from ._drivers import _sqlalchemy_dialect, convert
from ._session import Database, Row, Session, _sqlite_in_transaction

log = logging.getLogger("jobguard.worker")


class SyncSession:
    """One sync connection: statements, and the transaction a job runs in."""

    conn: Any
    #: The PostgreSQL backend's process id, to end its transaction at shutdown.
    backend_pid: int | None = None

    def fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        raise NotImplementedError

    def execute(self, sql: str, params: Sequence[Any]) -> int:
        raise NotImplementedError

    def begin(self) -> None:
        raise NotImplementedError

    def commit(self) -> None:
        raise NotImplementedError

    def rollback(self, error: BaseException) -> None:
        raise NotImplementedError

    def _in_transaction(self) -> bool:
        raise NotImplementedError

    @contextlib.contextmanager
    def _unit(self) -> Iterator[None]:
        """One statement's transaction: the open one, else one of its own."""
        if self._in_transaction():
            yield
            return
        self.begin()
        try:
            yield
        except BaseException as error:
            self.rollback(error)
            raise
        self.commit()


class _PsycopgSession(SyncSession):
    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.backend_pid = conn.info.backend_pid
        self._tx: Any = None

    def _run(self, sql: str, params: Sequence[Any]) -> Any:
        text, args = convert(sql, params, "pyformat")
        return self.conn.execute(text, args if params else None)

    @contextlib.contextmanager
    def _unit(self) -> Iterator[None]:
        if self._tx is not None or self.conn.autocommit:
            yield
            return
        with self.conn.transaction():
            yield

    def fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        with self._unit():
            rows: list[Row] = self._run(sql, params).fetchall()
            return rows

    def execute(self, sql: str, params: Sequence[Any]) -> int:
        with self._unit():
            return int(self._run(sql, params).rowcount)

    def begin(self) -> None:
        self._tx = self.conn.transaction()
        self._tx.__enter__()

    def commit(self) -> None:
        tx, self._tx = self._tx, None
        tx.__exit__(None, None, None)

    def rollback(self, error: BaseException) -> None:
        tx, self._tx = self._tx, None
        tx.__exit__(type(error), error, error.__traceback__)


class _SqlalchemySession(SyncSession):
    def __init__(self, conn: Any, dialect: str) -> None:
        self.conn, self.dialect = conn, dialect
        self.style = conn.dialect.paramstyle
        self._tx: Any = None
        if dialect == "postgres":
            raw = conn.connection.dbapi_connection
            info = getattr(raw, "info", None)  # psycopg 3
            pid = getattr(info, "backend_pid", None)
            if pid is None and hasattr(raw, "get_backend_pid"):  # psycopg2
                pid = raw.get_backend_pid()
            self.backend_pid = pid

    def _run(self, sql: str, params: Sequence[Any]) -> Any:
        text, args = convert(sql, params, self.style)
        return self.conn.exec_driver_sql(text, args)

    def _in_transaction(self) -> bool:
        return bool(self.conn.in_transaction())

    def fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        with self._unit():
            return [tuple(row) for row in self._run(sql, params).fetchall()]

    def execute(self, sql: str, params: Sequence[Any]) -> int:
        with self._unit():
            return int(self._run(sql, params).rowcount)

    def begin(self) -> None:
        self._tx = self.conn.begin()
        if self.dialect == "sqlite" and not _sqlite_in_transaction(
            self.conn.connection.dbapi_connection
        ):
            # pysqlite begins lazily, deferred; unless the engine's own `begin` event took the
            # write lock already, take it now.
            self.conn.exec_driver_sql("begin immediate")

    def commit(self) -> None:
        tx, self._tx = self._tx, None
        tx.commit()

    def rollback(self, error: BaseException) -> None:
        tx, self._tx = self._tx, None
        tx.rollback()


class _Sqlite3Session(SyncSession):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def _in_transaction(self) -> bool:
        return bool(self.conn.in_transaction)

    def fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        text, args = convert(sql, params, "qmark")
        with self._unit():
            return [tuple(row) for row in self.conn.execute(text, args).fetchall()]

    def execute(self, sql: str, params: Sequence[Any]) -> int:
        text, args = convert(sql, params, "qmark")
        with self._unit():
            return int(self.conn.execute(text, args).rowcount)

    def begin(self) -> None:
        # The write lock from the start: SQLite's single writer queues the others behind it
        # (a deferred transaction that reads first could fail with `database is locked`).
        self.conn.execute("begin immediate")

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self, error: BaseException) -> None:
        self.conn.rollback()


class SyncDatabase:
    """A sync pool: :meth:`connect` runs on a lane's thread."""

    dialect = "postgres"
    name = ""
    decodes_json = False

    def connect(self) -> contextlib.AbstractContextManager[SyncSession]:
        raise NotImplementedError

    def open(self) -> None:
        pass

    def leave_thread(self) -> None:
        """Closes what this thread kept open (a lane's own sqlite3 connection)."""

    def close(self) -> None:
        pass

    def conninfo(self) -> tuple[str, dict[str, Any]] | None:
        """A psycopg connection string to listen on, when the database can notify."""
        return None


class PsycopgPoolDatabase(SyncDatabase):
    name = "psycopg"
    decodes_json = True

    def __init__(self, pool: Any, owned: bool) -> None:
        self.pool, self.owned = pool, owned

    @contextlib.contextmanager
    def connect(self) -> Iterator[SyncSession]:
        with self.pool.connection() as conn:
            yield _PsycopgSession(conn)

    def open(self) -> None:
        self.pool.open()

    def close(self) -> None:
        if self.owned:
            self.pool.close()

    def conninfo(self) -> tuple[str, dict[str, Any]] | None:
        return self.pool.conninfo, dict(self.pool.kwargs or {})


class SqlalchemyDatabase(SyncDatabase):
    name = "SQLAlchemy"

    def __init__(self, engine: Any, owned: bool) -> None:
        self.engine, self.owned = engine, owned
        self.dialect = _sqlalchemy_dialect(engine)
        # psycopg decodes json columns; pysqlite and pg8000 do not.
        self.decodes_json = self.dialect == "postgres" and engine.dialect.driver != "pg8000"

    @contextlib.contextmanager
    def connect(self) -> Iterator[SyncSession]:
        with self.engine.connect() as conn:
            yield _SqlalchemySession(conn, self.dialect)

    def close(self) -> None:
        if self.owned:
            self.engine.dispose()

    def conninfo(self) -> tuple[str, dict[str, Any]] | None:
        if self.dialect != "postgres" or self.engine.dialect.driver != "psycopg":
            return None
        url = self.engine.url.set(drivername="postgresql")
        return url.render_as_string(hide_password=False), {}


class Sqlite3FactoryDatabase(SyncDatabase):
    """A function returning a new sqlite3 connection: called once per lane, whose thread keeps
    its connection for the worker's life."""

    dialect, name = "sqlite", "sqlite3"

    def __init__(self, factory: Callable[[], Any], first: Any) -> None:
        self.factory = factory
        self._local = threading.local()
        first.close()  # made on the caller's thread: each lane makes its own

    @contextlib.contextmanager
    def connect(self) -> Iterator[SyncSession]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.factory()
        yield _Sqlite3Session(conn)

    def leave_thread(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            conn.close()


def is_connection(db: Any) -> bool:
    """Whether a factory returned a connection (sqlite3) rather than a pool."""
    return isinstance(db, sqlite3.Connection)


def factory_database(factory: Callable[[], Any], first: Any) -> SyncDatabase:
    return Sqlite3FactoryDatabase(factory, first)


def sync_database_of(db: Any, owned: bool) -> SyncDatabase | None:
    """The sync database of a psycopg ``ConnectionPool`` or a SQLAlchemy ``Engine``; ``None``
    for anything else."""
    module = type(db).__module__.split(".")[0]
    if module == "psycopg_pool" and type(db).__name__ == "ConnectionPool":
        return PsycopgPoolDatabase(db, owned)
    if module == "sqlalchemy" and type(db).__name__ == "Engine":
        return SqlalchemyDatabase(db, owned)
    return None


class _Lane:
    """One thread that runs the calls given to it, in order."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, name="jobguard-lane", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            future, loop, fn, args, kwargs = item
            try:
                result, error = fn(*args, **kwargs), None
            except BaseException as raised:  # noqa: BLE001 - handed to the awaiting task
                result, error = None, raised
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop closed while a body outlived the worker
                pass

    async def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if self.stopped:
            # A session whose body outlived the worker's shutdown: nothing more runs on it.
            raise RuntimeError("the worker stopped while this job's body still ran")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._calls.put((future, loop, fn, args, kwargs))
        return await future

    def stop(self) -> None:
        self.stopped = True
        self._calls.put(None)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # its task was cancelled: the call ran all the same
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _ThreadedSession(Session):
    def __init__(self, lane: _Lane, sync: SyncSession) -> None:
        self.lane, self.sync, self.conn = lane, sync, sync.conn
        self.in_transaction = False

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[Row]:
        rows: list[Row] = await self.lane.run(self.sync.fetch, sql, params)
        return rows

    async def execute(self, sql: str, params: Sequence[Any]) -> int:
        return int(await self.lane.run(self.sync.execute, sql, params))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        await self.lane.run(self.sync.begin)
        self.in_transaction = True
        try:
            yield
        except BaseException as error:
            try:
                # Queued on the lane behind the body, should the body still run.
                if not self.lane.stopped:
                    await self.lane.run(self.sync.rollback, error)
            finally:
                self.in_transaction = False
            raise
        try:
            await self.lane.run(self.sync.commit)
        finally:
            self.in_transaction = False

    async def call(self, fn: Callable[..., Any], /, **kwargs: Any) -> Any:
        return await self.lane.run(fn, self.conn, **kwargs)


class ThreadedDatabase(Database):
    """A :class:`SyncDatabase` behind the async :class:`Session`: each session on a lane."""

    is_async = False

    def __init__(self, sync: SyncDatabase) -> None:
        self.sync = sync
        self.dialect, self.name, self.decodes_json = sync.dialect, sync.name, sync.decodes_json
        self._idle: list[_Lane] = []
        self._lanes: list[_Lane] = []
        self._sessions: set[_ThreadedSession] = set()

    def _lane(self) -> _Lane:
        if self._idle:
            return self._idle.pop()
        lane = _Lane()
        self._lanes.append(lane)
        return lane

    async def opened(self) -> "ThreadedDatabase":
        await self._lane_run(self.sync.open)
        return self

    async def _lane_run(self, fn: Callable[..., Any], *args: Any) -> Any:
        lane = self._lane()
        try:
            return await lane.run(fn, *args)
        finally:
            self._idle.append(lane)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        lane = self._lane()
        connection = self.sync.connect()
        sync = await lane.run(connection.__enter__)
        session = _ThreadedSession(lane, sync)
        self._sessions.add(session)
        try:
            yield session
        except BaseException as error:
            self._sessions.discard(session)
            if not lane.stopped:  # else a body outlived the worker: nothing more runs there
                await lane.run(connection.__exit__, type(error), error, error.__traceback__)
                self._idle.append(lane)
            raise
        finally:
            self._sessions.discard(session)
        await lane.run(connection.__exit__, None, None, None)
        # Not reached while a body that outlived its task still runs on the lane.
        self._idle.append(lane)

    async def listen(self, channel: str, woken: Callable[[str], None]) -> Callable[[], Awaitable[None]]:
        target = self.sync.conninfo()
        if target is None:
            return await super().listen(channel, woken)
        return await _listen_thread(target[0], target[1], channel, woken)

    async def abandon(self) -> list[Any]:
        open_jobs = [s for s in self._sessions if s.in_transaction]
        if not open_jobs:
            return []
        pids = [s.sync.backend_pid for s in open_jobs if s.sync.backend_pid is not None]
        if self.dialect == "postgres" and pids:
            async with self.session() as s:
                await s.fetch("select pg_terminate_backend(pid) from unnest($1::int4[]) pid",
                              [pids])
        return [s for s in open_jobs if s.sync.backend_pid is None]

    async def close(self) -> None:
        busy = {s.lane for s in self._sessions}
        for lane in self._idle:
            if lane not in busy:
                with contextlib.suppress(Exception):
                    await lane.run(self.sync.leave_thread)
        for lane in self._lanes:
            lane.stop()
        await asyncio.to_thread(self.sync.close)


async def _listen_thread(conninfo: str, kwargs: dict[str, Any], channel: str,
                         woken: Callable[[str], None]) -> Callable[[], Awaitable[None]]:
    """Listens on a psycopg connection of its own, read on a thread: psycopg's ``notifies()``
    for a sync pool or engine."""
    import psycopg

    loop = asyncio.get_running_loop()
    kwargs = {k: v for k, v in kwargs.items() if k != "autocommit"}
    conn = await asyncio.to_thread(psycopg.connect, conninfo, autocommit=True, **kwargs)
    await asyncio.to_thread(conn.execute, f'listen "{channel}"')
    stopping = threading.Event()

    def receive() -> None:
        try:
            while not stopping.is_set():
                for notify in conn.notifies(timeout=0.5):
                    loop.call_soon_threadsafe(woken, notify.payload)
        except Exception as error:  # noqa: BLE001 - the poll still finds every job
            if not stopping.is_set():
                log.warning("listening for new jobs failed (%s); polling", error)
        finally:
            conn.close()

    thread = threading.Thread(target=receive, name="jobguard-listen", daemon=True)
    thread.start()

    async def stop() -> None:
        stopping.set()
        await asyncio.to_thread(thread.join, 5)

    return stop
