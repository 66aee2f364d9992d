"""``@jobguard.guarded``: the transaction, the claim and the call, with no ``if`` to write.

The decorated function is called only when this delivery claims the key, with the
transaction's connection as its first argument; on a duplicate it is not called at all.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, cast

from ._guard import DEFAULT_TABLE, guard, guard_sync
from ._outcome import Applied, Duplicate
from ._transactions import _Async, _Sync


def _resolve(spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return spec(*args, **kwargs) if callable(spec) else spec


def guarded(
    *,
    key: str | Callable[..., str],
    db: Any,
    payload: Any | Callable[..., Any] = None,
    table: str = DEFAULT_TABLE,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Runs the decorated function at most once per key, in a transaction with the guard row.

    ``key`` (and ``payload``) are values or functions of the call's arguments. The function is
    called as ``fn(conn, *args, **kwargs)`` on the transaction's connection only when this
    delivery claims the key; the call returns :class:`Applied` with its value, or
    :class:`Duplicate` without calling it::

        @jobguard.guarded(key=lambda order, amount: jobguard.key("credit", order), db=pool)
        async def credit(conn, order, amount):
            await conn.execute("insert into ledger(account, amount) values(7, $1)", amount)
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn):
            runner = _Async(db)

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Applied[Any] | Duplicate:
                job_key = _resolve(key, args, kwargs)
                body_payload = _resolve(payload, args, kwargs)

                async def body(conn: Any) -> Applied[Any] | Duplicate:
                    async with guard(conn, job_key, body_payload, table=table) as g:
                        if g.duplicate:
                            return cast(Duplicate, await g.held())
                        value = await fn(conn, *args, **kwargs)
                        if value is not None:
                            g.set_result(value)
                        return Applied(value)

                return cast(Applied[Any] | Duplicate, await runner.run(body))

            return run_async

        sync_runner = _Sync(db)

        @functools.wraps(fn)
        def run_sync(*args: Any, **kwargs: Any) -> Applied[Any] | Duplicate:
            job_key = _resolve(key, args, kwargs)
            body_payload = _resolve(payload, args, kwargs)

            def body(conn: Any) -> Applied[Any] | Duplicate:
                with guard_sync(conn, job_key, body_payload, table=table) as g:
                    if g.duplicate:
                        return cast(Duplicate, g.held())
                    value = fn(conn, *args, **kwargs)
                    if value is not None:
                        g.set_result(value)
                    return Applied(value)

            return cast(Applied[Any] | Duplicate, sync_runner.run(body))

        return run_sync

    return decorate
