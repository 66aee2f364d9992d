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

A guard has to wrap the task, not sit in a middleware: taskiq's middlewares see a message
before and after it runs, but cannot skip it. ``GuardMetrics`` is the middleware's part: it
labels each result ``jobguard=applied|duplicate`` and logs duplicates; the outcome counter
``jobguard_outcomes_total`` is counted by the guard itself.

Delivery settings: keep taskiq's default ``--ack-type when_saved`` (or ``when_executed``);
``when_received`` acks before the task runs, so a worker that dies loses the job. On Redis
Streams (``RedisStreamBroker``), a dead worker's unacked messages are reclaimed after
``idle_timeout`` (10 minutes by default) and only while new messages arrive: keep it longer than
the longest task.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from typing import Any, Callable

from taskiq import TaskiqMessage, TaskiqMiddleware, TaskiqResult

from . import _guarded
from ._guard import DEFAULT_TABLE

__all__ = ["GuardMetrics", "guarded"]

log = logging.getLogger("jobguard.taskiq")

# The outcome of the guarded task running in this context, for GuardMetrics.
_outcome: contextvars.ContextVar[Any] = contextvars.ContextVar("jobguard_taskiq_outcome")


def guarded(
    *,
    key: str | Callable[..., str],
    db: Any,
    payload: Any | Callable[..., Any] = None,
    table: str = DEFAULT_TABLE,
    on_duplicate: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wraps a task ``fn(conn, *args, **kwargs)`` into ``task(*args, **kwargs)`` that runs
    ``fn`` in one transaction with its guard row, once per key; put it under
    ``@broker.task``. ``key`` and ``payload`` are values or functions of the task's
    arguments; ``on_duplicate(duplicate, *args, **kwargs)`` (sync or async) is called when a
    delivery finds its key applied."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())
        if not params:
            raise TypeError(f"{fn.__qualname__} must take the connection as its first argument")

        @functools.wraps(fn)
        async def task(*args: Any, **kwargs: Any) -> Any:
            target = db() if callable(db) else db
            run = _guarded.guarded(key=key, db=target, payload=payload, table=table)(fn)
            outcome = await run(*args, **kwargs)
            holder = _outcome.get(None)
            if holder is not None:
                holder.append(outcome)
            if isinstance(outcome, _guarded.Duplicate):
                if on_duplicate is not None:
                    out = on_duplicate(outcome, *args, **kwargs)
                    if inspect.isawaitable(out):
                        await out
                return outcome.result
            return outcome.value

        # taskiq reads the task's parameters from its signature: the caller's, without `conn`.
        task.__signature__ = signature.replace(parameters=params[1:])  # type: ignore[attr-defined]
        return task

    return decorate


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
