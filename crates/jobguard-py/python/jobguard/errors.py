"""Typed errors: everything jobguard raises is a :class:`jobguard.Error`.

Each names the user's mistake and what to do about it; none is raised after anything was
written, except :class:`KeyReused`, which is raised inside the caller's transaction so that
it rolls the effect back.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any


class Error(Exception):
    """The base of every error jobguard raises."""


class InvalidKey(Error, ValueError):
    """A job key (a kind or a part) breaks the key rules; nothing was written."""


class InvalidName(Error, ValueError):
    """A table or schema name is not a plain SQL identifier; nothing was written."""


class InvalidFormat(Error, ValueError):
    """An idempotency-key format an API cannot be served with."""


class PayloadError(Error, TypeError):
    """A payload or a result is not JSON-serialisable, or a job's payload breaks the queue's
    rules (over ``MAX_PAYLOAD_BYTES`` of JSON, or a NUL character, which PostgreSQL cannot
    store): the Rust core's own rule. Nothing was written."""


class NotMigrated(Error):
    """The guard table (or the queue's) does not exist, or was made by an older jobguard;
    nothing was written. Run ``await jobguard.migrate(db)`` (sync: ``jobguard.migrate_sync``)
    once before the first guard, e.g. when the worker starts."""


class UnsupportedConnection(Error, TypeError):
    """The connection object is of no driver jobguard knows."""


class NotInTransaction(Error):
    """The guard was asked to claim a key outside an open transaction.

    The guard row must commit or roll back with the effect, so it is only ever written inside
    the transaction the caller opened: ``async with conn.transaction():`` (asyncpg, psycopg),
    ``with engine.begin() as conn:`` (SQLAlchemy), ``conn.execute("begin immediate")``
    (sqlite3).
    """


class InSavepoint(Error):
    """The guard was asked to claim a key inside a savepoint (a nested transaction).

    Rolling back to the savepoint would drop the guard row while the outer transaction goes
    on, or keep it while the effect's savepoint rolls back: claim in the outermost transaction.
    """


class ConnectionClosed(Error):
    """The connection is closed, or its transaction already failed; nothing was written."""


class GuardVanished(Error):
    """The row holding the key was deleted between the conflict and its read.

    Guard rows are being pruned while their jobs still run: retry the job, and keep the
    retention longer than the retry horizon.
    """


class HeldNotRead(Error):
    """A duplicate's ``first_applied_at`` or ``result`` was read on an async connection before
    ``await g.held()``: what the first delivery left is read on demand, and an attribute cannot
    await."""


class KeyReused(Error):
    """The key was first applied with another payload.

    The producer derived one key for two different operations. Raised inside the caller's
    transaction, so the effect rolls back with it; fix the key derivation.
    """

    def __init__(
        self, key: str, first_applied_at: _dt.datetime | None, message: str | None = None
    ) -> None:
        self.key = key
        self.first_applied_at = first_applied_at
        when = f" at {first_applied_at.isoformat()}" if first_applied_at else ""
        super().__init__(
            message
            or f"job key `{key}` was first applied{when} with a different payload: a key must "
            "name one operation; derive it from every business value that tells operations apart"
        )


class NotApplied(Error):
    """``set_result`` on a delivery that did not claim its key (a duplicate)."""

    def __init__(self, key: str, result: Any = None) -> None:
        self.key = key
        super().__init__(
            f"job key `{key}` was applied by an earlier delivery: this one is a duplicate and "
            "cannot set the result; read the stored one from `g.result`"
        )


class InvalidUnique(Error, ValueError):
    """A unique-job policy is not valid (an unknown state, a list of states without both live
    ones, a period that is not whole seconds, an unknown on-conflict action): the Rust core's
    own check and message. Nothing was written."""


class EnqueueRejected(Error):
    """An enqueue whose unique policy rejects conflicts (``on_conflict="reject"``) found a job
    holding its key: nothing was enqueued. ``existing_id`` is that job, ``state`` its state."""

    def __init__(self, key: str, existing_id: int, state: str, message: str) -> None:
        self.key, self.existing_id, self.state = key, existing_id, state
        super().__init__(message)


class ReplaceRejected(Error):
    """An enqueue under ``on_conflict="replace-or-reject"`` found the job holding its key no
    longer waiting (a worker holds it, or it finished): it keeps its payload, and nothing was
    enqueued or replaced."""

    def __init__(self, key: str, existing_id: int, state: str, message: str) -> None:
        self.key, self.existing_id, self.state = key, existing_id, state
        super().__init__(message)


class InvalidSchedule(Error, ValueError):
    """A periodic schedule is refused, before anything is enqueued: an invalid cron
    expression, an unknown time zone, a kind the app does not define, a payload that does not
    bind to the job's parameters. ``schedule`` names it."""

    def __init__(self, schedule: str, reason: str) -> None:
        self.schedule, self.reason = schedule, reason
        super().__init__(f"schedule `{schedule}`: {reason}")
