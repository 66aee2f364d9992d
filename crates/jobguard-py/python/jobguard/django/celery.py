"""Celery in a Django project: :class:`DjangoTask`, a task base that runs the task in
``transaction.atomic(using=guard_using)`` with its guard row.

::

    @app.task(base=DjangoTask, guard_key=lambda order, amount: jobguard.key("credit", order))
    def credit(order, amount):
        Ledger.objects.create(account=7, amount=amount)  # in the task's atomic block
        return {"credited": amount}

It is :class:`jobguard.celery.GuardedTask` with Django's connection of the alias as its
database: the same late ack and requeue of a killed child, the same retries of a delivery whose
transaction did not commit for a transient reason (``guard_max_retries``,
``guard_retry_backoff``, a hard time limit through ``GuardedRequest``), the same stored result
for a duplicate and ``on_duplicate``. The task takes no ``conn``: the ORM runs on Django's
connection, inside the atomic block the task base opened.

The guard table is Django's to migrate (``python manage.py migrate``): ``guard_migrate`` is
off, and a task on a database not migrated yet raises ``NotMigrated``, retried as a transient
failure until it is.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS

from ..celery import GuardedRequest, GuardedTask
from ._driver import Database

__all__ = ["DjangoTask", "GuardedRequest"]


class DjangoTask(GuardedTask):
    """A :class:`GuardedTask` whose transaction is ``transaction.atomic(using=guard_using)``;
    see the module."""

    #: The Django database alias the task's atomic block and guard row are on.
    guard_using: str = DEFAULT_DB_ALIAS
    guard_migrate = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        header = cls.__dict__.get("__header__")
        super().__init_subclass__(**kwargs)
        # GuardedTask checks calls against the task's signature less its `conn`; a Django
        # task has none: its own signature stands.
        if header is not None:
            cls.__header__ = header
        if cls.__dict__.get("guard_db") is None:
            cls.guard_db = Database(cls.guard_using)

    def _run_in_transaction(self, conn: Any, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)
