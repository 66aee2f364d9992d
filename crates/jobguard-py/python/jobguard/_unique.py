"""Unique-job policies on Python enqueue: what a repeated enqueue of a key does.

A :class:`Unique` chooses how long a key stays taken and what a second enqueue of it gets,
exactly as the Rust queue's ``UniqueOpts``: the states that keep the key (the live ones
always, plus ``completed`` and/or ``dead``), a period appended to the key, the queue appended
to the key, and the action on conflict (``return``, ``reject``, ``replace``,
``replace-or-reject``). The rules, their checks and messages, and the statements (the insert
that stores the policy, the read of the job holding the key, the replace of a waiting one)
come from the Rust core through ``jobguard._native``: Python holds no second copy.

The enqueue is written once, as a sequence of statements (:func:`steps`), and run by an async
or a sync driver (:func:`run_async`, :func:`run_sync`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import time
from typing import Any, Generator, Sequence, cast

from . import _native
from .errors import EnqueueRejected, InvalidName, InvalidUnique, KeyReused, ReplaceRejected

#: An operation the driver runs: ("fetchone" | "execute", sql, params).
Step = tuple[str, str, Sequence[Any]]

# A job holding the key can finish between the insert and the read; then the insert succeeds
# on the next round (as in Rust).
_ROUNDS = 3


@dataclasses.dataclass(frozen=True)
class Unique:
    """A unique-job policy, checked by the Rust core when made.

    ``states``: the states that keep the key taken, a comma-separated string or a sequence
    (``("available", "running", "completed")``); the live ones are always among them. ``period``:
    seconds (or a ``timedelta``) whose start, in UTC, is appended to the key (a day:
    ``fee:account-7:2026-10-02``). ``by_queue``: the queue appended to the key. ``on_conflict``:
    ``return`` (the job holding the key), ``reject`` (:class:`EnqueueRejected`), ``replace`` (its
    payload and run time while it waits) or ``replace-or-reject`` (:class:`ReplaceRejected` when
    it no longer waits)."""

    states: str | Sequence[str] | None = None
    period: float | _dt.timedelta | None = None
    by_queue: bool = False
    on_conflict: str = "return"
    # Set from the core's answer when made.
    _mask: int = dataclasses.field(init=False, repr=False, compare=False)
    _seconds: int | None = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        states = self.states
        if states is not None and not isinstance(states, str):
            states = ",".join(states)
        period = self.period
        if isinstance(period, _dt.timedelta):
            period = period.total_seconds()
        if period is not None and (isinstance(period, bool) or not isinstance(period, (int, float))):
            raise InvalidUnique(f"invalid unique period `{period!r}`: give seconds or a timedelta")
        try:
            mask, canonical, action = _native.unique_policy(
                states, None if period is None else float(period), self.on_conflict
            )
        except (ValueError, TypeError) as error:
            raise InvalidUnique(str(error)) from None
        object.__setattr__(self, "_mask", mask)
        object.__setattr__(self, "_seconds", None if period is None else int(period))
        object.__setattr__(self, "states", canonical)
        object.__setattr__(self, "on_conflict", action)

    @property
    def mask(self) -> int:
        """The ``unique_states`` stored with the job: 0 for the live states only."""
        return self._mask

    def stored_key(self, key: str, queue: str, run_at: float) -> str:
        """``key`` as stored: with the queue when by queue, then the start of the period
        ``run_at`` (seconds since the epoch, this process's clock) falls in."""
        if not self.by_queue and self._seconds is None:
            return key
        return _native.unique_key(key, queue, self.by_queue, self._seconds, int(run_at))


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a unique enqueue did: the fields of :class:`jobguard.Enqueued`."""

    id: int
    inserted: bool
    replaced: bool = False
    existing_state: str | None = None


@functools.lru_cache(maxsize=64)
def _sql(dialect: str, table: str, schema: str | None) -> dict[str, str]:
    try:
        return cast(dict[str, str], _native.unique_sql(dialect, table, schema))
    except ValueError as error:
        raise InvalidName(str(error)) from None


def resolve(job: Any, unique: Unique, delay: float) -> None:
    """Puts ``job``'s stored key in place: with its queue and period, as the policy says."""
    key = unique.stored_key(job.key, job.queue, time.time() + delay)
    job.key = key
    job.params[1] = key


def steps(job: Any, unique: Unique, dialect: str, table: str, schema: str | None,
          encode: Any, decode: Any) -> Generator[Step, Any, Any]:
    """The statements of ``job``'s enqueue under ``unique``, as the Rust ``Queue::enqueue_tx``
    runs them: insert; when a job holds the key, read it and settle by the policy. Returns its
    :class:`Outcome`."""
    sql = _sql(dialect, table, schema)
    mask = unique.mask
    params = list(job.params)
    params[3] = encode(job.text)
    for _ in range(_ROUNDS):
        if mask:
            row = yield ("fetchone", sql["enqueue_unique"], params + [mask])
        else:
            row = yield ("fetchone", job.sql["enqueue"], params)
        if row is not None:
            if "notify" in job.sql:
                yield ("execute", job.sql["notify"], [job.sql["notify_channel"], job.queue])
            return Outcome(int(row[0]), True)
        holder = yield ("fetchone", sql["holder"], [job.key, 1 if mask else 0])
        if holder is not None:
            return (yield from _settle(job, unique, sql, holder, params, decode))
    raise job.lost()


def _settle(job: Any, unique: Unique, sql: dict[str, str], holder: tuple[Any, ...],
            params: list[Any],
            decode: Any) -> Generator[Step, Any, Any]:
    """What the enqueue does about ``holder``, the job holding its key, by the core's rule."""
    holder_id, key, kind, payload, state, live = holder
    holder_id, live = int(holder_id), bool(live)
    action = _native.unique_settle(unique.on_conflict, kind == job.kind,
                                   decode(payload) == job.value)
    if action == "return":
        return Outcome(holder_id, False, existing_state=state)
    if action == "key_reused":
        raise KeyReused(
            key, None,
            message=f"job key `{key}` is held by job {holder_id} ({state}) with another payload "
            "or kind: nothing was enqueued; give different work its own key",
        )
    if action == "reject":
        raise EnqueueRejected(key, holder_id, state,
                              _native.unique_refusal(key, holder_id, state, False))
    # Only a live holder can still wait; the statement decides whether it does.
    if live:
        replaced = yield ("fetchone", sql["replace"], [holder_id, params[3], params[5]])
        if replaced is not None:
            if "notify" in job.sql:
                yield ("execute", job.sql["notify"], [job.sql["notify_channel"], job.queue])
            return Outcome(holder_id, False, replaced=True, existing_state=state)
        # A worker holds it (or took it since the read): report the state it is in now.
        now = yield ("fetchone", sql["holder"], [key, 1])
        if now is not None and int(now[0]) == holder_id:
            state = now[4]
    if action == "replace_or_reject":
        raise ReplaceRejected(key, holder_id, state,
                              _native.unique_refusal(key, holder_id, state, True))
    return Outcome(holder_id, False, existing_state=state)


async def run_async(d: Any, gen: Generator[Step, Any, Any]) -> Any:
    """Runs ``gen``'s statements on the async driver ``d``; what it returns."""
    result = None
    while True:
        try:
            op, statement, params = gen.send(result)
        except StopIteration as done:
            return done.value
        if op == "fetchone":
            result = await d.fetchone(statement, params)
        else:
            result = await d.execute(statement, params)


def run_sync(d: Any, gen: Generator[Step, Any, Any]) -> Any:
    """Runs ``gen``'s statements on the sync driver ``d``; what it returns."""
    result = None
    while True:
        try:
            op, statement, params = gen.send(result)
        except StopIteration as done:
            return done.value
        result = d.fetchone(statement, params) if op == "fetchone" else d.execute(statement, params)
