"""RQ: ``guarded(key=..., db=...)``, a job function that runs at most once per key, and
``GuardedWorker``, the worker class that runs a killed job again.

::

    engine = sqlalchemy.create_engine(DATABASE_URL)

    @jobguard.rq.guarded(key=lambda order, amount: jobguard.key("credit", order), db=engine)
    def credit(conn, order, amount):
        conn.exec_driver_sql("insert into ledger(account, amount) values(7, %s)", (amount,))
        return {"credited": amount}

    Queue(connection=Redis()).enqueue(credit, "order-8812", 500)  # enqueued without conn

    # rq worker --worker-class jobguard.rq.GuardedWorker

The wrapper keeps the job's signature without ``conn``: it opens a transaction on ``db`` (a
SQLAlchemy ``Engine``, a psycopg ``ConnectionPool``, or a function returning a new psycopg or
sqlite3 connection), claims the key and calls the function with the transaction's connection
first. A duplicate does not call it: it returns the result the first delivery stored (RQ keeps
it as this job's result) and calls ``on_duplicate(duplicate, *args, **kwargs)`` if given.

What RQ does to a job, and what the guard needs of it:

- A job that raises (its transaction rolled back) or runs past ``job_timeout`` (the work horse
  gets SIGALRM, raised as ``JobTimeoutException`` inside the transaction) is retried only if it
  was enqueued with ``retry=Retry(max=...)``; otherwise it goes to the ``FailedJobRegistry``.
- A work horse killed (SIGKILL, the OOM killer) is failed by its worker the same way: retried
  only with ``Retry``, from the ``retries_left`` the worker read when it took the job.
- A worker killed with its horse leaves the job in the ``StartedJobRegistry``; a worker's
  maintenance (every ``maintenance_interval``, 10 minutes by default) retries it once its
  heartbeat has expired (``job_monitoring_interval`` + 60 s), or fails it (``AbandonedJobError``)
  without ``Retry``.
- A retry with an interval is scheduled: it runs only on a worker started with the scheduler.
  A worker killed with its scheduler holds the scheduler lock until it expires (61 s); the
  other workers try to take it every 2 minutes.

So the guard gives each job the retries a job that did not commit needs, whoever enqueued it:
when a job without ``retry=`` starts, the wrapper sets its ``retries_left`` to ``max_retries``
(default 5) and its intervals to ``min(retry_backoff * 2**n, retry_backoff_max)`` seconds (the
upper half random; defaults 1 s and 60 s), stored on the job in Redis before the transaction
opens, and marks it in ``job.meta["jobguard_retries"]``. RQ then retries it itself, after a
transient failure (a database error that may pass: serialization failure, deadlock, lock
timeout, lost or terminated connection, SQLite busy; a missing guard table;
``JobTimeoutException``) and after an abandoned worker. A job that failed for any other reason
is not retried (its ``retries_left`` is set to 0 first), as RQ would not. A job enqueued with
``retry=Retry(...)`` keeps it: RQ retries every failure as configured.

``GuardedWorker`` (``rq worker -w jobguard.rq.GuardedWorker``) is needed for a killed work horse:
RQ's worker fails it from the copy of the job it read before the horse started, which has no
retries; the class reads them back from Redis first (and gives a job killed before the wrapper
ran its retries), so the job is retried. It also starts the scheduler (``--with-scheduler``):
the retries are scheduled.

Each retry is logged with the key and counted as
``jobguard_job_retries_total{framework="rq", outcome="retried"}``; a job whose last retry did
not commit is reported (logged at error, ``outcome="exhausted"``) and stays in the
``FailedJobRegistry``, from which ``rq requeue`` runs it again once the cause is fixed. A retry
of a job abandoned with its worker is RQ's maintenance's, and is not counted.

With ``migrate=True`` (the default) the first job in a work horse creates the guard table on
``db`` if it is missing; a database user that may not create tables gets one line at error, and
the job raises ``NotMigrated``, retried as above until the table is migrated.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from typing import Any, Callable

from rq import Worker, get_current_job
from rq.timeouts import JobTimeoutException

from . import _guarded, _migrate_once, _retry
from ._guard import DEFAULT_TABLE
from ._outcome import Duplicate

__all__ = ["GuardedWorker", "guarded"]

log = logging.getLogger("jobguard.rq")

#: The ``job.meta`` entry marking a job whose retries the guard set: the number it set.
META = "jobguard_retries"
# The attribute of a guarded job function that GuardedWorker reads.
_SPEC = "jobguard_rq"


@dataclasses.dataclass(frozen=True)
class _Spec:
    key: Any
    policy: _retry.RetryPolicy


def guarded(
    *,
    key: str | Callable[..., str],
    db: Any,
    payload: Any | Callable[..., Any] = None,
    table: str = DEFAULT_TABLE,
    on_duplicate: Callable[..., Any] | None = None,
    max_retries: int = 5,
    retry_backoff: float = 1.0,
    retry_backoff_max: float = 60.0,
    migrate: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wraps a job ``fn(conn, *args, **kwargs)`` into ``job(*args, **kwargs)`` that runs ``fn``
    in one transaction with its guard row, once per key. ``key`` and ``payload`` are values or
    functions of the job's arguments. A job enqueued without ``retry=`` is given
    ``max_retries`` retries when it starts, which RQ uses after a transient failure, a
    ``job_timeout`` or a killed worker; see the module."""
    spec = _Spec(key, _retry.RetryPolicy(max_retries, retry_backoff, retry_backoff_max))

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        body = _guarded.guarded(key=key, db=db, payload=payload, table=table)(fn)

        @functools.wraps(fn)
        def job_fn(*args: Any, **kwargs: Any) -> Any:
            job = get_current_job()
            ours = job is not None and _arm(job, spec.policy)
            try:
                if migrate:
                    outcome = _migrate_once.run_migrated_sync(
                        db, table, lambda: body(*args, **kwargs)
                    )
                else:
                    outcome = body(*args, **kwargs)
            except Exception as exc:
                if job is None:
                    raise
                reason = _reason(exc)
                if reason is None:
                    if ours:
                        job.retries_left = 0  # RQ's failure handling reads this copy
                    raise
                _report(job, spec.key, args, kwargs, reason)
                raise
            if isinstance(outcome, Duplicate):
                log.info(
                    "rq job %s: duplicate delivery, first applied at %s",
                    None if job is None else job.id, outcome.first_applied_at,
                )
                if on_duplicate is not None:
                    on_duplicate(outcome, *args, **kwargs)
                return outcome.result
            return outcome.value

        setattr(job_fn, _SPEC, spec)
        return job_fn

    return decorate


class GuardedWorker(Worker):
    """RQ's forking ``Worker``, for guarded jobs: a killed work horse's job is retried with the
    retries the guard gave it, and the scheduler runs (the retries are scheduled)."""

    def work(self, *args: Any, **kwargs: Any) -> bool:
        kwargs["with_scheduler"] = True
        return bool(super().work(*args, **kwargs))

    def handle_work_horse_killed(self, job: Any, retpid: Any, ret_val: Any, rusage: Any) -> None:
        base: Any = super().handle_work_horse_killed  # untyped in RQ
        base(job, retpid, ret_val, rusage)
        spec = _spec_of(job)
        if spec is None:
            return
        # The horse set the job's retries in Redis; this process's copy predates them.
        left, intervals = job.connection.hmget(job.key, ["retries_left", "retry_intervals"])
        job.retries_left = None if left is None else int(left)
        job.retry_intervals = None if intervals is None else json.loads(intervals)
        job.meta = job.get_meta(refresh=True)
        _arm(job, spec.policy)  # a horse killed before the wrapper ran
        _report(job, spec.key, tuple(job.args), dict(job.kwargs), f"work horse killed ({ret_val})")


def _spec_of(job: Any) -> _Spec | None:
    try:
        return getattr(job.func, _SPEC, None)
    except Exception:  # noqa: BLE001 - a job whose function does not import is RQ's to fail
        return None


def _arm(job: Any, policy: _retry.RetryPolicy) -> bool:
    """Gives ``job`` the guard's retries when it has none, in this copy and in Redis; true when
    its retries are the guard's (now or from an earlier run), false when they are the
    enqueuer's ``Retry``."""
    if META in job.meta:
        return True
    if job.retries_left is not None:
        return False
    intervals = [round(policy.delay(n), 3) for n in range(policy.max_retries)]
    job.retries_left = policy.max_retries
    job.retry_intervals = intervals or None
    mapping: dict[str, Any] = {"retries_left": policy.max_retries}
    if intervals:
        mapping["retry_intervals"] = json.dumps(intervals)
    job.meta[META] = policy.max_retries
    job.connection.hset(job.key, mapping=mapping)
    job.save_meta()
    return True


def _reason(exc: BaseException) -> str | None:
    """Why a job's transaction may commit when run again, or ``None``."""
    if isinstance(exc, JobTimeoutException):
        return "job timeout"
    return _retry.transient_reason(exc)


def _report(
    job: Any, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any], reason: str
) -> None:
    """Logs and counts what RQ's failure handling does next with ``job``: a retry while it has
    retries left, else the end of its retries."""
    left = job.retries_left or 0
    total = job.meta.get(META, left)
    retries = max(int(total) - left, 0)
    name = f"rq job {job.id}"
    job_key = _retry.resolve_key(key, args, kwargs)
    if left <= 0:
        _retry.exhausted(log, "rq", name, job_key, retries, reason)
        return
    _retry.retrying(log, "rq", name, job_key, retries, job.get_retry_interval(), reason)
