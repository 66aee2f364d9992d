"""``jobguard.django.guard`` and ``guarded`` on Django's connection, on PostgreSQL (psycopg 3)
and on SQLite: each test runs on both database aliases, with committed transactions
(pytest-django's ``transaction=True``), every delivery in a ``transaction.atomic()`` of its own.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest
from django.db import connections, transaction
from djledger.models import Ledger

import jobguard
import jobguard.django
from jobguard.django.models import GuardRow

BOTH = pytest.mark.parametrize("using", [
    pytest.param(alias, marks=pytest.mark.django_db(transaction=True, databases=[alias]))
    for alias in ("default", "sqlite")
])
POSTGRES = pytest.mark.django_db(transaction=True, databases=["default"])
# A safety net for a thread that hangs, not an assertion on speed.
HANG_LIMIT_S = 60


class Boom(Exception):
    pass


def new_key() -> str:
    return jobguard.key("credit", uuid.uuid4().hex)


def effect(using: str, key: str) -> None:
    Ledger.objects.using(using).create(job_key=key, pid=os.getpid())


def deliver(using: str, key: str, payload=None) -> jobguard.Guard:
    """One delivery: the effect only when it holds the key; its result stored."""
    with transaction.atomic(using=using):
        with jobguard.django.guard(key, payload, using=using) as g:
            if g.applied:
                effect(using, key)
                g.set_result({"credited": key})
    return g


def effects(using: str, key: str) -> int:
    return Ledger.objects.using(using).filter(job_key=key).count()


def guard_row(using: str, key: str) -> GuardRow | None:
    return GuardRow.objects.using(using).filter(job_key=key).first()


@BOTH
def test_a_duplicate_skips_its_effect_and_reads_the_first_result(using):
    key = new_key()
    first = deliver(using, key)
    assert first.applied and first.result is None
    again = deliver(using, key)
    assert again.duplicate
    assert again.result == {"credited": key}
    assert again.first_applied_at is not None and again.first_applied_at.tzinfo is not None
    assert effects(using, key) == 1
    row = guard_row(using, key)
    assert row.kind == "credit" and row.result == {"credited": key}
    assert row.applied_at == again.first_applied_at


@BOTH
def test_guarded_calls_the_body_once_and_returns_the_stored_result(using):
    calls = []

    @jobguard.django.guarded(key=lambda order, amount: jobguard.key("credit", order), using=using)
    def credit(order: str, amount: int) -> dict:
        calls.append(order)
        effect(using, jobguard.key("credit", order))
        return {"credited": amount}

    order = uuid.uuid4().hex
    assert credit(order, 500) == jobguard.Applied({"credited": 500})
    again = credit(order, 500)
    assert isinstance(again, jobguard.Duplicate) and again.result == {"credited": 500}
    assert calls == [order]
    assert effects(using, jobguard.key("credit", order)) == 1


def test_guarded_refuses_an_async_function():
    async def credit(order: str) -> None:
        pass

    with pytest.raises(jobguard.UnsupportedConnection, match="sync_to_async"):
        jobguard.django.guarded(key=lambda order: jobguard.key("credit", order))(credit)


@BOTH
def test_a_rolled_back_atomic_block_leaves_no_guard_row_and_the_retry_applies(using):
    key = new_key()
    with pytest.raises(Boom):
        with transaction.atomic(using=using):
            with jobguard.django.guard(key, using=using) as g:
                assert g.applied
                effect(using, key)
                raise Boom
    assert guard_row(using, key) is None
    assert effects(using, key) == 0
    assert deliver(using, key).applied
    assert effects(using, key) == 1


@BOTH
def test_outside_an_atomic_block_it_refuses_before_writing(using):
    key = new_key()
    with pytest.raises(jobguard.NotInTransaction, match="transaction.atomic"):
        with jobguard.django.guard(key, using=using):
            pass
    assert guard_row(using, key) is None


@BOTH
def test_a_rolled_back_savepoint_takes_its_guard_row_and_the_key_applies_again(using):
    """Inside a nested atomic block the guard row is the savepoint's: rolled back with the
    effect written in it, so the same outer transaction (or a retry) can apply the key."""
    key = new_key()
    with transaction.atomic(using=using):
        with pytest.raises(Boom):
            with transaction.atomic(using=using):  # a savepoint
                with jobguard.django.guard(key, using=using) as g:
                    assert g.applied
                    effect(using, key)
                    raise Boom
        assert guard_row(using, key) is None  # in this transaction: gone with the savepoint
        assert effects(using, key) == 0
        with transaction.atomic(using=using):
            with jobguard.django.guard(key, using=using) as g:
                assert g.applied
                effect(using, key)
    assert effects(using, key) == 1
    assert deliver(using, key).duplicate


@BOTH
def test_a_released_savepoint_commits_or_rolls_back_with_the_outer_block(using):
    committed, rolled_back = new_key(), new_key()
    with transaction.atomic(using=using):
        with transaction.atomic(using=using):
            assert deliver(using, committed).applied  # deliver's own block: a savepoint
        assert deliver(using, committed).duplicate  # the released row holds the key
    with pytest.raises(Boom):
        with transaction.atomic(using=using):
            assert deliver(using, rolled_back).applied
            raise Boom
    assert guard_row(using, committed) is not None and effects(using, committed) == 1
    assert guard_row(using, rolled_back) is None and effects(using, rolled_back) == 0


@BOTH
def test_a_key_reused_with_another_payload_rolls_the_block_back(using):
    key = new_key()
    assert deliver(using, key, {"amount": 500}).applied
    assert deliver(using, key, {"amount": 500}).duplicate
    with pytest.raises(jobguard.KeyReused):
        deliver(using, key, {"amount": 900})
    assert effects(using, key) == 1


def _in_thread(using: str, target, *args) -> threading.Thread:
    """``target(*args)`` in a thread of its own, on its own Django connection (closed after);
    an exception is kept in ``thread.error``."""

    def run() -> None:
        try:
            target(*args)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            thread.error = error
        finally:
            connections[using].close()

    thread = threading.Thread(target=run, daemon=True)
    thread.error = None
    thread.start()
    return thread


@BOTH
def test_concurrent_deliveries_of_the_same_keys_apply_each_once(using):
    """Four threads deliver the same ten keys at once, each in its own transaction on its own
    connection: on PostgreSQL the later claims wait on the first's row, on SQLite on the write
    lock; every key takes effect once, every other delivery is a duplicate."""
    keys = [new_key() for _ in range(10)]
    start = threading.Barrier(4)
    outcomes: list[bool] = []
    lock = threading.Lock()

    def worker() -> None:
        start.wait(HANG_LIMIT_S)
        for key in keys:
            applied = deliver(using, key).applied
            with lock:
                outcomes.append(applied)

    threads = [_in_thread(using, worker) for _ in range(4)]
    for thread in threads:
        thread.join(HANG_LIMIT_S)
        assert not thread.is_alive() and thread.error is None, thread.error
    assert sorted(outcomes) == [False] * 30 + [True] * 10
    assert {k: effects(using, k) for k in keys} == {k: 1 for k in keys}


def _wait_for_a_lock_wait() -> None:
    """Until a backend of the test database waits on a lock: the second claim, on the row the
    first holds."""
    deadline = time.monotonic() + HANG_LIMIT_S
    with connections["default"].cursor() as cursor:
        while True:
            cursor.execute(
                "select count(*) from pg_stat_activity "
                "where datname = current_database() and wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0] > 0:
                return
            assert time.monotonic() < deadline, "the second delivery never waited"
            time.sleep(0.05)


@POSTGRES
@pytest.mark.parametrize("first_commits", [True, False])
def test_a_delivery_waiting_on_an_open_one_is_a_duplicate_or_applies(first_commits):
    """PostgreSQL: the second delivery's claim waits on the first's uncommitted row; it is a
    duplicate when the first commits, and applies when the first rolls back."""
    key = new_key()
    claimed, release = threading.Event(), threading.Event()
    second: list[jobguard.Guard] = []

    def first() -> None:
        with transaction.atomic():
            with jobguard.django.guard(key) as g:
                assert g.applied
                effect("default", key)
                claimed.set()
                release.wait(HANG_LIMIT_S)
                if not first_commits:
                    raise Boom

    one = _in_thread("default", first)
    assert claimed.wait(HANG_LIMIT_S)
    two = _in_thread("default", lambda: second.append(deliver("default", key)))
    _wait_for_a_lock_wait()
    assert not second  # still waiting on the first's row
    release.set()
    one.join(HANG_LIMIT_S)
    two.join(HANG_LIMIT_S)
    assert two.error is None, two.error
    assert isinstance(one.error, Boom) if not first_commits else one.error is None
    assert second[0].applied is (not first_commits)
    assert effects("default", key) == 1
