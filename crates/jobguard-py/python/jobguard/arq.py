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

With ``migrate=True`` (the default) the first run in a process creates the guard table on
``db`` if it is missing; a database user that may not create tables gets one line at error, and
the job raises ``NotMigrated``, retried as below until the table is migrated by another user.

Why arq needs it: a job whose worker dies stays in the queue and runs again once its
in-progress marker expires (``job_timeout`` + 10 s), while its first attempt may have committed.
``_job_id`` dedupes an enqueue only while the job or its result exists (``keep_result``, an hour
by default); after that, or with another id for the same business operation, the job runs again.

A run whose transaction did not commit for a transient reason is run again: a database error
that may pass (serialization failure, deadlock, lock timeout, lost or terminated connection,
SQLite busy), or the run's own time budget ``timeout`` (default 270 s) running out. The wrapper
raises ``arq.worker.Retry(defer=...)``, which arq re-enqueues, after
``min(retry_backoff * 2**(job_try - 1), retry_backoff_max)`` seconds (its upper half random),
until try ``max_tries`` (default 5, arq's own default: keep it at most the function's arq
``max_tries``); a transient failure on that try is reported (logged at error with its key,
counted as ``jobguard_job_retries_total{outcome="exhausted"}``) and fails the job as arq fails
any. Any other exception fails the job, as arq does (no retry).

``timeout`` must be below the worker's ``job_timeout`` (arq's default 300 s) by a margin for the
rollback: arq fails a job that reaches ``job_timeout`` and never runs it again (arq 0.28), so
the budget has to run out first. It also bounds a run that waits on another delivery's
uncommitted guard row, e.g. a worker stopped mid-transaction (SIGSTOP, a frozen VM) whose job
was handed to another worker.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from typing import Any, Callable

from arq.worker import Retry

from . import _guarded, _migrate_once, _retry
from ._guard import DEFAULT_TABLE
from ._outcome import Duplicate

__all__ = ["guarded"]

log = logging.getLogger("jobguard.arq")

#: The default time budget of one run, in seconds: below arq's default ``job_timeout`` (300 s).
DEFAULT_TIMEOUT_S = 270.0


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    out = fn(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out


def _reason(exc: BaseException, over_budget: bool, timeout: float | None) -> str | None:
    """Why this run may commit when run again, or ``None``.

    A run past its budget is cancelled by the budget's ``wait_for`` (a TimeoutError here) or,
    when the worker's own ``job_timeout`` fired in the same loop turn (after a SIGSTOP, both
    deadlines have passed when the process continues), by arq (a CancelledError): once the
    budget is spent, either is the timeout. A cancellation before it (an abort, a shutdown) is
    arq's, and left to it."""
    if isinstance(exc, (asyncio.TimeoutError, asyncio.CancelledError)):
        return f"ran past its {timeout}s budget" if over_budget else None
    return _retry.transient_reason(exc)


def guarded(
    *,
    key: str | Callable[..., str],
    db: Any,
    payload: Any | Callable[..., Any] = None,
    table: str = DEFAULT_TABLE,
    on_duplicate: Callable[..., Any] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    max_tries: int = 5,
    retry_backoff: float = 1.0,
    retry_backoff_max: float = 60.0,
    migrate: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wraps an arq job ``fn(ctx, conn, *args, **kwargs)`` into ``job(ctx, *args, **kwargs)``
    that runs ``fn`` in one transaction with its guard row, once per key. ``key`` and
    ``payload`` are values or functions of the job's arguments (without ``ctx``);
    ``on_duplicate(ctx, duplicate, *args, **kwargs)`` (sync or async) is called when a
    delivery finds its key applied. A run that did not commit for a transient reason, or ran
    past ``timeout`` seconds (``None``: no budget), raises ``arq.worker.Retry`` until try
    ``max_tries``; see the module. With ``migrate``, the first run in a process creates the
    guard table on ``db`` (``jobguard.migrate``) if it is missing."""
    policy = _retry.RetryPolicy(max(max_tries - 1, 0), retry_backoff, retry_backoff_max)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def job(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            target = db(ctx) if callable(db) else db

            async def body(conn: Any, *a: Any, **k: Any) -> Any:
                return await fn(ctx, conn, *a, **k)

            guarded_body = _guarded.guarded(key=key, db=target, payload=payload, table=table)(body)

            async def run(*a: Any, **k: Any) -> Any:
                if not migrate:
                    return await guarded_body(*a, **k)
                return await _migrate_once.run_migrated(
                    target, table, lambda: guarded_body(*a, **k)
                )

            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                if timeout is None:
                    outcome = await run(*args, **kwargs)
                else:
                    outcome = await asyncio.wait_for(run(*args, **kwargs), timeout)
            except (Exception, asyncio.CancelledError) as exc:
                over_budget = timeout is not None and loop.time() - started >= timeout
                reason = _reason(exc, over_budget, timeout)
                if reason is None:
                    raise
                retries = int(ctx.get("job_try") or 1) - 1
                job_name = f"arq job {ctx.get('job_id')} (try {retries + 1})"
                job_key = _retry.resolve_key(key, args, kwargs)
                if retries >= policy.max_retries:
                    _retry.exhausted(log, "arq", job_name, job_key, retries, reason)
                    raise
                delay = policy.delay(retries)
                _retry.retrying(log, "arq", job_name, job_key, retries, delay, reason)
                raise Retry(defer=delay) from exc
            if isinstance(outcome, Duplicate):
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
