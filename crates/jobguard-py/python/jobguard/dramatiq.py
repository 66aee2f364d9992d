"""Dramatiq: ``Guard``, a middleware that makes ``guard_key=`` and ``guard_db=`` actor options.

::

    broker = RabbitmqBroker(url=BROKER_URL)  # or RedisBroker(url=...)
    broker.add_middleware(jobguard.dramatiq.Guard())
    dramatiq.set_broker(broker)
    engine = sqlalchemy.create_engine(DATABASE_URL)

    @dramatiq.actor(guard_key=lambda order, amount: jobguard.key("credit", order),
                    guard_db=engine)
    def credit(conn, order, amount):
        conn.exec_driver_sql("insert into ledger(account, amount) values(7, %s)", (amount,))
        return {"credited": amount}

    credit.send("order-8812", 500)  # sent without conn

An actor declared with ``guard_key=`` runs in one transaction with its guard row: the
middleware wraps its function when the actor is declared, opens a transaction on ``guard_db``
(a SQLAlchemy ``Engine``, a psycopg ``ConnectionPool``, or a function returning a new psycopg or
sqlite3 connection), claims the key and calls the function with the transaction's connection
first. A duplicate delivery does not call it: it returns the result the first delivery stored
and calls ``guard_on_duplicate(duplicate, *args, **kwargs)`` if given. Only sync actors: the
guard runs on sync drivers, in Dramatiq's worker threads.

What Dramatiq does to a delivery, and what the guard needs of it:

- Acks: a worker acks a message after it was processed (a failure too, once the ``Retries``
  middleware has enqueued its retry). A worker killed mid-job never acks: RabbitMQ redelivers
  its unacked messages when the connection closes; the Redis broker moves a dead worker's
  unacked messages back to their queue in a maintenance pass (1 broker call in
  ``maintenance_chance`` per million, 1,000 by default) once its heartbeat is older than
  ``heartbeat_timeout`` (60 s). A redelivery of a job that had committed is a duplicate.
- ``Retries`` (a default middleware) enqueues a failed message again, ``max_retries`` times
  (20 by default), then dead-letters it. The guard needs it: without it a failed delivery is
  acked and the job lost, so ``Guard`` refuses to wrap an actor on a broker without it.
- ``TimeLimit`` (a default middleware, 10 minutes) raises ``TimeLimitExceeded`` in the worker
  thread, inside the transaction, which rolls back; it is raised at the next Python bytecode, so
  a thread blocked in the database or stopped (SIGSTOP) gets it when it runs again.
- On RabbitMQ, ``Guard`` turns on ``confirm_delivery``: the retry of a failed delivery is then
  confirmed by RabbitMQ before the failed delivery is acked, so a retry lost in flight cannot
  lose the job.

A delivery whose transaction did not commit for a transient reason (a database error that may
pass: serialization failure, deadlock, lock timeout, lost or terminated connection, SQLite
busy; a missing guard table; ``TimeLimitExceeded``) raises ``dramatiq.Retry`` with the guard's
delay, ``min(guard_retry_backoff * 2**retries, guard_retry_backoff_max)`` seconds (its upper
half random; defaults 1 s and 60 s) instead of Dramatiq's ``min_backoff`` (15 s), and is counted
as ``jobguard_job_retries_total{framework="dramatiq", outcome="retried"}``. The bound is
Dramatiq's own ``max_retries`` (``retry_when`` if set): the delivery that will not be retried is
reported (logged at error with its key, counted as ``outcome="exhausted"``) and dead-lettered as
Dramatiq does. Any other exception is Dramatiq's business, retried after its own backoff.

With ``guard_migrate=True`` (the default) the first delivery in a process creates the guard
table on ``guard_db`` if it is missing; a database user that may not create tables gets one line
at error, and the job raises ``NotMigrated``, retried as above until the table is migrated.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Callable

import dramatiq
from dramatiq.middleware import Middleware, MiddlewareError, Retries
from dramatiq.middleware.time_limit import TimeLimitExceeded

from . import _guarded, _migrate_once, _retry
from ._guard import DEFAULT_TABLE
from ._outcome import Duplicate
from .errors import Error

__all__ = ["Guard", "GuardOptionsError"]

log = logging.getLogger("jobguard.dramatiq")

# The actor options Guard reads, with their defaults (guard_key and guard_db have none).
_DEFAULTS: dict[str, Any] = {
    "guard_key": None,
    "guard_db": None,
    "guard_payload": None,
    "guard_table": DEFAULT_TABLE,
    "guard_on_duplicate": None,
    "guard_retry_backoff": 1.0,
    "guard_retry_backoff_max": 60.0,
    "guard_migrate": True,
}
# Set on a wrapped actor function, so a second declaration does not wrap it again.
_WRAPPED = "__jobguard_dramatiq__"


class GuardOptionsError(Error, MiddlewareError, ValueError):
    """An actor's guard options, or its broker, cannot guard it: raised when the actor is
    declared (a ``MiddlewareError``, which Dramatiq lets through), before any message is sent."""


class Guard(Middleware):
    """Runs every actor declared with ``guard_key=`` and ``guard_db=`` once per key; see the
    module. Add it to the broker before the actors are declared: an actor declared with
    ``guard_key=`` but no ``guard_db=`` (or the reverse), or on a broker without the ``Retries``
    middleware, raises :class:`GuardOptionsError`."""

    def __init__(self) -> None:
        # The message each worker thread is processing, for the retry decision.
        self._current = threading.local()

    @property
    def actor_options(self) -> set[str]:
        return set(_DEFAULTS)

    def before_declare_actor(self, broker: Any, actor: Any) -> None:
        self._declare(broker, actor)

    def after_declare_actor(self, broker: Any, actor: Any) -> None:
        # The actors declared before the middleware was added.
        self._declare(broker, actor)

    def _declare(self, broker: Any, actor: Any) -> None:
        options = actor.options
        if options.get("guard_key") is None and options.get("guard_db") is None:
            return
        if options.get("guard_key") is None or options.get("guard_db") is None:
            raise GuardOptionsError(
                f"actor {actor.actor_name}: a guarded actor needs guard_key= and guard_db=, e.g. "
                "@dramatiq.actor(guard_key=lambda order: jobguard.key('credit', order), "
                "guard_db=engine)"
            )
        if not any(isinstance(m, Retries) for m in broker.middleware):
            raise GuardOptionsError(
                f"actor {actor.actor_name}: the broker has no Retries middleware, so a delivery "
                "whose transaction rolled back would be acked and its job lost; keep Dramatiq's "
                "default middleware (or add dramatiq.middleware.Retries())"
            )
        if getattr(broker, "confirm_delivery", None) is False:
            broker.confirm_delivery = True
        if not getattr(actor.fn, _WRAPPED, False):
            actor.fn = self._wrap(broker, actor)

    def before_process_message(self, broker: Any, message: Any) -> None:
        self._current.message = message

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        self._current.message = None

    after_skip_message = after_process_message

    def _wrap(self, broker: Any, actor: Any) -> Callable[..., Any]:
        fn = actor.fn
        opt = {name: actor.options.get(name, default) for name, default in _DEFAULTS.items()}
        policy = _retry.RetryPolicy(0, opt["guard_retry_backoff"], opt["guard_retry_backoff_max"])
        db, table, key = opt["guard_db"], opt["guard_table"], opt["guard_key"]
        body = _guarded.guarded(key=key, db=db, payload=opt["guard_payload"], table=table)(fn)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                if opt["guard_migrate"]:
                    outcome = _migrate_once.run_migrated_sync(
                        db, table, lambda: body(*args, **kwargs)
                    )
                else:
                    outcome = body(*args, **kwargs)
            except (Exception, TimeLimitExceeded) as exc:
                reason = _reason(exc)
                message = getattr(self._current, "message", None)
                if reason is None or message is None:
                    raise
                self._again(broker, actor, message, policy, key, args, kwargs, reason, exc)
                raise
            if isinstance(outcome, Duplicate):
                log.info(
                    "actor %s: duplicate delivery, first applied at %s",
                    actor.actor_name, outcome.first_applied_at,
                )
                if opt["guard_on_duplicate"] is not None:
                    opt["guard_on_duplicate"](outcome, *args, **kwargs)
                return outcome.result
            return outcome.value

        setattr(run, _WRAPPED, True)
        return run

    def _again(
        self, broker: Any, actor: Any, message: Any, policy: _retry.RetryPolicy, key: Any,
        args: tuple[Any, ...], kwargs: dict[str, Any], reason: str, exc: BaseException,
    ) -> None:
        """Raises ``dramatiq.Retry`` with the guard's delay when Dramatiq's Retries middleware
        will run the message again; reports the job when it will not (then returns, and the
        caller raises ``exc`` for Dramatiq to dead-letter)."""
        retries = int(message.options.get("retries", 0))
        job = f"actor {actor.actor_name}[{message.message_id}]"
        job_key = _retry.resolve_key(key, args, kwargs)
        delay = policy.delay(retries)
        retry = dramatiq.Retry(f"job key {job_key} did not commit ({reason})", int(delay * 1000))
        if not _will_retry(broker, actor, message, retries, retry):
            _retry.exhausted(log, "dramatiq", job, job_key, retries, reason)
            return
        _retry.retrying(log, "dramatiq", job, job_key, retries, delay, reason)
        raise retry from exc


def _reason(exc: BaseException) -> str | None:
    """Why a delivery's transaction may commit when run again, or ``None``."""
    if isinstance(exc, TimeLimitExceeded):
        return "time limit"
    return _retry.transient_reason(exc)


def _will_retry(broker: Any, actor: Any, message: Any, retries: int, exc: BaseException) -> bool:
    """Whether Dramatiq's Retries middleware runs ``message`` again after ``exc``: the same
    test as its own (``throws``, then ``retry_when``, then ``max_retries``)."""
    middleware = next(m for m in broker.middleware if isinstance(m, Retries))
    throws = message.options.get("throws") or actor.options.get("throws")
    if throws and isinstance(exc, throws):
        return False
    retry_when = actor.options.get("retry_when", middleware.retry_when)
    if retry_when is not None:
        return bool(retry_when(retries, exc))
    limit = message.options.get(
        "max_retries", actor.options.get("max_retries", middleware.max_retries)
    )
    return limit is None or retries < limit
