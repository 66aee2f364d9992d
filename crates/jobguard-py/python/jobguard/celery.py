"""Celery: ``GuardedTask``, a task base class that runs the task body at most once per key.

::

    engine = sqlalchemy.create_engine("postgresql+psycopg://...")

    @app.task(base=GuardedTask, guard_key=lambda order, amount: jobguard.key("credit", order),
              guard_db=engine)
    def credit(conn, order, amount):
        conn.exec_driver_sql("insert into ledger(account, amount) values(7, %s)", (amount,))
        return {"credited": amount}

``__call__`` opens a transaction on ``guard_db`` (a SQLAlchemy ``Engine``, a psycopg
``ConnectionPool``, or a function returning a new psycopg or sqlite3 connection), claims the
key and calls the task with the transaction's connection first; the guard row and the effect
commit together. A duplicate delivery does not call the task: it returns the result the first
delivery stored (what the task returned) and calls ``on_duplicate``.

The class sets the delivery settings the guard needs:

- ``acks_late = True``: Celery's default acks a message when a worker *receives* it, so a
  worker that dies mid-task loses the job instead of having it redelivered. With a late ack, a
  crash before the commit redelivers the job, which applies; a crash after the commit but
  before the ack redelivers it too, and the guard reports a duplicate.
- ``task_reject_on_worker_lost = True``: with the prefork pool, a child killed mid-task
  (SIGKILL, the OOM killer) is otherwise acked as failed; rejecting it requeues the message.

On Redis and SQS set ``broker_transport_options={"visibility_timeout": ...}`` longer than the
longest task: past it the message is handed to another worker while the first still runs (the
guard keeps the effect single, but the second delivery waits on the first one's row lock).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

from celery import Task

from . import _guarded
from ._guard import DEFAULT_TABLE

__all__ = ["GuardedTask"]

log = logging.getLogger("jobguard.celery")


class GuardedTask(Task):
    """A Celery task whose body runs in one transaction with its guard row; see the module."""

    acks_late = True
    reject_on_worker_lost = True

    #: The job key, from the task's arguments: ``lambda order, amount: jobguard.key(...)``.
    guard_key: Callable[..., str] | str | None = None
    #: Where the transaction is opened: an ``Engine``, a psycopg pool or a connection factory.
    guard_db: Any = None
    #: The payload whose fingerprint is kept with the key (a value or a function of the
    #: arguments); ``None`` keeps none.
    guard_payload: Any = None
    #: The guard table.
    guard_table: str = DEFAULT_TABLE

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key, db, payload = (self._static(n) for n in ("guard_key", "guard_db", "guard_payload"))
        if key is None or db is None:
            raise TypeError(
                f"task {self.name}: GuardedTask needs guard_key= and guard_db=, e.g. "
                "@app.task(base=GuardedTask, guard_key=lambda order: jobguard.key('credit', "
                "order), guard_db=engine)"
            )
        # The tracer has already pushed this delivery's request: call `run` directly, as
        # Celery's own `__call__` would, with the transaction's connection first.
        body = _guarded.guarded(
            key=key, db=db, payload=payload, table=self.guard_table
        )(self._run_in_transaction)
        outcome = body(*args, **kwargs)
        if isinstance(outcome, _guarded.Duplicate):
            self.on_duplicate(outcome, args, kwargs)
            return outcome.result
        return outcome.value

    def _static(self, name: str) -> Any:
        # `@app.task(guard_key=lambda ...)` makes the lambda a class attribute: read it
        # unbound, as it was given.
        value = inspect.getattr_static(self, name)
        return value.__func__ if isinstance(value, staticmethod) else value

    def _run_in_transaction(self, conn: Any, *args: Any, **kwargs: Any) -> Any:
        return self.run(conn, *args, **kwargs)

    def on_duplicate(self, duplicate: _guarded.Duplicate, args: tuple, kwargs: dict) -> None:
        """Called when a delivery finds its key applied; logs it. Override to do more
        (``jobguard_outcomes_total{outcome="duplicate"}`` is already counted)."""
        request_id = getattr(self.request, "id", None)
        log.info(
            "task %s[%s]: duplicate delivery, first applied at %s",
            self.name, request_id, duplicate.first_applied_at,
        )
