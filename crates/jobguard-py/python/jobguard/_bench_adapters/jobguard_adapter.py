"""jobguard's own Python worker behind the bench's contract (see contract.py).

Settings: ``concurrency`` (the worker's, 10 by default), ``pool`` (the asyncpg pool the
worker runs on; ``concurrency + 2`` by default, as docs/python.md sizes it: a connection per
running job, one for fetches and heartbeats, one to listen) and ``batch_size`` (1 by default;
above 1 both kinds are defined with ``batch=True`` and run in batches when a backlog builds).
A credit claims the key
``credit:<n>`` in the job's own transaction, with the ledger row and the completion.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any

import asyncpg

import jobguard
from jobguard.worker import Worker

import contract


class JobguardAdapter(contract.Adapter):
    system = "jobguard"
    version = importlib.metadata.version("jobguard")

    def __init__(self, url: str, settings: dict[str, Any]) -> None:
        concurrency = int(settings.get("concurrency", 10))
        settings = {"concurrency": concurrency, "pool": int(settings.get("pool", concurrency + 2)),
                    "poll_interval": float(settings.get("poll_interval", 1.0)),
                    "batch_size": int(settings.get("batch_size", 1))}
        super().__init__(url, settings)
        self.pool: Any = None
        self.worker: Worker | None = None
        self.task: asyncio.Task[Any] | None = None
        size = settings["pool"]
        app = self.app = jobguard.App(
            db=lambda: asyncpg.create_pool(url, min_size=size, max_size=size))
        started = self.started
        batch = settings["batch_size"] > 1

        @app.job("noop", batch=batch)
        async def noop(conn: Any, n: int) -> None:
            started(n)

        @app.job("credit", key=lambda n, account, amount: jobguard.key("credit", str(n)),
                 batch=batch)
        async def credit(conn: Any, n: int, account: int, amount: int) -> None:
            started(n)
            await conn.execute(contract.INSERT_LEDGER, n, account, amount)

        self.kinds = {"noop": noop, "credit": credit}

    async def open(self) -> None:
        # The producer's and the orchestrator's connections, apart from the worker's pool: as
        # many as the latency run's producer enqueues on at once (8), as the peers' adapters.
        self.pool = await asyncpg.create_pool(self.url, min_size=1, max_size=8)
        await self.app.migrate()

    async def enqueue_bulk(self, kind: str, first: int, count: int) -> None:
        job = self.kinds[kind]
        for start in range(first, first + count, 1000):
            batch = [contract.args_of(kind, n) for n in range(start, min(start + 1000, first + count))]
            async with self.pool.acquire() as conn, conn.transaction():
                await job.enqueue_many(conn, batch)

    async def enqueue_one(self, kind: str, n: int) -> None:
        # Outside a transaction asyncpg commits each statement: the enqueue is one, as the
        # peers' adapters enqueue.
        async with self.pool.acquire() as conn:
            await self.kinds[kind].enqueue(conn, **contract.args_of(kind, n))

    async def start_worker(self) -> None:
        s = self.settings
        self.worker = Worker(self.app, concurrency=s["concurrency"], handle_signals=False,
                             poll_interval=s["poll_interval"], batch_size=s["batch_size"])
        self.task = asyncio.ensure_future(self.worker.run())
        await asyncio.sleep(0)

    async def stop_worker(self) -> None:
        if self.worker is not None and self.task is not None:
            self.worker.stop()
            await self.task
        self.worker = self.task = None

    async def pending(self) -> int:
        if self.task is not None and self.task.done():
            self.task.result()  # a worker that ended raises its error here
        count: int = await self.pool.fetchval(
            "select count(*) from jobguard_jobs where state in ('available', 'running')")
        return count

    async def close(self) -> None:
        await self.stop_worker()
        if self.pool is not None:
            await self.pool.close()


if __name__ == "__main__":
    contract.main(JobguardAdapter)
