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
SQLite busy), or the run's time budget running out. The wrapper
raises ``arq.worker.Retry(defer=...)``, which arq re-enqueues, after
``min(retry_backoff * 2**(job_try - 1), retry_backoff_max)`` seconds (its upper half random),
until try ``max_tries`` (default 5, arq's own default: keep it at most the function's arq
``max_tries``); a transient failure on that try is reported (logged at error with its key,
counted as ``jobguard_job_retries_total{outcome="exhausted"}``) and fails the job as arq fails
any. Any other exception fails the job, as arq does (no retry).

The budget is ``timeout`` (default 270 s), cut to 90% of the timeout arq runs the job under (the
function's arq ``timeout``, else the worker's ``job_timeout``, read from the worker when the run
starts): arq fails a job that reaches its timeout and never runs it again (arq 0.28), so the
budget has to run out first, with time left for the rollback. A ``job_timeout`` of 2 s gives a
budget of 1.8 s whatever ``timeout`` says. The budget also bounds a run that waits on another
delivery's uncommitted guard row, e.g. a worker stopped mid-transaction (SIGSTOP, a frozen VM)
whose job was handed to another worker.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from typing import Any, Callable

from arq.worker import Retry, Worker

from . import _guarded, _migrate_once, _retry
from ._guard import DEFAULT_TABLE
from ._outcome import Duplicate

__all__ = ["guarded"]

log = logging.getLogger("jobguard.arq")

#: The default time budget of one run, in seconds: 90% of arq's default ``job_timeout`` (300 s).
DEFAULT_TIMEOUT_S = 270.0
# The share of arq's timeout for the job that the run may take: the rest is for the rollback
# and raising Retry before arq cancels the job, which it would fail for good.
_BUDGET_SHARE = 0.9

_unknown_timeout_logged = False


def _arq_timeout(job_id: Any) -> float | None:
    """The timeout arq runs the job ``job_id`` under (the function's ``timeout``, else the
    worker's ``job_timeout``), or ``None`` when it cannot be read.

    arq hands a job no reference to its worker or its timeout: they are read from the worker's
    ``run_job`` that started the job (the task awaiting it, with locals ``self``, ``job_id``
    and ``timeout_s`` in arq 0.28)."""
    for task in asyncio.all_tasks():
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None)
        frame = getattr(coro, "cr_frame", None)
        if code is None or frame is None or code.co_name != "run_job":
            continue
        try:
            local = frame.f_locals
            if local.get("job_id") != job_id or not isinstance(local.get("self"), Worker):
                continue
            value = local.get("timeout_s")
            if value is None:
                value = getattr(local["self"], "job_timeout_s", None)
            return float(value) if isinstance(value, (int, float)) and value > 0 else None
        except Exception:  # noqa: BLE001 - another arq: the budget stays the wrapper's own
            return None
    return None


def _budget(timeout: float | None, job_id: Any) -> float | None:
    """The run's budget: ``timeout``, cut to 90% of arq's timeout for the job."""
    global _unknown_timeout_logged
    arq_timeout = _arq_timeout(job_id) if job_id is not None else None
    if arq_timeout is None:
        if job_id is not None and not _unknown_timeout_logged:
            _unknown_timeout_logged = True
            log.warning(
                "arq's job timeout could not be read from its worker: the budget is timeout=%s; "
                "keep it below job_timeout",
                timeout,
            )
        return timeout
    cap = arq_timeout * _BUDGET_SHARE
    return cap if timeout is None else min(timeout, cap)


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    out = fn(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out


def _reason(exc: BaseException, over_budget: bool, budget: float | None) -> str | None:
    """Why this run may commit when run again, or ``None``.

    A run past its budget is cancelled by the budget's ``wait_for`` (a TimeoutError here) or,
    when the worker's own ``job_timeout`` fired in the same loop turn (after a SIGSTOP, both
    deadlines have passed when the process continues), by arq (a CancelledError): once the
    budget is spent, either is the timeout. A cancellation before it (an abort, a shutdown) is
    arq's, and left to it."""
    if isinstance(exc, (asyncio.TimeoutError, asyncio.CancelledError)):
        return f"ran past its {budget:.1f}s budget" if over_budget else None
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
    past its budget (``timeout`` seconds, at most 90% of arq's timeout for the job; ``None``:
    that share alone), raises ``arq.worker.Retry`` until try ``max_tries``; see the module.
    With ``migrate``, the first run in a process creates the guard table on ``db``
    (``jobguard.migrate``) if it is missing."""
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
            budget = _budget(timeout, ctx.get("job_id"))
            try:
                if budget is None:
                    outcome = await run(*args, **kwargs)
                else:
                    outcome = await asyncio.wait_for(run(*args, **kwargs), budget)
            except (Exception, asyncio.CancelledError) as exc:
                over_budget = budget is not None and loop.time() - started >= budget
                reason = _reason(exc, over_budget, budget)
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
