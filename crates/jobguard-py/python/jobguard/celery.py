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

A delivery whose transaction did not commit for a transient reason is run again: a database
error that may pass (serialization failure, deadlock, lock timeout, lost or terminated
connection, SQLite busy), ``SoftTimeLimitExceeded`` (the soft ``time_limit`` inside the task)
or a hard ``time_limit`` (the pool child killed by the worker). It is retried as Celery's own
``self.retry`` does (a new message with the same id, ``retries + 1`` and a countdown, then the
delivery is acked), after ``min(guard_retry_backoff * 2**retries, guard_retry_backoff_max)``
seconds (its upper half random), up to ``guard_max_retries`` times; a hard time limit is
retried the same way by the worker's main process (:class:`GuardedRequest`). A retry is counted
(``jobguard_job_retries_total{outcome="retried"}``) once it was sent; one that could not be sent
(the broker refused the publish) is logged at error and the delivery's message is rejected with
``requeue=True``, so the broker delivers it again (Celery itself would drop or ack it). After the
last retry the job is reported (logged at error with its key, counted as
``jobguard_job_retries_total{outcome="exhausted"}``) and fails as Celery fails any task
(``acks_on_failure_or_timeout``, True by default: the failure is stored and the message acked).
Any other exception is Celery's own business: no retry unless the task asks for one
(``autoretry_for``, ``self.retry``), and the message is acked per ``acks_on_failure_or_timeout``.

The guard table is created on ``guard_db`` when each pool process starts (in a thread, on
``worker_process_init``) and before a process's first task (``guard_migrate``, default on): a
worker on a fresh database applies its first task. A database user that may not create tables
gets one line at error when the pool process starts, and its tasks raise ``NotMigrated``, which
is retried as above until the table is migrated by another user.

The signature Celery checks a call against (``typing``) is the task's without ``conn``:
``credit.delay("order-8812", 500)`` and ``credit.apply_async(("order-8812", 500))``.

On Redis and SQS set ``broker_transport_options={"visibility_timeout": ...}`` longer than the
longest task: past it the message is handed to another worker while the first still runs (the
guard keeps the effect single, but the second delivery waits on the first one's row lock).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from typing import Any, Callable

from billiard.einfo import ExceptionWithTraceback
from celery import Task, signals
from celery.exceptions import Reject, SoftTimeLimitExceeded, TimeLimitExceeded
from celery.worker import state as worker_state
from celery.worker.request import Request

from . import _guarded, _migrate_once, _retry
from ._guard import DEFAULT_TABLE
from ._outcome import Duplicate
from .errors import NotMigrated

__all__ = ["GuardedRequest", "GuardedTask", "migrate_guarded_tasks"]

log = logging.getLogger("jobguard.celery")


def _reason(exc: BaseException) -> str | None:
    """Why a delivery's transaction may commit when run again, or ``None``."""
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None:
            break
        if isinstance(seen, SoftTimeLimitExceeded):
            return "soft time limit"
        seen = seen.__context__
    return _retry.transient_reason(exc)


class GuardedRequest(Request):
    """The worker's request for a :class:`GuardedTask`: a hard ``time_limit`` kills the pool
    child in the worker's main process, where the task's own ``__call__`` never sees it; this
    request retries the task there, as ``self.retry`` would, until ``guard_max_retries``."""

    # Whether on_failure settled the hard time limit: retried (the message acked) or, when
    # the retry could not be sent, the message rejected back to the broker.
    _jobguard_settled = False

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if (
            isinstance(exc, TimeLimitExceeded)
            and not worker_state.should_terminate
            and self._retry_time_limit(exc)
        ):
            self._jobguard_settled = True
            worker_state.task_ready(self)
            return None
        return super().on_failure(exc_info, send_failed_event, return_ok)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if not soft and self._jobguard_settled:
            # on_failure, called first, retried the task or gave its message back to the
            # broker: no failure to store, no ack.
            log.warning("task %s[%s]: hard time limit (%ss) exceeded", self.name, self.id, timeout)
            return
        super().on_timeout(soft, timeout)

    def _retry_time_limit(self, exc: BaseException) -> bool:
        """Retries the task after its hard time limit, as ``self.retry`` would; false when its
        retries are spent (the failure is then Celery's)."""
        task = self.task
        context = self._context
        retries = context.retries or 0
        key = _retry.resolve_key(task._static("guard_key"), tuple(self.args), dict(self.kwargs))
        job = f"task {self.name}[{self.id}]"
        policy = task.guard_retry_policy()
        if retries >= policy.max_retries:
            _retry.exhausted(log, "celery", job, key, retries, "hard time limit")
            return False
        delay = policy.delay(retries)
        try:
            task.signature_from_request(context, countdown=delay, retries=retries + 1).apply_async()
        except Exception as error:  # noqa: BLE001 - any failure to publish
            # Celery would ack the failure and lose the job: the message goes back to the
            # broker instead, which delivers it again.
            log.error(
                "%s: the retry of job key %s after its hard time limit could not be sent "
                "(%r): its message is requeued",
                job, key, error,
            )
            self.reject(requeue=True)
            return True
        _retry.retrying(log, "celery", job, key, retries, delay, "hard time limit")
        if self.store_errors:
            task.backend.mark_as_retry(self.id, exc, request=context)
        self.acknowledge()
        return True


class GuardedTask(Task):
    """A Celery task whose body runs in one transaction with its guard row; see the module."""

    acks_late = True
    reject_on_worker_lost = True
    Request = GuardedRequest

    #: The job key, from the task's arguments: ``lambda order, amount: jobguard.key(...)``.
    guard_key: Callable[..., str] | str | None = None
    #: Where the transaction is opened: an ``Engine``, a psycopg pool or a connection factory.
    guard_db: Any = None
    #: The payload whose fingerprint is kept with the key (a value or a function of the
    #: arguments); ``None`` keeps none.
    guard_payload: Any = None
    #: The guard table.
    guard_table: str = DEFAULT_TABLE
    #: How many times a delivery that did not commit for a transient reason is retried.
    guard_max_retries: int = 5
    #: The first retry's wait in seconds, doubled at each retry up to guard_retry_backoff_max.
    guard_retry_backoff: float = 1.0
    guard_retry_backoff_max: float = 60.0
    #: Whether the worker creates the guard table (``jobguard.migrate_sync(guard_db)``) when
    #: its pool process starts and before the first guarded call; ``False`` when a separate
    #: step migrates and the workers' database user may not create tables.
    guard_migrate: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # `@app.task(base=GuardedTask)` makes a subclass whose `__header__` (the signature
        # `typing` checks `delay`/`apply_async` against) is the function's, `conn` first; the
        # caller passes no `conn`: check the call against the rest.
        header = cls.__dict__.get("__header__")
        if isinstance(header, staticmethod):
            cls.__header__ = staticmethod(functools.partial(header.__func__, None))

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
        try:
            if self.guard_migrate:
                outcome = _migrate_once.run_migrated_sync(
                    db, self.guard_table, lambda: body(*args, **kwargs)
                )
            else:
                outcome = body(*args, **kwargs)
        except Exception as exc:
            reason = _reason(exc)
            if reason is None:
                raise
            ending = self._again(_retry.resolve_key(key, args, kwargs), reason, exc)
            if ending is exc:
                raise
            raise ending from exc
        if isinstance(outcome, Duplicate):
            self.on_duplicate(outcome, args, kwargs)
            return outcome.result
        return outcome.value

    def guard_retry_policy(self) -> _retry.RetryPolicy:
        """The retry policy from ``guard_max_retries`` and the backoff attributes."""
        return _retry.RetryPolicy(
            self.guard_max_retries, self.guard_retry_backoff, self.guard_retry_backoff_max
        )

    def _again(self, key: str | None, reason: str, exc: Exception) -> BaseException:
        """The exception that ends this delivery: Celery's ``Retry`` after sending the retry,
        ``Reject(requeue=True)`` when it could not be sent, or ``exc`` itself when the retries
        are spent or the task was called directly."""
        request = self.request
        if request.called_directly:
            return exc
        retries = request.retries or 0
        job = f"task {self.name}[{request.id}]"
        policy = self.guard_retry_policy()
        if retries >= policy.max_retries:
            _retry.exhausted(log, "celery", job, key, retries, reason)
            return exc
        delay = policy.delay(retries)
        try:
            retry: BaseException = self.retry(
                exc=exc, countdown=delay, max_retries=policy.max_retries, throw=False
            )
        except Exception as error:  # noqa: BLE001 - Celery's Reject when the retry was not sent
            # Celery's Reject drops the message: it goes back to the broker instead, which
            # delivers it again (the delivery did not commit).
            sent = error.reason if isinstance(error, Reject) else error
            log.error(
                "%s: the retry of job key %s (%s) could not be sent (%r): its message is "
                "requeued",
                job, key, reason, sent,
            )
            requeued: BaseException = Reject(sent, requeue=True)
            return requeued
        _retry.retrying(log, "celery", job, key, retries, delay, reason)
        return retry

    def _static(self, name: str) -> Any:
        # `@app.task(guard_key=lambda ...)` makes the lambda a class attribute: read it
        # unbound, as it was given.
        value = inspect.getattr_static(self, name)
        return value.__func__ if isinstance(value, staticmethod) else value

    def _run_in_transaction(self, conn: Any, *args: Any, **kwargs: Any) -> Any:
        return self.run(conn, *args, **kwargs)

    def on_duplicate(
        self, duplicate: Duplicate, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Called when a delivery finds its key applied; logs it. Override to do more
        (``jobguard_outcomes_total{outcome="duplicate"}`` is already counted)."""
        request_id = getattr(self.request, "id", None)
        log.info(
            "task %s[%s]: duplicate delivery, first applied at %s",
            self.name, request_id, duplicate.first_applied_at,
        )


def migrate_guarded_tasks(app: Any = None) -> None:
    """Creates the guard table of every :class:`GuardedTask` of ``app`` (the current app by
    default) that has ``guard_migrate``, once per ``guard_db`` and table in this process.

    Run in a thread when ``worker_process_init`` fires: in each prefork pool process after the
    fork (and once in a solo pool), so a database that cannot be migrated is reported in one line at
    error when the worker starts rather than at its first task. A failure is logged, not
    raised: the tasks migrate again before their first call, and are retried meanwhile."""
    if app is None:
        from celery import current_app

        app = current_app
    seen: set[tuple[int, str]] = set()
    for task in list(app.tasks.values()):
        if not isinstance(task, GuardedTask) or not task.guard_migrate:
            continue
        db = task._static("guard_db")
        if db is None or (id(db), task.guard_table) in seen:
            continue
        seen.add((id(db), task.guard_table))
        try:
            _migrate_once.migrate_once_sync(db, task.guard_table)
        except NotMigrated:
            pass  # logged at error, in one line, by migrate_once_sync
        except Exception as error:  # noqa: BLE001 - a database not reachable yet
            first = (str(error).strip().splitlines() or [""])[0]
            log.error(
                "the guard table `%s` could not be migrated when the worker started (%s: %s); "
                "the first task tries again",
                task.guard_table, type(error).__name__, first,
            )


@signals.worker_process_init.connect(weak=False)
def _migrate_at_process_start(**_: Any) -> None:
    # In a thread: Celery kills a pool process whose start takes longer than
    # `worker_proc_alive_timeout` (4 s), which a database slow to answer would.
    threading.Thread(
        target=migrate_guarded_tasks, name="jobguard-migrate", daemon=True
    ).start()
