"""The queue worker's rules from jobguard's Rust core: its statements and its retry policy.

The Python worker holds no second copy of either. The statements are the text the Rust worker
runs (fetch, complete-and-claim, retry, dead letter, release, heartbeats, rescue), and every
retry delay and last attempt is computed by the core's backoff, so a Python job is retried and
dead-lettered exactly as a Rust one.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from typing import Any

from . import _native
from .errors import InvalidName

_DEFAULTS = _native.retry_defaults()


def worker_sql(
    dialect: str, jobs: str, guard: str, jobs_schema: str | None = None,
    guard_schema: str | None = None,
) -> dict[str, str]:
    """The worker's statements for ``dialect`` on the jobs table ``jobs`` and the guard table
    ``guard``: the text the Rust worker runs. Built once per pair; do not change the dict."""
    try:
        return _worker_sql(dialect, jobs, guard, jobs_schema, guard_schema)
    except ValueError as error:
        raise InvalidName(str(error)) from None


@functools.lru_cache(maxsize=64)
def _worker_sql(
    dialect: str, jobs: str, guard: str, jobs_schema: str | None, guard_schema: str | None,
) -> dict[str, Any]:
    return _native.worker_sql(dialect, jobs, guard, jobs_schema, guard_schema)


@dataclasses.dataclass(frozen=True)
class Backoff:
    """When a failed job of jobguard's queue runs again: the Rust worker's ``RetryPolicy``.

    Failed attempt ``n`` is retried after ``base * 2**(n-1)`` seconds, capped at ``max_delay``,
    scaled by a random factor in ``[1 - jitter, 1 + jitter]``; a job's last attempt is the lesser
    of its own ``max_attempts`` and this policy's, after which it is dead-lettered. The defaults
    and the arithmetic are the core's: 10 attempts from 1 s up to 1 h, 20% jitter."""

    max_attempts: int = _DEFAULTS[0]
    base: float = _DEFAULTS[1]
    max_delay: float = _DEFAULTS[2]
    jitter: float = _DEFAULTS[3]

    def __post_init__(self) -> None:
        try:
            _native.check_retry(self._numbers())
        except (ValueError, OverflowError, TypeError) as error:
            raise ValueError(f"retry policy {self}: {error}") from None

    def _numbers(self) -> tuple[int, float, float, float]:
        return (self.max_attempts, float(self.base), float(self.max_delay), float(self.jitter))

    def delay(self, attempt: int, unit: float | None = None) -> float:
        """Seconds before the attempt after failed attempt ``attempt`` (1-based); ``unit`` in
        ``[0, 1]`` draws the jitter (random when ``None``)."""
        unit = random.random() if unit is None else unit
        return _native.retry_delay(self._numbers(), max(attempt, 1), unit)

    def last_attempt(self, job_max_attempts: int) -> int:
        """The last attempt of a job enqueued with ``job_max_attempts``."""
        return _native.last_attempt(self._numbers(), job_max_attempts)
