"""Django's own connection as a jobguard driver: the guard's statements, from the Rust core, run
through ``connections[alias].cursor()`` inside the atomic block the caller opened.

Django owns the connection and its transactions: ``transaction.atomic()`` begins one (on
PostgreSQL the first statement begins it; on SQLite Django sends ``BEGIN``, or ``BEGIN
IMMEDIATE`` with ``OPTIONS={"transaction_mode": "IMMEDIATE"}``), so the driver asks Django
whether an atomic block is open rather than the database driver underneath.
"""

from __future__ import annotations

from typing import Any, Sequence

from django.db import connections, transaction

from .._drivers import Row, SyncDriver, convert
from ..errors import ConnectionClosed, NotInTransaction, UnsupportedConnection

_DIALECTS = {"postgresql": "postgres", "sqlite": "sqlite"}


def dialect_of(connection: Any) -> str:
    """jobguard's dialect for a Django connection: ``postgres`` or ``sqlite``."""
    try:
        return _DIALECTS[connection.vendor]
    except KeyError:
        raise UnsupportedConnection(
            f"database alias {connection.alias!r} is {connection.vendor}: jobguard runs on "
            "PostgreSQL and SQLite"
        ) from None


class DjangoDriver(SyncDriver):
    """One Django database alias's connection, in the calling thread."""

    # Django loads jsonb as text (its JSONField decodes it) and SQLite keeps JSON as text.
    decodes_json = False

    def __init__(self, connection: Any) -> None:
        super().__init__(connection)
        self.dialect = dialect_of(connection)
        self.name = f"Django ({connection.alias!r}, {connection.vendor})"

    def check(self) -> None:
        c = self.conn
        if not c.in_atomic_block:
            raise NotInTransaction(
                "jobguard.django.guard needs an atomic block on database alias "
                f"{c.alias!r}, so that the guard row commits or rolls back with the effect: "
                f"`with transaction.atomic(using={c.alias!r}):` around it"
            )
        if c.needs_rollback:
            raise ConnectionClosed(
                f"the atomic block on {c.alias!r} already failed: it rolls back when it ends; "
                "deliver the job again in a new one"
            )
        # A nested atomic block is a savepoint: the guard row is the savepoint's, released
        # into the outer transaction or rolled back with it (docs/python.md, Django).

    def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        text, args = convert(sql, params, "format")
        with self.conn.cursor() as cursor:
            cursor.execute(text, args if params else None)
            row = cursor.fetchone()
        return None if row is None else tuple(row)

    def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        text, args = convert(sql, params, "format")
        with self.conn.cursor() as cursor:
            cursor.execute(text, args if params else None)
            return [tuple(row) for row in cursor.fetchall()]

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        text, args = convert(sql, params, "format")
        with self.conn.cursor() as cursor:
            cursor.execute(text, args if params else None)

    def transaction(self) -> Any:
        """An atomic block on this alias (a savepoint inside one already open)."""
        return transaction.atomic(using=self.conn.alias)

    def close(self) -> None:
        """Nothing: the connection is Django's, closed by Django when it is old or unusable."""


class Database:
    """A Django database alias as the ``db=`` jobguard's runners take (``jobguard.guarded``,
    Celery's ``GuardedTask``): they call it for a connection, run the job in its
    ``transaction()`` and ``close()`` it. Here the connection is Django's own for the alias,
    the transaction ``transaction.atomic(using=alias)``, and closing it is Django's business."""

    def __init__(self, using: str) -> None:
        self.using = using

    def __call__(self) -> DjangoDriver:
        return DjangoDriver(connections[self.using])

    def __repr__(self) -> str:
        return f"jobguard.django.Database({self.using!r})"
