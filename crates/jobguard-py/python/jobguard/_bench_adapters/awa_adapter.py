"""awa's Python SDK (package ``awa-pg``) behind the bench's contract (see contract.py).

awa's worker loop (claiming, heartbeats, completion) runs in Rust on tokio inside the wheel;
Python handlers are called from it. Settings: ``workers`` (``AsyncClient.start([("default",
workers)])``: jobs run at once; the README's quick start says 4) and ``pool``
(``AsyncClient(max_connections=...)``, 10 by default). A credit's ledger row is written with
asyncpg on a pool of the adapter's own, in a transaction of its own: awa completes the job
after the handler returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
from typing import Any

import asyncpg
import awa

import contract


@dataclasses.dataclass
class Noop:
    n: int


@dataclasses.dataclass
class Credit:
    n: int
    account: int
    amount: int


class AwaAdapter(contract.Adapter):
    system = "awa"
    version = importlib.metadata.version("awa-pg")
    types: dict[str, Any] = {"noop": Noop, "credit": Credit}

    def __init__(self, url: str, settings: dict[str, Any]) -> None:
        super().__init__(url, settings)
        self.client: Any = None
        self.server: Any = None
        self.pool: Any = None

    async def open(self) -> None:
        self.client = awa.AsyncClient(self.url, max_connections=4)
        if self.role == "worker":
            await self.client.migrate()
        self.pool = await asyncpg.create_pool(self.url, min_size=1, max_size=8)

    async def enqueue_bulk(self, kind: str, first: int, count: int) -> None:
        for start in range(first, first + count, 1000):
            end = min(start + 1000, first + count)
            await self.client.insert_many_copy(
                [self.types[kind](**contract.args_of(kind, n)) for n in range(start, end)],
                kind=kind, queue="default")

    async def enqueue_one(self, kind: str, n: int) -> None:
        await self.client.insert(self.types[kind](**contract.args_of(kind, n)), kind=kind,
                                 queue="default")

    async def start_worker(self) -> None:
        server = self.server = awa.AsyncClient(self.url,
                                               max_connections=self.settings.get("pool", 10))
        started, pool = self.started, self.pool

        @server.task(Noop, kind="noop", queue="default")
        async def noop(job: Any) -> None:
            started(job.args.n)

        @server.task(Credit, kind="credit", queue="default")
        async def credit(job: Any) -> None:
            started(job.args.n)
            await pool.execute(contract.INSERT_LEDGER, job.args.n, job.args.account,
                               job.args.amount)

        await server.start([("default", self.settings.get("workers", 4))])

    async def stop_worker(self) -> None:
        if self.server is not None:
            await self.server.shutdown()
            await self.server.close()
        self.server = None

    async def pending(self) -> int:
        stats = await self.client.queue_stats()
        return sum(s.available + s.running + s.retryable + s.scheduled for s in stats
                   if s.queue == "default")

    async def close(self) -> None:
        await self.stop_worker()
        if self.client is not None:
            await self.client.close()
        if self.pool is not None:
            await self.pool.close()


if __name__ == "__main__":
    contract.main(AwaAdapter)
