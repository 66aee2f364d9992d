"""``App.migrate``: the queue's tables from Python, with the Rust queue's statements. On each
driver a fresh database migrated by Python runs the app's jobs, and then the Rust ``jobguard``
worker and CLI on the same tables; a database the Rust worker migrated is left as it is (one
schema marker for both), and so is one Python migrated twice."""

from __future__ import annotations

from typing import Any

import pytest

import jobguard
from conftest import database_url, execute, rows
from ledger_app import ASYNC_DRIVERS, LEDGER, SQLITE_DRIVERS, SQLITE_LEDGER, make_app
from test_worker import enqueue


@pytest.fixture
def fresh(driver: str, request: Any) -> str:
    """An empty database of the driver's kind: no table at all."""
    if driver in SQLITE_DRIVERS:
        return str(request.getfixturevalue("tmp_path") / "fresh.db")
    return request.getfixturevalue("pg_url")


async def migrate_from_sync_code(driver: str, app: jobguard.App) -> None:
    import asyncio

    if driver in ASYNC_DRIVERS:
        await app.migrate()
    else:
        await asyncio.to_thread(app.migrate_sync)


async def test_a_database_python_migrated_runs_python_then_rust_jobs(driver, fresh, cli):
    app, calls = make_app(driver, fresh)
    with pytest.raises(jobguard.NotMigrated, match="app.migrate"):
        await app.run_worker(until_idle=True, handle_signals=False)
    await migrate_from_sync_code(driver, app)
    await migrate_from_sync_code(driver, app)  # idempotent
    execute(fresh, SQLITE_LEDGER if driver in SQLITE_DRIVERS else LEDGER)
    await enqueue(driver, fresh, app.jobs["credit"], {"order": "o-py", "amount": 5})
    stats = await app.run_worker(until_idle=True, handle_signals=False)
    assert stats.applied == 1 and calls == {"o-py": 1}
    # The Rust worker and CLI on the tables Python made: its own credit job, then the listing.
    url = database_url(fresh)
    cli("enqueue", "credit", "--payload", '{"order": "o-rs", "account": 7, "amount": 9}', url=url)
    cli("worker", "--until-idle", url=url)
    assert rows(fresh, "select job_key, state from jobguard_jobs order by id") == [
        ("credit:o-py", "completed"), ("credit:o-rs", "completed")]
    listed = cli("jobs", "--json", url=url).stdout
    assert "credit:o-py" in listed and "credit:o-rs" in listed
    assert rows(fresh, "select count(*) from processed_jobs") == [(2,)]


@pytest.fixture
def other_pg_url() -> Any:
    """A second PostgreSQL database of the test's own."""
    import os
    import uuid

    import psycopg

    admin_url = os.environ.get("JOBGUARD_TEST_DATABASE_URL",
                               "postgres://postgres@127.0.0.1:5432/postgres")
    name = "jgpy_" + uuid.uuid4().hex[:12]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'create database "{name}"')
    yield admin_url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'drop database if exists "{name}" with (force)')


async def test_python_and_rust_leave_the_same_schema_marker(driver, fresh, cli, request):
    if driver in SQLITE_DRIVERS:
        # SQLite keeps no marker: the same statements run every time, each a no-op the second.
        app, _ = make_app(driver, fresh)
        await migrate_from_sync_code(driver, app)
        cli("worker", "--until-idle", url=database_url(fresh))
        await migrate_from_sync_code(driver, app)
        assert rows(fresh, "select count(*) from jobguard_jobs") == [(0,)]
        return
    app, _ = make_app(driver, fresh)
    await migrate_from_sync_code(driver, app)
    other = request.getfixturevalue("other_pg_url")
    cli("worker", "--until-idle", url=other)
    comment = "select obj_description('jobguard_jobs'::regclass, 'pg_class')"
    [(python_marker,)] = rows(fresh, comment)
    [(rust_marker,)] = rows(other, comment)
    assert python_marker == rust_marker and python_marker.startswith("jobguard schema ")
    # Each side finds the other's marker and changes nothing: no index is rebuilt.
    indexes = "select indexrelid from pg_index where indrelid = 'jobguard_jobs'::regclass"
    before = sorted(rows(other, indexes))
    other_app, _ = make_app(driver, other)
    await migrate_from_sync_code(driver, other_app)
    assert sorted(rows(other, indexes)) == before


def test_migrate_sync_refuses_an_async_app_and_a_running_loop(pg_url):
    import asyncio

    app, _ = make_app("sqlalchemy", pg_url)

    async def inside_a_loop() -> None:
        with pytest.raises(jobguard.UnsupportedConnection, match="await app.migrate"):
            app.migrate_sync()

    asyncio.run(inside_a_loop())
    from sqlalchemy.ext.asyncio import create_async_engine

    async_app = jobguard.App(db=create_async_engine(pg_url.replace("postgres://",
                                                                   "postgresql+asyncpg://")))
    with pytest.raises(jobguard.UnsupportedConnection, match="await app.migrate"):
        async_app.migrate_sync()


# The command's own path; the drivers' migrations are the tests above.
@pytest.mark.parametrize("driver", ["asyncpg", "psycopg", "sqlite3"])
def test_the_worker_command_migrates_a_fresh_database_with_migrate(driver, fresh):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, DATABASE_URL=fresh, JOBGUARD_TEST_DRIVER=driver)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                      env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "jobguard", "worker", "ledger_app:app", "--until-idle"]
    without = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert without.returncode == 2 and "app.migrate" in without.stderr
    done = subprocess.run([*command, "--migrate"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert rows(fresh, "select count(*) from jobguard_jobs") == [(0,)]
    assert rows(fresh, "select count(*) from processed_jobs") == [(0,)]
