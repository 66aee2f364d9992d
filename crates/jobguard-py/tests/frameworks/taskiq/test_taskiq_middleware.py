"""``GuardMetrics`` labels each guarded task's result applied or duplicate (taskiq's in-memory
broker, a real PostgreSQL)."""

from __future__ import annotations

import asyncpg
from taskiq import InMemoryBroker

import jobguard
import jobguard.taskiq


async def test_results_are_labelled_applied_then_duplicate(pg_url):
    pool = await asyncpg.create_pool(pg_url, min_size=1, max_size=2)
    broker = InMemoryBroker().with_middlewares(jobguard.taskiq.GuardMetrics())
    duplicates = []

    @broker.task
    @jobguard.taskiq.guarded(
        key=lambda order: jobguard.key("credit", order), db=pool,
        on_duplicate=lambda dup, order: duplicates.append(order),
    )
    async def credit(conn, order: str) -> dict:
        await conn.execute("insert into ledger values ($1)", order)
        return {"credited": order}

    try:
        async with pool.acquire() as conn:
            await jobguard.migrate(conn)
            await conn.execute("create table ledger (job_key text not null)")
        await broker.startup()
        first = await (await credit.kiq("o-1")).wait_result()
        again = await (await credit.kiq("o-1")).wait_result()
        await broker.shutdown()
        assert first.labels.get("jobguard") == "applied", first
        assert again.labels.get("jobguard") == "duplicate", again
        # The duplicate returns the first delivery's stored result, without running the body.
        assert first.return_value == again.return_value == {"credited": "o-1"}
        assert duplicates == ["o-1"]
        assert await pool.fetchval("select count(*) from ledger") == 1
    finally:
        await pool.close()
