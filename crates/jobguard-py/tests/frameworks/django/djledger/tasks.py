"""The kill tests' guarded task, as ``frameworks/celery/celery_app.py``'s but on Django:
``credit`` writes a ledger row with the ORM, in the atomic block ``DjangoTask`` opened, with
a soft time limit of 2 s and a hard one of 4 s, and retries a transient failure after 0.2 s,
0.4 s, ... (at most 1 s).
``JOBGUARD_TEST_UNGUARDED=1`` defines it without the guard (the check that the test can
fail)."""

from __future__ import annotations

import os

from celery import Task, shared_task
from django.db import connection, transaction

import jobguard
from frameworks import kills
from jobguard.django.celery import DjangoTask

from .models import Ledger

URL = os.environ.get("JOBGUARD_DJANGO_DATABASE_URL", "")
GROUP = os.environ.get("JOBGUARD_TEST_KILL_GROUP") == "1"


def effect(key: str) -> None:
    Ledger.objects.create(job_key=key, pid=os.getpid())
    # The retry tests' points, on Django's psycopg connection, in the task's transaction.
    kills.misbehave(connection.connection, key)
    with connection.cursor() as cursor:
        kills.record(cursor, key, "applied")
    kills.die_here("before-commit", key, group=GROUP)


class CreditTask(DjangoTask):
    def on_duplicate(self, duplicate, args, kwargs):
        super().on_duplicate(duplicate, args, kwargs)
        kills.record_duplicate(URL, jobguard.key("credit", args[0]))

    def after_return(self, status, retval, task_id, args, kwargs, einfo):
        # After the commit, before the late ack.
        kills.die_here("after-commit", jobguard.key("credit", args[0]), group=GROUP)


class NaiveTask(Task):
    acks_late = True
    reject_on_worker_lost = True

    def after_return(self, status, retval, task_id, args, kwargs, einfo):
        kills.die_here("after-commit", jobguard.key("credit", args[0]), group=GROUP)


if kills.unguarded():

    @shared_task(name="credit", base=NaiveTask, soft_time_limit=2, time_limit=4)
    def credit(order: str) -> None:
        with transaction.atomic():
            effect(jobguard.key("credit", order))

else:

    @shared_task(
        name="credit",
        base=CreditTask,
        guard_key=lambda order: jobguard.key("credit", order),
        soft_time_limit=2,
        time_limit=4,
        guard_retry_backoff=0.2,
        guard_retry_backoff_max=1.0,
    )
    def credit(order: str) -> dict:
        effect(jobguard.key("credit", order))
        return {"credited": order}
