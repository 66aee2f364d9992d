"""The guard on Django's own connection, inside the caller's ``transaction.atomic()``.

::

    with transaction.atomic():
        with jobguard.django.guard(jobguard.key("credit", order), payload) as g:
            if g.applied:
                Ledger.objects.create(account=7, amount=500)
                g.set_result({"credited": 500})

It is :func:`jobguard.guard_sync` (the same statements from the Rust core, the same
:class:`jobguard.Guard`, outcomes and errors) on ``connections[using]``. Outside an atomic
block it raises :class:`jobguard.NotInTransaction` before writing anything: the guard row must
commit or roll back with the effect, and Django's autocommit would commit it alone.

Inside a nested atomic block (a savepoint) the guard row belongs to that savepoint: leaving the
block with an exception rolls the row back with the effects written in it, and the key is free
again (a later claim, in the same transaction or a retry, applies); leaving it normally releases
the row into the outer transaction, which commits it or rolls it back with everything else.
Django's ``TestCase`` runs each test in an atomic block, so there every block of the code under
test is a savepoint, and the guard works the same.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from django.db import DEFAULT_DB_ALIAS, connections

from .._guard import DEFAULT_TABLE, Guard, guard_sync
from .._guarded import guarded as _guarded
from .._outcome import Applied, Duplicate
from ..errors import UnsupportedConnection
from ._driver import Database, DjangoDriver

__all__ = ["guard", "guarded"]


def guard(key: str, payload: Any = None, *, using: str = DEFAULT_DB_ALIAS) -> Guard:
    """``with jobguard.django.guard(key, payload) as g:`` inside ``transaction.atomic(using=
    using)``: ``g.applied`` when this delivery holds the key (do the effect), ``g.duplicate``
    when an earlier one applied it (``g.result``, ``g.first_applied_at``: what it left). A key
    first applied with another payload raises :class:`jobguard.KeyReused` inside the block, so
    the atomic block rolls back."""
    return guard_sync(DjangoDriver(connections[using]), key, payload, table=DEFAULT_TABLE)


def guarded(
    *,
    key: str | Callable[..., str],
    payload: Any | Callable[..., Any] = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Callable[[Callable[..., Any]], Callable[..., Applied[Any] | Duplicate]]:
    """Runs the decorated function at most once per key, in ``transaction.atomic(using=using)``
    with its guard row (a savepoint when an atomic block is already open): it returns
    :class:`jobguard.Applied` with the function's value (stored as the key's result when not
    ``None``), or :class:`jobguard.Duplicate` without calling it. ``key`` and ``payload`` are
    values or functions of the call's arguments; :func:`jobguard.guarded` with Django's
    connection as its database."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Applied[Any] | Duplicate]:
        if inspect.iscoroutinefunction(fn):
            raise UnsupportedConnection(
                f"{fn.__qualname__} is async: Django's atomic blocks are synchronous; guard a "
                "plain def (from async code, call it through asgiref's sync_to_async)"
            )

        @functools.wraps(fn)
        def without_conn(_conn: Any, *args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)  # the ORM runs on Django's connection: no conn to pass

        return _guarded(key=key, db=Database(using), payload=payload)(without_conn)

    return decorate
