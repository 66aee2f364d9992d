"""The Celery app the kill tests run as a worker: one guarded credit task.

Configured from the environment: JOBGUARD_TEST_BROKER (amqp:// or redis://), DATABASE_URL,
JOBGUARD_TEST_QUEUE, JOBGUARD_TEST_KILL_GROUP (kill the whole worker, not only the pool child).

``credit`` runs with a soft time limit of 2 s and a hard one of 4 s, and retries a transient
failure after 0.2 s, 0.4 s, ... (at most 1 s): the retry tests stay short. Sending a key's
retry raises once when ``refuse`` is armed for it; every retry counted is written to the
database (``kills.count_retries``).
"""

from __future__ import annotations

import os

import psycopg
from celery import Celery, Task
from kombu.exceptions import OperationalError

import jobguard
from jobguard.celery import GuardedTask

import kills

URL = os.environ["DATABASE_URL"]
QUEUE = os.environ["JOBGUARD_TEST_QUEUE"]
GROUP = os.environ.get("JOBGUARD_TEST_KILL_GROUP") == "1"

kills.count_retries(URL)

app = Celery("celery_app", broker=os.environ["JOBGUARD_TEST_BROKER"])
app.conf.update(
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    # Redis: a message unacked this long is handed out again; swept every second.
    broker_transport_options={
        "visibility_timeout": 2,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
)


def connect() -> psycopg.Connection:
    return psycopg.connect(URL)


def effect(conn: psycopg.Connection, key: str) -> None:
    conn.execute("insert into ledger (job_key, pid) values (%s, %s)", (key, os.getpid()))
    kills.misbehave(conn, key)
    kills.record(conn, key, "applied")
    kills.die_here("before-commit", key, group=GROUP)


class CreditTask(GuardedTask):
    def on_duplicate(self, duplicate, args, kwargs):
        super().on_duplicate(duplicate, args, kwargs)
        kills.record_duplicate(URL, jobguard.key("credit", args[0]))

    def after_return(self, status, retval, task_id, args, kwargs, einfo):
        # After the commit, before the late ack.
        kills.die_here("after-commit", jobguard.key("credit", args[0]), group=GROUP)

    def apply_async(self, args=None, kwargs=None, **options):
        # The worker sends a retry through here (`self.retry`, and GuardedRequest after a
        # hard time limit); the error is kombu's for a publish that failed.
        if args and kills.refuse_send(jobguard.key("credit", args[0])):
            raise OperationalError("the broker refused the publish (test)")
        return super().apply_async(args, kwargs, **options)


class NaiveTask(Task):
    acks_late = True
    reject_on_worker_lost = True

    def after_return(self, status, retval, task_id, args, kwargs, einfo):
        kills.die_here("after-commit", jobguard.key("credit", args[0]), group=GROUP)


if kills.unguarded():

    @app.task(name="credit", base=NaiveTask, soft_time_limit=2, time_limit=4)
    def credit(order: str) -> None:
        with connect() as conn:
            effect(conn, jobguard.key("credit", order))

else:

    @app.task(
        name="credit",
        base=CreditTask,
        guard_key=lambda order: jobguard.key("credit", order),
        guard_db=connect,
        soft_time_limit=2,
        time_limit=4,
        guard_retry_backoff=0.2,
        guard_retry_backoff_max=1.0,
    )
    def credit(conn: psycopg.Connection, order: str) -> dict:
        effect(conn, jobguard.key("credit", order))
        return {"credited": order}


# The quick start's task, called as docs/python.md calls it: `credit_amount.delay(order, amount)`.
@app.task(
    base=GuardedTask,
    guard_key=lambda order, amount: jobguard.key("credit", order),
    guard_db=connect,
)
def credit_amount(conn: psycopg.Connection, order: str, amount: int) -> dict:
    key = jobguard.key("credit", order)
    conn.execute("insert into ledger (job_key, pid) values (%s, %s)", (key, os.getpid()))
    kills.record(conn, key, "applied")
    return {"credited": amount}
