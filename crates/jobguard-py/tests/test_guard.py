"""The guard on every driver: one suite, run once per driver (see conftest.CLIENTS)."""

from __future__ import annotations

import asyncio

import pytest

import jobguard
from conftest import POSTGRES_DRIVERS, count, guard_rows, ledger_rows

pytestmark = pytest.mark.asyncio


async def test_applies_once_and_a_redelivery_is_a_duplicate_with_the_stored_result(connect):
    c = await connect()
    key = jobguard.key("credit", "order-1")
    await c.begin()
    g = await c.enter(key, {"account": 7, "amount": 500})
    assert g.applied and not g.duplicate
    await c.effect(key)
    g.set_result({"ledger": 1, "note": "ü"})
    await c.exit(g)
    await c.commit()

    await c.begin()
    again = await c.enter(key, {"amount": 500, "account": 7})
    assert again.duplicate and not again.applied
    assert again.result == {"ledger": 1, "note": "ü"}
    assert again.first_applied_at is not None
    await c.exit(again)
    await c.commit()
    assert await ledger_rows(c, key) == 1


async def test_without_a_payload_a_duplicate_reads_what_the_first_delivery_left_on_demand(connect):
    c = await connect()
    key = jobguard.key("credit", "order-held")
    await c.begin()
    g = await c.enter(key)
    assert await c.held(g) is None
    assert g.first_applied_at is None and g.result is None
    await c.effect(key)
    g.set_result({"ledger": 1})
    await c.exit(g)
    await c.commit()

    await c.begin()
    again = await c.enter(key)
    assert again.duplicate
    if c.is_async:
        # An attribute cannot await: the read is asked for, and the error says how.
        with pytest.raises(jobguard.HeldNotRead, match="await g.held"):
            again.result
    held = await c.held(again)
    assert isinstance(held, jobguard.Duplicate)
    assert held.result == {"ledger": 1} and held.first_applied_at is not None
    assert again.result == {"ledger": 1} and again.first_applied_at == held.first_applied_at
    assert await c.held(again) is held  # read once
    await c.exit(again)
    await c.commit()
    assert await ledger_rows(c, key) == 1


async def test_rollback_leaves_no_guard_row_and_the_retry_applies(connect):
    c = await connect()
    key = jobguard.key("credit", "order-2")
    await c.begin()
    g = await c.enter(key)
    await c.effect(key)
    await c.exit(g, RuntimeError("the effect failed"))
    await c.rollback()
    assert await guard_rows(c, key) == 0
    assert await ledger_rows(c, key) == 0

    await c.begin()
    retry = await c.enter(key)
    assert retry.applied
    await c.effect(key)
    await c.exit(retry)
    await c.commit()
    assert await ledger_rows(c, key) == 1


async def test_a_key_reused_with_another_payload_is_refused(connect):
    c = await connect()
    key = jobguard.key("credit", "order-3")
    await c.begin()
    g = await c.enter(key, {"amount": 500})
    await c.exit(g)
    await c.commit()

    await c.begin()
    with pytest.raises(jobguard.KeyReused) as raised:
        await c.enter(key, {"amount": 501})
    assert raised.value.key == key
    await c.rollback()
    # Without a payload there is nothing to compare: a duplicate.
    await c.begin()
    g = await c.enter(key)
    assert g.duplicate
    await c.exit(g)
    await c.commit()


async def test_refused_outside_a_transaction_before_writing_anything(connect, driver):
    c = await connect()
    key = jobguard.key("credit", "order-4")
    if driver.startswith("sqlalchemy"):
        # SQLAlchemy begins on first use; a connection that has not begun is outside one.
        pass
    with pytest.raises(jobguard.NotInTransaction):
        await c.enter(key)
    assert await guard_rows(c, key) == 0


async def test_refused_inside_a_savepoint(connect, driver):
    if driver in ("asyncpg", "sqlite3", "aiosqlite"):
        pytest.skip(f"{driver} does not track its savepoints; docs/python.md says so")
    c = await connect()
    key = jobguard.key("credit", "order-5")
    await c.begin()
    nested = None
    if driver.startswith("psycopg"):
        nested = c.conn.transaction()
        await c.call(nested.__aenter__ if c.is_async else nested.__enter__)
    elif driver == "sqlalchemy_async":
        await c.conn.begin_nested()
    else:
        await asyncio.to_thread(c.conn.begin_nested)
    with pytest.raises(jobguard.InSavepoint):
        await c.enter(key)
    if nested is not None:
        await c.call(nested.__aexit__ if c.is_async else nested.__exit__, None, None, None)
    await c.rollback()
    assert await guard_rows(c, key) == 0


@pytest.mark.parametrize("first_commits", [True, False], ids=["commit", "rollback"])
async def test_a_concurrent_claim_waits_then_is_a_duplicate_or_applies(
    connect, driver, first_commits
):
    a, b = await connect(), await connect()
    key = jobguard.key("credit", "order-6")
    await a.begin()
    first = await a.enter(key)
    assert first.applied
    await a.effect(key)

    async def second() -> bool:
        await b.begin()
        g = await b.enter(key)
        if g.applied:
            await b.effect(key)
        await b.exit(g)
        await b.commit()
        return g.applied

    task = asyncio.create_task(second())
    if driver in POSTGRES_DRIVERS:
        # Wait until the second claim is blocked on the first one's row lock.
        watcher = await connect()
        while True:
            await watcher.begin()
            waiting = await count(
                watcher,
                "select count(*) from pg_stat_activity "
                "where datname = current_database() and wait_event_type = 'Lock'",
                [],
            )
            await watcher.commit()
            if waiting:
                break
            assert not task.done(), "the second claim did not wait for the first"
            await asyncio.sleep(0.01)
    if first_commits:
        await a.exit(first)
        await a.commit()
    else:
        await a.exit(first, RuntimeError("crash"))
        await a.rollback()
    applied = await task
    assert applied is (not first_commits)
    assert await ledger_rows(a, key) == 1


async def test_bad_input_raises_typed_errors_and_writes_nothing(connect):
    c = await connect()
    await c.begin()
    with pytest.raises(jobguard.InvalidKey):
        c.guard("no-parts")
    with pytest.raises(jobguard.PayloadError):
        c.guard(jobguard.key("k", "a"), {"x": {1, 2}})
    with pytest.raises(jobguard.InvalidName):
        jobguard.guard(c.conn, jobguard.key("k", "a"), table="jobs; drop table x")
    await c.rollback()
    assert await guard_rows(c, jobguard.key("k", "a")) == 0


async def test_a_closed_connection_is_refused(connect):
    c = await connect()
    await c.close()
    with pytest.raises(jobguard.ConnectionClosed):
        await c.enter(jobguard.key("k", "closed"))


async def test_migrate_is_idempotent(connect):
    c = await connect()
    await c.migrate()
    await c.migrate()


async def test_an_unknown_connection_object_is_refused():
    with pytest.raises(jobguard.UnsupportedConnection):
        jobguard.guard_sync(object(), jobguard.key("k", "a"))
