"""procrastinate behind the bench's contract (see contract.py).

Settings: ``concurrency`` (``App.run_worker_async(concurrency=...)``, 1 by default) and
``pool`` (the ``max_size`` of the psycopg pool ``PsycopgConnector`` makes; psycopg_pool's
default is 4). The worker listens for new jobs (``listen_notify``, on by default). A credit's
ledger row is written on a connection of procrastinate's pool, in a transaction of its own:
procrastinate records the job's end after the task returns.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any

import procrastinate

import contract


class ProcrastinateAdapter(contract.Adapter):
    system = "procrastinate"
    version = importlib.metadata.version("procrastinate")

    def __init__(self, url: str, settings: dict[str, Any]) -> None:
        super().__init__(url, settings)
        pool: dict[str, Any] = {"conninfo": url}
        if "pool" in settings:
            pool.update(min_size=min(4, settings["pool"]), max_size=settings["pool"])
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(**pool))
        self.task: asyncio.Task[Any] | None = None
        started, app = self.started, self.app

        @app.task(name="noop")
        async def noop(n: int) -> None:
            started(n)

        @app.task(name="credit")
        async def credit(n: int, account: int, amount: int) -> None:
            started(n)
            async with app.connector.pool.connection() as conn:
                await conn.execute(contract.INSERT_LEDGER_PSYCOPG, (n, account, amount))

        self.kinds = {"noop": noop, "credit": credit}

    async def open(self) -> None:
        await self.app.open_async()
        if self.role == "worker":
            await self.app.schema_manager.apply_schema_async()

    async def enqueue_bulk(self, kind: str, first: int, count: int) -> None:
        task = self.kinds[kind]
        for start in range(first, first + count, 1000):
            end = min(start + 1000, first + count)
            await task.batch_defer_async(*(contract.args_of(kind, n) for n in range(start, end)))

    async def enqueue_one(self, kind: str, n: int) -> None:
        await self.kinds[kind].defer_async(**contract.args_of(kind, n))

    async def start_worker(self) -> None:
        options: dict[str, Any] = {"wait": True, "install_signal_handlers": False}
        if "concurrency" in self.settings:
            options["concurrency"] = self.settings["concurrency"]
        self.task = asyncio.ensure_future(self.app.run_worker_async(**options))
        await asyncio.sleep(0)

    async def stop_worker(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        self.task = None

    async def pending(self) -> int:
        if self.task is not None and self.task.done():
            self.task.result()
        async with self.app.connector.pool.connection() as conn:
            cur = await conn.execute("select count(*) from procrastinate_jobs "
                                     "where status in ('todo', 'doing')")
            row = await cur.fetchone()
        return int(row[0])

    async def close(self) -> None:
        await self.stop_worker()
        await self.app.close_async()


if __name__ == "__main__":
    contract.main(ProcrastinateAdapter)
