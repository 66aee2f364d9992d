"""``python -m jobguard demo``: the guide's experiment, in Python.

100 credit jobs, each delivered 3 times at once over a pool of 20 connections (asyncpg on
PostgreSQL, sqlite3 connections in threads on SQLite), first by the naive job, which appends a
ledger row on every delivery, then by the job guarded with :func:`jobguard.guard`. The report
has the fields of ``jobguard demo --json``; the run is exactly once when the guarded ledger has
one row per job and the balances add up to the expected total.

The demo drops what it made when it ends: on PostgreSQL everything lives in a schema of its
own, dropped at the end; on SQLite its tables are dropped, and the file too when the demo
created it. A database it cannot reach, or a driver that is not installed, is a
:class:`DemoError`, which ``python -m jobguard demo`` prints as one line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import queue
import sqlite3
import time
import urllib.parse
import uuid
from typing import Any, Awaitable, Callable

from . import _keys
from ._guard import guard, guard_sync
from ._migrate import migrate, migrate_sync

NAIVE_LEDGER = "jobguard_demo_ledger_naive"
GUARDED_LEDGER = "jobguard_demo_ledger_guarded"
GUARD_TABLE = "jobguard_demo_processed_jobs"


class DemoError(Exception):
    """Why the demo could not start: a missing driver, a database it cannot open."""


@dataclasses.dataclass(frozen=True)
class Credit:
    order: str
    account: int
    amount: int

    @property
    def key(self) -> str:
        return _keys.key("credit", self.order)


def credit_for_order(n: int) -> Credit:
    """The Rust demo's credits: the same orders, accounts and amounts."""
    return Credit(f"order-{n}", n % 10 + 1, 100 + (n % 7) * 25)


@dataclasses.dataclass
class RunReport:
    deliveries: int = 0
    effects: int = 0
    applied: int = 0
    duplicates: int = 0
    failed: int = 0
    balance_total: int = 0
    seconds: float = 0.0
    deliveries_per_second: float = 0.0
    first_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if out["first_error"] is None:
            del out["first_error"]
        return out


def redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


async def deliver_all(
    credits: list[Credit], deliveries: int, concurrency: int,
    deliver: Callable[[Credit], Awaitable[bool]],
) -> RunReport:
    """``concurrency`` workers take deliveries from one list in which the copies of each job
    sit next to each other, so different workers pick them up at the same moment."""
    total = len(credits) * deliveries
    report = RunReport(deliveries=total)
    work = iter(range(total))

    async def worker() -> None:
        for i in work:
            try:
                if await deliver(credits[i // deliveries]):
                    report.applied += 1
                else:
                    report.duplicates += 1
            except Exception as error:  # a delivery's failure is counted, not fatal
                report.failed += 1
                report.first_error = report.first_error or f"{type(error).__name__}: {error}"

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    report.seconds = time.perf_counter() - started
    report.deliveries_per_second = total / report.seconds
    return report


class Postgres:
    """An asyncpg pool; the demo's tables and guard functions in a schema of its own, dropped
    when the demo ends."""

    backend = "postgres"

    def __init__(self, url: str, concurrency: int) -> None:
        self.url, self.concurrency = url, concurrency
        self.schema = "jobguard_demo_" + uuid.uuid4().hex[:12]
        self.naive_ledger = f"{self.schema}.{NAIVE_LEDGER}"
        self.guarded_ledger = f"{self.schema}.{GUARDED_LEDGER}"

    async def __aenter__(self) -> "Postgres":
        try:
            import asyncpg
        except ImportError:
            raise DemoError(
                "PostgreSQL needs the asyncpg driver: pip install 'jobguard[asyncpg]'"
            ) from None
        try:
            self.pool = await asyncpg.create_pool(
                self.url, min_size=self.concurrency, max_size=self.concurrency
            )
        except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            raise DemoError(f"cannot connect to {redact(self.url)}: {e}") from None
        try:
            async with self.pool.acquire() as conn:
                await conn.execute(f"create schema {self.schema}")
                for table in (self.naive_ledger, self.guarded_ledger):
                    await conn.execute(
                        f"create table {table} (id bigserial primary key, "
                        "account bigint not null, amount bigint not null)"
                    )
                await migrate(conn, table=GUARD_TABLE, schema=self.schema)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.pool.execute(f"drop schema if exists {self.schema} cascade")
        finally:
            await self.pool.close()

    async def naive(self, credit: Credit) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                f"insert into {self.naive_ledger} (account, amount) values ($1, $2)",
                credit.account, credit.amount,
            )
        return True

    async def guarded(self, credit: Credit) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            async with guard(conn, credit.key, table=GUARD_TABLE, schema=self.schema) as g:
                if g.applied:
                    await conn.execute(
                        f"insert into {self.guarded_ledger} (account, amount) values ($1, $2)",
                        credit.account, credit.amount,
                    )
        return g.applied

    async def read(self, table: str) -> tuple[int, int]:
        row = await self.pool.fetchrow(
            f"select count(*), coalesce(sum(amount), 0) from {self.schema}.{table}"
        )
        return int(row[0]), int(row[1])


class Sqlite:
    """sqlite3 connections in threads: SQLite has one writer at a time, and ``begin
    immediate`` queues the deliveries behind it."""

    backend = "sqlite"

    def __init__(self, path: str, concurrency: int) -> None:
        self.path, self.concurrency = path, concurrency
        self.conns: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self.created_file = not os.path.exists(path)

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, timeout=60, check_same_thread=False
        )
        conn.execute("pragma journal_mode = wal")
        conn.execute("pragma synchronous = normal")
        return conn

    async def __aenter__(self) -> "Sqlite":
        try:
            setup = self.connect()
        except sqlite3.Error as error:
            raise DemoError(f"cannot open the SQLite database {self.path!r}: {error}") from None
        self.conns.put(setup)
        try:
            for table in (NAIVE_LEDGER, GUARDED_LEDGER, GUARD_TABLE):
                setup.execute(f"drop table if exists {table}")
            for table in (NAIVE_LEDGER, GUARDED_LEDGER):
                setup.execute(
                    f"create table {table} (id integer primary key, account integer not null, "
                    "amount integer not null)"
                )
            migrate_sync(setup, table=GUARD_TABLE)
            for _ in range(self.concurrency - 1):
                self.conns.put(self.connect())
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        conns = []
        while not self.conns.empty():
            conns.append(self.conns.get())
        try:
            if self.created_file:
                return
            for table in (NAIVE_LEDGER, GUARDED_LEDGER, GUARD_TABLE):
                conns[0].execute(f"drop table if exists {table}")
        finally:
            for conn in conns:
                conn.close()
            if self.created_file:
                for suffix in ("", "-wal", "-shm"):
                    try:
                        os.remove(self.path + suffix)
                    except FileNotFoundError:
                        pass

    def _in_tx(self, body: Callable[[sqlite3.Connection], bool]) -> bool:
        conn = self.conns.get()
        try:
            conn.execute("begin immediate")
            try:
                out = body(conn)
            except BaseException:
                conn.execute("rollback")
                raise
            conn.execute("commit")
            return out
        finally:
            self.conns.put(conn)

    async def naive(self, credit: Credit) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            conn.execute(
                f"insert into {NAIVE_LEDGER} (account, amount) values (?, ?)",
                (credit.account, credit.amount),
            )
            return True

        return await asyncio.to_thread(self._in_tx, body)

    async def guarded(self, credit: Credit) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            with guard_sync(conn, credit.key, table=GUARD_TABLE) as g:
                if g.applied:
                    conn.execute(
                        f"insert into {GUARDED_LEDGER} (account, amount) values (?, ?)",
                        (credit.account, credit.amount),
                    )
            return g.applied

        return await asyncio.to_thread(self._in_tx, body)

    async def read(self, table: str) -> tuple[int, int]:
        def count() -> tuple[int, int]:
            conn = self.connect()
            try:
                row = conn.execute(
                    f"select count(*), coalesce(sum(amount), 0) from {table}"
                ).fetchone()
            finally:
                conn.close()
            return int(row[0]), int(row[1])

        return await asyncio.to_thread(count)


def database_for(url: str, concurrency: int) -> Postgres | Sqlite:
    if url.startswith(("postgres://", "postgresql://")):
        return Postgres(url, concurrency)
    if url.startswith("sqlite:"):
        path = url.removeprefix("sqlite:").removeprefix("//")
        return Sqlite(path.split("?")[0], concurrency)
    raise DemoError(f"--database-url {url!r}: give postgres://user@host/db or sqlite:path.db")


async def run(url: str, jobs: int = 100, deliveries: int = 3, concurrency: int = 20) -> dict[str, Any]:
    """The experiment; returns the report ``jobguard demo --json`` prints."""
    credits = [credit_for_order(n) for n in range(jobs)]
    expected = sum(c.amount for c in credits)
    started = time.perf_counter()
    async with database_for(url, concurrency) as db:
        naive = await deliver_all(credits, deliveries, concurrency, db.naive)
        naive.effects, naive.balance_total = await db.read(NAIVE_LEDGER)
        guarded = await deliver_all(credits, deliveries, concurrency, db.guarded)
        guarded.effects, guarded.balance_total = await db.read(GUARDED_LEDGER)
    return {
        "backend": db.backend,
        "database": redact(url),
        "jobs": jobs,
        "deliveries": deliveries,
        "concurrency": concurrency,
        "expected_balance_total": expected,
        "naive": naive.to_json(),
        "guarded": guarded.to_json(),
        "exactly_once": guarded.effects == jobs and guarded.balance_total == expected
        and guarded.failed == 0,
        "seconds": time.perf_counter() - started,
    }


def render(report: dict[str, Any]) -> str:
    n, g = report["naive"], report["guarded"]
    lines = [
        f"{report['jobs']} credit jobs, each delivered {report['deliveries']} times at once over "
        f"{report['concurrency']} connections ({report['backend']}: {report['database']})",
        f"  naive:   {n['effects']} ledger rows, balances {n['balance_total']} "
        f"(expected {report['expected_balance_total']})",
        f"  guarded: {g['effects']} ledger rows, balances {g['balance_total']}, "
        f"{g['duplicates']} duplicates skipped",
        "exactly once: " + ("yes" if report["exactly_once"] else "NO"),
    ]
    if g.get("first_error"):
        lines.append(f"  first error: {g['first_error']}")
    return "\n".join(lines)
