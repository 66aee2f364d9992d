"""pgqueuer behind the bench's contract (see contract.py).

Settings: ``batch_size`` (``QueueManager.run(batch_size=...)``, 10 by default: jobs dequeued
per round trip, and the size of the buffer of finished jobs written back in one statement) and
``pool`` (absent: one asyncpg connection through ``AsyncpgDriver``, as the README's example;
a number: ``AsyncpgPoolDriver`` on an asyncpg pool of that size). Entrypoints have no
concurrency limit (pgqueuer's default). A credit's ledger row is written on a connection of a
pool of the adapter's own, in a transaction of its own: pgqueuer records the job's end after
the entrypoint returns.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
from typing import Any

import asyncpg
from pgqueuer import AsyncpgDriver, Job, PgQueuer
from pgqueuer.queries import Queries

import contract


class PgqueuerAdapter(contract.Adapter):
    system = "pgqueuer"
    version = importlib.metadata.version("pgqueuer")

    def __init__(self, url: str, settings: dict[str, Any]) -> None:
        super().__init__(url, settings)
        self.task: asyncio.Task[Any] | None = None
        self.qm: PgQueuer | None = None
        self.conn: Any = None
        self.pool: Any = None

    async def open(self) -> None:
        self.pool = await asyncpg.create_pool(self.url, min_size=1, max_size=8)
        if self.role == "worker":
            async with self.pool.acquire() as conn:
                await Queries(AsyncpgDriver(conn)).install()

    def _queuer(self) -> PgQueuer:
        if "pool" in self.settings:
            qm = PgQueuer.from_asyncpg_pool(self.conn)
        else:
            qm = PgQueuer.from_asyncpg_connection(self.conn)
        started, pool = self.started, self.pool

        @qm.entrypoint("noop")
        async def noop(job: Job) -> None:
            started(json.loads(job.payload)["n"])

        @qm.entrypoint("credit")
        async def credit(job: Job) -> None:
            args = json.loads(job.payload)
            started(args["n"])
            async with pool.acquire() as conn:
                await conn.execute(contract.INSERT_LEDGER, args["n"], args["account"],
                                   args["amount"])

        return qm

    async def enqueue_bulk(self, kind: str, first: int, count: int) -> None:
        async with self.pool.acquire() as conn:
            queries = Queries(AsyncpgDriver(conn))
            for start in range(first, first + count, 1000):
                ns = range(start, min(start + 1000, first + count))
                await queries.enqueue([kind] * len(ns),
                                      [json.dumps(contract.args_of(kind, n)).encode() for n in ns],
                                      [0] * len(ns))

    async def enqueue_one(self, kind: str, n: int) -> None:
        async with self.pool.acquire() as conn:
            await Queries(AsyncpgDriver(conn)).enqueue(
                kind, json.dumps(contract.args_of(kind, n)).encode(), 0)

    async def start_worker(self) -> None:
        if "pool" in self.settings:
            self.conn = await asyncpg.create_pool(self.url, min_size=self.settings["pool"],
                                                  max_size=self.settings["pool"])
        else:
            self.conn = await asyncpg.connect(self.url)
        self.qm = self._queuer()
        self.task = asyncio.ensure_future(
            self.qm.run(batch_size=self.settings.get("batch_size", 10)))
        await asyncio.sleep(0)

    async def stop_worker(self) -> None:
        if self.qm is not None and self.task is not None:
            self.qm.shutdown.set()
            await self.task
        if self.conn is not None:
            await self.conn.close()
        self.qm = self.task = self.conn = None

    async def pending(self) -> int:
        if self.task is not None and self.task.done():
            self.task.result()
        count: int = await self.pool.fetchval("select count(*) from pgqueuer")
        return count

    async def close(self) -> None:
        await self.stop_worker()
        await self.pool.close()


if __name__ == "__main__":
    contract.main(PgqueuerAdapter)
