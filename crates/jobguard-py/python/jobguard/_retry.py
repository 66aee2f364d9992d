"""Running a guarded job again when its transaction did not commit for a transient reason.

The guard makes a second run of a job safe: it is a duplicate if the first one committed and
applies if it did not. So a delivery whose transaction failed for a reason that may pass (a
serialization failure, a deadlock, a lock timeout, a lost connection, a busy SQLite file, a time
limit, a guard table not migrated yet) is run again, after a bounded exponential backoff, until
it commits or has been retried ``max_retries`` times; then it is reported (logged at error with
its key, and counted as ``jobguard_job_retries_total{outcome="exhausted"}``) and left to the
framework's own failure handling. Where an integration sends the retry itself (Celery, taskiq),
the retry is counted once it was sent; one that could not be sent leaves the message to the
broker where the framework can (Celery), else it is reported as ``outcome="lost"``. The
framework integrations (``jobguard.celery``, ``jobguard.arq``, ``jobguard.taskiq``,
``jobguard.dramatiq``, ``jobguard.rq``) share this module; each decides how a job is run again.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import sqlite3
from typing import Any

from . import _keys, _native
from .errors import GuardVanished, NotMigrated
from .metrics import record_retry

# The SQLSTATEs (PostgreSQL) and result codes (SQLite) after which the same transaction may
# commit when run again come from the core's tables (``jobguard_core::transient``), which the
# Rust runners classify by too: serialization failure, deadlock, lock not available, the server
# ending the session, class ``08`` (connection exceptions); SQLITE_BUSY and SQLITE_LOCKED with
# their extended codes.
_SQLITE_MESSAGES = ("database is locked", "database table is locked", "database is busy")


def transient_reason(exc: BaseException) -> str | None:
    """Why ``exc`` left a transaction that may commit when run again, or ``None`` when it
    did not (a bug, bad data: running it again would fail the same way). The exception, its
    ``__cause__`` and ``__context__`` are looked at: a driver's error is often wrapped
    (SQLAlchemy's ``DBAPIError``) or followed by one from the rollback on a dead connection."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen or len(seen) > 16:
            continue
        seen.add(id(e))
        reason = _reason_of(e)
        if reason is not None:
            return reason
        todo += [getattr(e, "orig", None), e.__cause__, e.__context__]
    return None


def _reason_of(e: BaseException) -> str | None:
    state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
    if isinstance(state, str) and _native.transient("postgres", state) is not None:
        return f"sqlstate {state}"
    if isinstance(e, sqlite3.OperationalError):
        code = getattr(e, "sqlite_errorcode", None)
        if code is not None and _native.transient("sqlite", str(code)) is not None:
            return f"sqlite {getattr(e, 'sqlite_errorname', code)}"
        if any(m in str(e) for m in _SQLITE_MESSAGES):
            return "sqlite busy"
    if getattr(e, "connection_invalidated", False):
        # SQLAlchemy: the driver's connection was found dead.
        return "connection invalidated"
    if isinstance(e, GuardVanished):
        return "guard row vanished"
    if isinstance(e, NotMigrated):
        # Fixed by running the migration, which the error names: retried meanwhile.
        return "guard table not migrated"
    if isinstance(e, ConnectionError):
        return "connection lost"
    module = type(e).__module__.split(".")[0]
    name = type(e).__name__
    # A driver's error for a connection that is gone, which carries no SQLSTATE: psycopg's
    # "server closed the connection unexpectedly" / "the connection is closed", asyncpg's
    # ConnectionDoesNotExistError (08003 when it has one) and "connection was closed".
    if module in ("psycopg", "psycopg2") and name in ("OperationalError", "InterfaceError"):
        message = str(e)
        if state is None and ("closed" in message or "terminat" in message):
            return "connection lost"
    if module == "asyncpg" and (
        name in ("ConnectionDoesNotExistError", "ConnectionFailureError")
        or (name == "InterfaceError" and "closed" in str(e))
    ):
        return "connection lost"
    return None


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How many times, and how long apart, a guarded job whose transaction did not commit for
    a transient reason is run again.

    The n-th retry (n from 0) waits ``min(backoff * 2**n, backoff_max)`` seconds, of which the
    upper half is random (so that deliveries which collided do not collide again)."""

    max_retries: int = 5
    backoff: float = 1.0
    backoff_max: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.backoff < 0 or self.backoff_max < self.backoff:
            raise ValueError(
                f"retry policy {self}: max_retries and backoff must be >= 0 and "
                "backoff_max >= backoff"
            )

    def delay(self, retries: int) -> float:
        """The wait before the retry that follows ``retries`` earlier ones."""
        full = min(self.backoff * 2 ** min(retries, 32), self.backoff_max)
        return float(full / 2 + random.uniform(0, full / 2))


def retrying(
    log: logging.Logger, framework: str, job: str, key: str | None, retries: int,
    delay: float, reason: str,
) -> None:
    """Logs and counts one retry of ``job`` (the framework's name and id of the delivery). An
    integration that sends the retry itself calls it once the retry was sent: one that could
    not be sent is not a retry (see :func:`lost`)."""
    log.warning(
        "%s: job key %s did not commit (%s); running it again after a %.2fs backoff (retry %d)",
        job, key, reason, delay, retries + 1,
    )
    record_retry(_kind(key), framework, "retried")


def exhausted(
    log: logging.Logger, framework: str, job: str, key: str | None, retries: int, reason: str,
) -> None:
    """Reports a job whose transaction still did not commit after ``retries`` retries: it
    is left to the framework's failure handling and not run again by jobguard."""
    log.error(
        "%s: job key %s did not commit (%s) after %d retries: giving up, the job is NOT "
        "applied; run it again once the cause is fixed",
        job, key, reason, retries,
    )
    record_retry(_kind(key), framework, "exhausted")


def lost(
    log: logging.Logger, framework: str, job: str, key: str | None, reason: str,
    error: BaseException,
) -> None:
    """Reports a job whose transaction did not commit and whose retry could not be sent, nor
    its message left to the broker: it is NOT applied and will not run again."""
    log.error(
        "%s: job key %s did not commit (%s) and its retry could not be sent (%r): the job is "
        "NOT applied and will not run again; run it again once the broker takes messages",
        job, key, reason, error,
    )
    record_retry(_kind(key), framework, "lost")


def _kind(key: str | None) -> str:
    if not isinstance(key, str):
        return "unknown"
    try:
        return _keys.kind_of(key)
    except Exception:  # noqa: BLE001 - a metric label must not hide the job's own error
        return "unknown"


def resolve_key(spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The job key for a report; ``None`` when it cannot be computed."""
    try:
        key = spec(*args, **kwargs) if callable(spec) else spec
        return key if isinstance(key, str) else None
    except Exception:  # noqa: BLE001 - the report must not replace the job's own error
        return None
