"""``DjangoTask`` called in this process (Celery's ``apply``), on each database alias given
as ``guard_using``: the task runs in that alias's atomic block with its guard row, a duplicate
returns the stored result without calling the task, and a task that raises leaves no guard
row."""

from __future__ import annotations

import uuid

import pytest
from celery import Celery
from djledger.models import Ledger

import jobguard
from jobguard.django.celery import DjangoTask
from jobguard.django.models import GuardRow

app = Celery("djtasks", set_as_current=False)
calls: list[str] = []


def define(using: str):
    @app.task(
        name=f"credit-{using}", base=DjangoTask, guard_using=using,
        guard_key=lambda order, fail=False: jobguard.key("credit", order),
    )
    def credit(order: str, fail: bool = False) -> dict:
        calls.append(order)
        Ledger.objects.using(using).create(job_key=order, pid=0)
        if fail:
            raise RuntimeError("the task failed after its effect")
        return {"credited": order}

    return credit


TASKS = {using: define(using) for using in ("default", "sqlite")}


@pytest.mark.parametrize("using", [
    pytest.param(alias, marks=pytest.mark.django_db(transaction=True, databases=[alias]))
    for alias in ("default", "sqlite")
])
def test_a_django_task_runs_once_per_key_on_its_alias(using):
    order = uuid.uuid4().hex
    credit = TASKS[using]
    assert credit.apply(args=(order,)).get() == {"credited": order}
    assert credit.apply(args=(order,)).get() == {"credited": order}  # the stored result
    assert calls.count(order) == 1
    assert Ledger.objects.using(using).filter(job_key=order).count() == 1
    assert GuardRow.objects.using(using).get(job_key=jobguard.key("credit", order)).result == {
        "credited": order
    }

    failing = uuid.uuid4().hex
    with pytest.raises(RuntimeError):
        credit.apply(args=(failing, True)).get()
    assert not GuardRow.objects.using(using).filter(job_key=jobguard.key("credit", failing)).exists()
    assert Ledger.objects.using(using).filter(job_key=failing).count() == 0
