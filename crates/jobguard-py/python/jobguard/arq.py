"""arq: ``guarded(key=..., db=...)``, a job function that runs at most once per key.

::

    async def startup(ctx):
        ctx["db"] = await asyncpg.create_pool(DATABASE_URL)

    @jobguard.arq.guarded(key=lambda order, amount: jobguard.key("credit", order),
                          db=lambda ctx: ctx["db"])
    async def credit(ctx, conn, order, amount):
        await conn.execute("insert into ledger(account, amount) values(7, $1)", amount)
        return {"credited": amount}

    class WorkerSettings:
        functions = [credit]
        on_startup = startup

The wrapper keeps arq's signature, ``credit(ctx, order, amount)``: it opens a transaction on
``db`` (an asyncpg pool, a SQLAlchemy ``AsyncEngine``, a psycopg ``AsyncConnectionPool``, or a
function of ``ctx`` returning one), claims the key and calls the job with the transaction's
connection after ``ctx``. A duplicate does not call the job: it returns the result the first
delivery stored, which arq keeps as this job's result.

Why arq needs it: a job whose worker dies stays in the queue and runs again once its
in-progress marker expires (``job_timeout`` + 10 s), and a job past ``job_timeout`` is
cancelled and retried while its first attempt may have committed. ``_job_id`` dedupes an
enqueue only while the job or its result exists (``keep_result``, an hour by default); after
that, or with another id for the same business operation, the job runs again.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any, Callable

from . import _guarded
from ._guard import DEFAULT_TABLE

__all__ = ["guarded"]

log = logging.getLogger("jobguard.arq")


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    out = fn(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out


def guarded(
    *,
    key: str | Callable[..., str],
    db: Any,
    payload: Any | Callable[..., Any] = None,
    table: str = DEFAULT_TABLE,
    on_duplicate: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wraps an arq job ``fn(ctx, conn, *args, **kwargs)`` into ``job(ctx, *args, **kwargs)``
    that runs ``fn`` in one transaction with its guard row, once per key. ``key`` and
    ``payload`` are values or functions of the job's arguments (without ``ctx``);
    ``on_duplicate(ctx, duplicate, *args, **kwargs)`` (sync or async) is called when a
    delivery finds its key applied."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def job(ctx: dict, *args: Any, **kwargs: Any) -> Any:
            target = db(ctx) if callable(db) else db

            async def body(conn: Any, *a: Any, **k: Any) -> Any:
                return await fn(ctx, conn, *a, **k)

            run = _guarded.guarded(key=key, db=target, payload=payload, table=table)(body)
            outcome = await run(*args, **kwargs)
            if isinstance(outcome, _guarded.Duplicate):
                log.info(
                    "arq job %s (try %s): duplicate delivery, first applied at %s",
                    ctx.get("job_id"), ctx.get("job_try"), outcome.first_applied_at,
                )
                if on_duplicate is not None:
                    await _call(on_duplicate, ctx, outcome, *args, **kwargs)
                return outcome.result
            return outcome.value

        return job

    return decorate
