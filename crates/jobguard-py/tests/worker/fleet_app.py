"""The Python half of a mixed fleet: a ``deposit`` kind, which the Rust ``jobguard worker``
does not run, appending to ``worker_ledger``; the Rust workers run the built-in ``credit``
on the same queue. ``JOBGUARD_TEST_DRIVER`` and ``DATABASE_URL`` as for ``ledger_app``;
``JOBGUARD_TEST_CREDIT_PAUSE`` is how long a deposit waits after its insert (seconds)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import jobguard
from ledger_app import insert, pool_factory

KIND = "deposit"

app = jobguard.App(db=pool_factory(os.environ["JOBGUARD_TEST_DRIVER"], os.environ["DATABASE_URL"]))


@app.job(KIND, key=lambda order, amount: jobguard.key(KIND, order))
async def deposit(conn: Any, order: str, amount: int) -> None:
    await insert(conn, "insert into worker_ledger (job_key, amount) values ($1, $2)",
                 jobguard.key(KIND, order), amount)
    pause = float(os.environ.get("JOBGUARD_TEST_CREDIT_PAUSE", "0"))
    if pause:  # a commit that a kill can land before
        await asyncio.sleep(pause)
