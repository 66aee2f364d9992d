"""``python -m jobguard bench``: the guide's guarded credit through asyncpg, the guide's own
hand-written guard SQL against :func:`jobguard.guard`, side by side in one run.

10,000 jobs, each delivered 3 times at once over a pool of 20 connections, per variant and
round. Within a round the jobs go in chunks (500 by default), each chunk through both variants
in alternating order (A B, B A, ...), so that whatever else the machine is doing weighs on both
alike; each variant's tables keep growing over the round, as a real guard table does. The
report is each variant's deliveries per second over all its chunks, and the ratio
jobguard / hand-written.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ._demo import Credit, credit_for_order, deliver_all, redact
from ._guard import guard, migrate

HAND_TABLE = "jobguard_bench_processed_jobs_guide"
HAND_LEDGER = "jobguard_bench_ledger_guide"
GUARD_TABLE = "jobguard_bench_processed_jobs"
GUARD_LEDGER = "jobguard_bench_ledger_jobguard"


async def _setup(pool: Any) -> None:
    async with pool.acquire() as conn:
        for table in (HAND_TABLE, HAND_LEDGER, GUARD_TABLE, GUARD_LEDGER):
            await conn.execute(f"drop table if exists {table} cascade")
        # The guide's schema, as it prints it.
        await conn.execute(
            f"create table {HAND_TABLE} (job_key text primary key, "
            "done_at timestamptz not null default now())"
        )
        for ledger in (HAND_LEDGER, GUARD_LEDGER):
            await conn.execute(
                f"create table {ledger} (id bigserial primary key, account bigint not null, "
                "amount bigint not null)"
            )
        await migrate(conn, table=GUARD_TABLE)


async def _truncate(pool: Any) -> None:
    # No `vacuum analyze` of the emptied tables: statistics saying "empty" would let the
    # claim function cache a plan that reads the key's row by a scan of the whole table.
    await pool.execute(f"truncate {HAND_TABLE}, {HAND_LEDGER}, {GUARD_TABLE}, {GUARD_LEDGER}")


def _variants(pool: Any) -> dict[str, Any]:
    async def hand_written(credit: Credit) -> bool:
        # The guide's credit_account, word for word but for the table names.
        async with pool.acquire() as conn, conn.transaction():
            claimed = await conn.fetchval(
                f"insert into {HAND_TABLE}(job_key) values($1) on conflict do nothing "
                "returning job_key",
                credit.key,
            )
            if claimed is None:
                return False
            await conn.execute(
                f"insert into {HAND_LEDGER}(account, amount) values($1, $2)",
                credit.account, credit.amount,
            )
            return True

    async def jobguard_guard(credit: Credit) -> bool:
        async with pool.acquire() as conn, conn.transaction():
            async with guard(conn, credit.key, table=GUARD_TABLE) as g:
                if g.applied:
                    await conn.execute(
                        f"insert into {GUARD_LEDGER}(account, amount) values($1, $2)",
                        credit.account, credit.amount,
                    )
            return g.applied

    return {"hand_written": hand_written, "jobguard": jobguard_guard}


async def run(
    url: str, jobs: int = 10_000, deliveries: int = 3, concurrency: int = 20, rounds: int = 2,
    chunk: int = 500,
) -> dict[str, Any]:
    import asyncpg

    credits = [credit_for_order(n) for n in range(jobs)]
    pool = await asyncpg.create_pool(url, min_size=concurrency, max_size=concurrency)
    try:
        await _setup(pool)
        variants = _variants(pool)
        # Warm-up: statements prepared on every connection, caches filled.
        warm = credits[: min(jobs, 200)]
        for deliver in variants.values():
            await deliver_all(warm, deliveries, concurrency, deliver)
        totals: dict[str, dict[str, Any]] = {name: {"deliveries": 0, "seconds": 0.0, "applied": 0, "duplicates": 0,
                         "failed": 0, "rounds": []} for name in variants}
        names = list(variants)
        for _ in range(rounds):
            await _truncate(pool)
            spent = dict.fromkeys(names, 0.0)
            for i, start in enumerate(range(0, jobs, chunk)):
                part = credits[start:start + chunk]
                for name in names if i % 2 == 0 else names[::-1]:
                    report = await deliver_all(part, deliveries, concurrency, variants[name])
                    t = totals[name]
                    t["deliveries"] += report.deliveries
                    t["seconds"] += report.seconds
                    t["applied"] += report.applied
                    t["duplicates"] += report.duplicates
                    t["failed"] += report.failed
                    spent[name] += report.seconds
            for name in names:
                totals[name]["rounds"].append(round(jobs * deliveries / spent[name], 1))
    finally:
        await pool.close()
    for t in totals.values():
        t["deliveries_per_second"] = t["deliveries"] / t["seconds"]
    ratio = totals["jobguard"]["deliveries_per_second"] / totals["hand_written"]["deliveries_per_second"]
    return {
        "database": redact(url),
        "jobs": jobs,
        "deliveries": deliveries,
        "concurrency": concurrency,
        "rounds": rounds,
        "chunk": chunk,
        "hand_written": totals["hand_written"],
        "jobguard": totals["jobguard"],
        "ratio": ratio,
        "target": 0.95,
        "meets_target": ratio >= 0.95,
    }


def render(report: dict[str, Any]) -> str:
    h, j = report["hand_written"], report["jobguard"]
    return "\n".join([
        f"{report['jobs']} jobs x {report['deliveries']} deliveries over {report['concurrency']} "
        f"asyncpg connections, {report['rounds']} rounds each ({report['database']})",
        f"  guide's hand-written guard: {h['deliveries_per_second']:9.0f} deliveries/s "
        f"(rounds {h['rounds']})",
        f"  jobguard.guard:             {j['deliveries_per_second']:9.0f} deliveries/s "
        f"(rounds {j['rounds']})",
        f"  ratio {report['ratio']:.3f} (target >= {report['target']})",
    ])


