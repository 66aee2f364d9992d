"""taskiq: ``guarded(key=..., db=...)`` under ``@broker.task``, and ``GuardMetrics``.

::

    @broker.task
    @jobguard.taskiq.guarded(key=lambda order, amount: jobguard.key("credit", order),
                             db=lambda: state.pool)
    async def credit(conn, order, amount):
        await conn.execute("insert into ledger(account, amount) values(7, $1)", amount)
        return {"credited": amount}

    broker.add_middlewares(jobguard.taskiq.GuardMetrics())

The task is sent as ``credit.kiq(order, amount)``: the wrapper shows taskiq the signature
without ``conn``, opens a transaction on ``db`` (an asyncpg pool, a SQLAlchemy
``AsyncEngine``, a psycopg ``AsyncConnectionPool``, or a function of no arguments returning
one, for a pool made at worker startup), claims the key and calls the task with the
transaction's connection first. A duplicate does not call it and returns the stored result.

With ``migrate=True`` (the default) the first delivery in a process creates the guard table
on ``db`` if it is missing; a database user that may not create tables gets one line at error,
and the task raises ``NotMigrated``, sent again as below until the table is migrated by another
user.

A guard has to wrap the task, not sit in a middleware: taskiq's middlewares see a message
before and after it runs, but cannot skip it. ``GuardMetrics`` is the middleware's part: it
labels each result ``jobguard=applied|duplicate`` and logs duplicates; the outcome counter
``jobguard_outcomes_total`` is counted by the guard itself.

A delivery whose transaction did not commit for a transient reason is sent again: a database
error that may pass (serialization failure, deadlock, lock timeout, lost or terminated
connection, SQLite busy), or the task's ``timeout`` label running out. The run's budget is 90%
of the ``timeout`` label (or ``timeout=`` given here), so that it ends before taskiq's own
timeout, which would fail the task (taskiq does not retry a failure unless a retry middleware
is set up and the task labelled for it). The wrapper then waits
``min(retry_backoff * 2**retries, retry_backoff_max)`` seconds (its upper half random, cut to
what is left of the budget), sends the same message again (the same task id, with the label
``jobguard_retries`` one higher) and ends this delivery with ``NoResultError``: no result is
stored for it and it is acked; the new message runs as a new delivery. The retry is counted
(``jobguard_job_retries_total{outcome="retried"}``) once it was sent. taskiq acks a delivery
whatever the task raises, so a send that fails is tried again, three times in all, half a second
apart; if none gets through the job is reported lost (logged at error with its key, counted as
``outcome="lost"``: not applied, not run again) and fails as taskiq fails any task. After
``max_retries`` (default 5) the task is reported (logged at error with its key, counted as
``jobguard_job_retries_total{outcome="exhausted"}``) and fails as taskiq fails any task. A
delivery cancelled by taskiq's own timeout after the budget (the worker was stopped past both)
is sent again the same way before the cancellation goes on. Any other exception is taskiq's
business: the task fails, and a retry middleware (``SmartRetryMiddleware`` with
``retry_on_error=True``) retries it if there is one; the wrapper's own retries end in
``NoResultError``, which that middleware skips, so a job is never sent again twice.

Delivery settings: keep taskiq's default ``--ack-type when_saved`` (or ``when_executed``);
``when_received`` acks before the task runs, so a worker that dies loses the job. On Redis
Streams (``RedisStreamBroker``), a dead worker's unacked messages are reclaimed after
``idle_timeout`` (10 minutes by default) and only while new messages arrive: keep it longer than
the longest task.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
from typing import Any, Callable

import anyio
from taskiq import Context, TaskiqDepends, TaskiqMessage, TaskiqMiddleware, TaskiqResult
from taskiq.exceptions import NoResultError
from taskiq.labels import prepare_label

from . import _guarded, _migrate_once, _retry
from ._guard import DEFAULT_TABLE
from ._outcome import Duplicate

__all__ = ["GuardMetrics", "guarded"]

log = logging.getLogger("jobguard.taskiq")

#: The label counting the wrapper's retries of a message.
RETRIES_LABEL = "jobguard_retries"
# The share of the task's `timeout` label the run may take: the rest is for the rollback, the
# backoff and sending the message again before taskiq's timeout cancels the task.
_BUDGET_SHARE = 0.9
# How many times the retry's message is sent before the job is reported lost, and the pause
# after a send that failed.
_SEND_ATTEMPTS = 3
_SEND_PAUSE_S = 0.5
# The hidden parameter through which taskiq hands the wrapper its message and broker.
_CONTEXT = "jobguard_context"

# The outcome of the guarded task running in this context, for GuardMetrics.
_outcome: contextvars.ContextVar[Any] = contextvars.ContextVar("jobguard_taskiq_outcome")


def guarded(
    *,
    key: str | Callable[..., str],
    db: Any,
    payload: Any | Callable[..., Any] = None,
    table: str = DEFAULT_TABLE,
    on_duplicate: Callable[..., Any] | None = None,
    timeout: float | None = None,
    max_retries: int = 5,
    retry_backoff: float = 1.0,
    retry_backoff_max: float = 60.0,
    migrate: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wraps a task ``fn(conn, *args, **kwargs)`` into ``task(*args, **kwargs)`` that runs
    ``fn`` in one transaction with its guard row, once per key; put it under
    ``@broker.task``. ``key`` and ``payload`` are values or functions of the task's
    arguments; ``on_duplicate(duplicate, *args, **kwargs)`` (sync or async) is called when a
    delivery finds its key applied. A delivery that did not commit for a transient reason, or
    ran past its budget (``timeout`` seconds, else 90% of the task's ``timeout`` label, else
    none), is sent again up to ``max_retries`` times; see the module. With ``migrate``, the
    first delivery in a process creates the guard table on ``db`` (``jobguard.migrate``) if it
    is missing."""
    policy = _retry.RetryPolicy(max_retries, retry_backoff, retry_backoff_max)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())
        if not params:
            raise TypeError(f"{fn.__qualname__} must take the connection as its first argument")

        @functools.wraps(fn)
        async def task(*args: Any, **kwargs: Any) -> Any:
            context = kwargs.pop(_CONTEXT, None)
            if not isinstance(context, Context):
                context = None  # called directly, not by a worker: nothing to send again
            budget = _budget(timeout, context)
            target = db() if callable(db) else db
            guarded_fn = _guarded.guarded(key=key, db=target, payload=payload, table=table)(fn)

            async def run(*a: Any, **k: Any) -> Any:
                if not migrate:
                    return await guarded_fn(*a, **k)
                return await _migrate_once.run_migrated(target, table, lambda: guarded_fn(*a, **k))

            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                if budget is None:
                    outcome = await run(*args, **kwargs)
                else:
                    outcome = await asyncio.wait_for(run(*args, **kwargs), budget)
            except (Exception, asyncio.CancelledError) as exc:
                spent = loop.time() - started
                over = budget is not None and spent >= budget
                if isinstance(exc, (asyncio.TimeoutError, asyncio.CancelledError)):
                    reason = f"ran past its {budget:.1f}s budget" if over else None
                else:
                    reason = _retry.transient_reason(exc)
                if reason is None or context is None:
                    raise
                left = None if budget is None else max(budget - spent, 0.0)
                with anyio.CancelScope(shield=True):
                    again = await _send_again(context, policy, key, args, kwargs, reason, left)
                if not again or isinstance(exc, asyncio.CancelledError):
                    raise
                raise NoResultError from exc
            holder = _outcome.get(None)
            if holder is not None:
                holder.append(outcome)
            if isinstance(outcome, Duplicate):
                if on_duplicate is not None:
                    out = on_duplicate(outcome, *args, **kwargs)
                    if inspect.isawaitable(out):
                        await out
                return outcome.result
            return outcome.value

        # taskiq reads the task's parameters from its signature: the caller's, without `conn`,
        # and a keyword-only one through which it passes the wrapper the delivery's Context.
        hidden = inspect.Parameter(
            _CONTEXT, inspect.Parameter.KEYWORD_ONLY, default=TaskiqDepends(Context),
        )
        rest = params[1:]
        at = len(rest)
        if rest and rest[-1].kind is inspect.Parameter.VAR_KEYWORD:
            at -= 1
        task.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*rest[:at], hidden, *rest[at:]]
        )
        return task

    return decorate


def _budget(timeout: float | None, context: Context | None) -> float | None:
    if timeout is not None:
        return timeout
    label = None if context is None else context.message.labels.get("timeout")
    if label is None:
        return None
    return float(label) * _BUDGET_SHARE


async def _send_again(
    context: Context, policy: _retry.RetryPolicy, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
    reason: str, left: float | None,
) -> bool:
    """Sends the delivery's message again after the backoff, and counts the retry once it
    was sent; false when the retries are spent or the message could not be sent (the task is
    reported either way)."""
    message = context.message
    retries = int(message.labels.get(RETRIES_LABEL, 0))
    job = f"task {message.task_name}[{message.task_id}]"
    job_key = _retry.resolve_key(key, args, kwargs)
    if retries >= policy.max_retries:
        _retry.exhausted(log, "taskiq", job, job_key, retries, reason)
        return False
    delay = policy.delay(retries)
    if left is not None:
        delay = min(delay, left)
    await asyncio.sleep(delay)
    # The labels as a sender writes them: the received ones were parsed into their types.
    labels: dict[str, Any] = {}
    types: dict[str, int] = {}
    for name, value in {**message.labels, RETRIES_LABEL: retries + 1}.items():
        labels[name], types[name] = prepare_label(value)
    again = context.broker.formatter.dumps(
        message.model_copy(update={"labels": labels, "labels_types": types})
    )
    # taskiq acks this delivery whatever the task raises: the retry has to be sent, or the job
    # is lost. A send that fails is tried again, a few times, a moment apart.
    for attempt in range(_SEND_ATTEMPTS):
        try:
            await context.broker.kick(again)
        except Exception as error:  # noqa: BLE001 - any failure to publish
            if attempt + 1 == _SEND_ATTEMPTS:
                _retry.lost(log, "taskiq", job, job_key, reason, error)
                return False
            log.warning(
                "%s: sending the retry of job key %s failed (%r); trying again in %.1fs",
                job, job_key, error, _SEND_PAUSE_S,
            )
            await asyncio.sleep(_SEND_PAUSE_S)
        else:
            break
    _retry.retrying(log, "taskiq", job, job_key, retries, delay, reason)
    return True


class GuardMetrics(TaskiqMiddleware):
    """Labels each guarded task's result ``jobguard=applied`` or ``jobguard=duplicate`` and
    logs duplicates, with the task's name and id."""

    def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        # The receiver runs each message in an asyncio task of its own: this list is the
        # message's, and the guard appends its outcome to it.
        _outcome.set([])
        return message

    def post_execute(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        outcomes = _outcome.get(None)
        if not outcomes:
            return
        outcome = outcomes[-1]
        result.labels["jobguard"] = "applied" if outcome.applied else "duplicate"
        if outcome.duplicate:
            log.info(
                "task %s[%s]: duplicate delivery, first applied at %s",
                message.task_name, message.task_id, outcome.first_applied_at,
            )
