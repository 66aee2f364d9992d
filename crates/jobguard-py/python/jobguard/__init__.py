"""jobguard for Python: background jobs that take effect exactly once on at-least-once job
systems (Celery, arq, taskiq, RabbitMQ, Redis, SQS...).

A guard row for the job's business key is inserted in the same transaction as the job's
effect, on the caller's own connection: the effect commits once, and every other delivery is
a duplicate. Keys, fingerprints and SQL come from jobguard's Rust core, so Python and Rust
workers can share one guard table::

    await jobguard.migrate(pool)  # once, at start: creates the guard table
    async with pool.acquire() as conn, conn.transaction():
        async with jobguard.guard(conn, jobguard.key("credit", order_id)) as g:
            if g.applied:
                await conn.execute("insert into ledger(account, amount) values($1, $2)", 7, 500)
"""

from __future__ import annotations

from .app import App, Job
from ._queue_sql import Backoff
from .worker import Worker, WorkerStats
from ._unique import Unique
from ._periodic import Firing, Periodic, Scheduler
from ._enqueue import DEFAULT_QUEUE, DEFAULT_QUEUE_TABLE, Enqueued, enqueue, enqueue_sync
from ._guard import Guard, guard, guard_sync
from ._migrate import DEFAULT_TABLE, migrate, migrate_sync
from ._guarded import guarded
from ._outcome import Applied, Duplicate
from ._keys import (
    MAX_KEY_LEN,
    MAX_KIND_LEN,
    MAX_PAYLOAD_BYTES,
    STRIPE,
    ApiKeyFormat,
    Horizon,
    api_key,
    fingerprint,
    guard_sql,
    horizon,
    queue_sql,
    key,
    parse_key,
)
from .errors import (
    ConnectionClosed,
    EnqueueRejected,
    Error,
    GuardVanished,
    HeldNotRead,
    InSavepoint,
    InvalidFormat,
    InvalidKey,
    InvalidName,
    InvalidSchedule,
    InvalidUnique,
    KeyReused,
    NotApplied,
    NotInTransaction,
    NotMigrated,
    PayloadError,
    ReplaceRejected,
    UnsupportedConnection,
)

__all__ = [
    "App",
    "Unique",
    "Periodic",
    "Firing",
    "Scheduler",
    "EnqueueRejected",
    "ReplaceRejected",
    "InvalidUnique",
    "InvalidSchedule",
    "Backoff",
    "Job",
    "Worker",
    "WorkerStats",
    "DEFAULT_QUEUE",
    "DEFAULT_QUEUE_TABLE",
    "Enqueued",
    "enqueue",
    "enqueue_sync",
    "queue_sql",
    "DEFAULT_TABLE",
    "MAX_KEY_LEN",
    "MAX_KIND_LEN",
    "MAX_PAYLOAD_BYTES",
    "STRIPE",
    "ApiKeyFormat",
    "Applied",
    "ConnectionClosed",
    "Duplicate",
    "Error",
    "Guard",
    "GuardVanished",
    "HeldNotRead",
    "Horizon",
    "InSavepoint",
    "InvalidFormat",
    "InvalidKey",
    "InvalidName",
    "KeyReused",
    "NotApplied",
    "NotInTransaction",
    "NotMigrated",
    "PayloadError",
    "UnsupportedConnection",
    "api_key",
    "fingerprint",
    "guard",
    "guard_sql",
    "guard_sync",
    "guarded",
    "horizon",
    "key",
    "migrate",
    "migrate_sync",
    "parse_key",
]
