"""Oban for Python (package ``oban``) behind the bench's contract (see contract.py).

Settings: ``limit`` (the ``default`` queue's limit in ``Oban(queues={"default": limit})``: the
jobs it runs at once; a queue has no default, the README's example says 10) and ``pool`` (the
``max_size`` of ``Oban.create_pool``, 10 by default). A credit's ledger row is written on a
connection of that pool, in a transaction of its own: Oban acknowledges finished jobs after
they return, in batches.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import itertools
from typing import Any

from oban import Oban, worker

import contract

_names = itertools.count()


class ObanAdapter(contract.Adapter):
    system = "oban"
    version = importlib.metadata.version("oban")

    def __init__(self, url: str, settings: dict[str, Any]) -> None:
        super().__init__(url, settings)
        self.pool: Any = None
        self.client: Any = None
        self.server: Any = None
        started, adapter = self.started, self

        @worker(queue="default")
        class Noop:
            async def process(self, job: Any) -> None:
                started(job.args["n"])

        @worker(queue="default")
        class Credit:
            async def process(self, job: Any) -> None:
                args = job.args
                started(args["n"])
                async with adapter.pool.connection() as conn:
                    await conn.execute(contract.INSERT_LEDGER_PSYCOPG,
                                       (args["n"], args["account"], args["amount"]))

        self.kinds: dict[str, Any] = {"noop": Noop, "credit": Credit}

    async def open(self) -> None:
        from oban.schema import install

        self.pool = await Oban.create_pool(self.url, max_size=self.settings.get("pool"))
        if self.role == "worker":
            await install(self.pool)
        self.client = Oban(pool=self.pool, name="BenchClient")
        await self.client.start()

    async def enqueue_bulk(self, kind: str, first: int, count: int) -> None:
        job = self.kinds[kind]
        for start in range(first, first + count, 1000):
            end = min(start + 1000, first + count)
            await self.client.enqueue_many([job.new(contract.args_of(kind, n))
                                            for n in range(start, end)])

    async def enqueue_one(self, kind: str, n: int) -> None:
        await self.client.enqueue(self.kinds[kind].new(contract.args_of(kind, n)))

    async def start_worker(self) -> None:
        self.server = Oban(pool=self.pool, name=f"BenchWorker{next(_names)}",
                           queues={"default": self.settings.get("limit", 10)})
        await self.server.start()

    async def stop_worker(self) -> None:
        if self.server is not None:
            await self.server.stop()
        self.server = None

    async def pending(self) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "select count(*) from oban_jobs "
                "where state in ('available', 'scheduled', 'executing', 'retryable')")
            row = await cur.fetchone()
        return int(row[0])

    async def close(self) -> None:
        await self.stop_worker()
        if self.client is not None:
            await self.client.stop()
        if self.pool is not None:
            await self.pool.close()


if __name__ == "__main__":
    contract.main(ObanAdapter)
