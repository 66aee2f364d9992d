"""docs/python.md's framework snippets, run exactly as written, for every framework's tests.

A snippet is one module, ``tasks.py``: the worker command imports it (``celery -A tasks
worker``, ``arq tasks.WorkerSettings``, ``taskiq worker tasks:broker``) and ``python tasks.py``
makes the documented call (``credit.delay(...)``, ``redis.enqueue_job(...)``,
``credit.kiq(...)``). It reads ``DATABASE_URL`` and ``BROKER_URL`` from the environment: the
test's own database, with no guard table (the worker's first contact), and a Redis database of
its own (the snippets use their framework's default queue names, which a concurrent run of the
same test would share on one Redis database).

The documented call is made twice, as a producer that sends one operation twice does: one
delivery applies, the other is a duplicate, and the ledger holds one row.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Callable, Iterator

import psycopg

import jobguard
from doc_snippets import Snippet, framework_snippets
from frameworks import kills


REDIS = os.environ.get("JOBGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
KEY = jobguard.key("credit", "order-8812")
# The snippets' own user table.
LEDGER = "create table ledger (account bigint not null, amount bigint not null)"
# Redis databases the tests take one of, each for one test at a time.
_REDIS_DBS = range(1, 16)


def snippet(name: str) -> Snippet:
    """The one ``framework NAME`` block of the docs."""
    found = framework_snippets(name)
    assert len(found) == 1, f"expected one `framework {name}` snippet, found {found}"
    return found[0]


@contextlib.contextmanager
def redis_database() -> Iterator[str]:
    """A Redis URL on a database (1-15) no other run of these tests uses meanwhile: a lease
    key in database 0 names its holder; the database is emptied before and after."""
    import redis

    kills.require(REDIS)
    parts = urllib.parse.urlsplit(REDIS)
    lease = redis.Redis.from_url(REDIS)
    token = uuid.uuid4().hex
    number = next(
        (n for n in _REDIS_DBS if lease.set(f"jobguard-test:redis-db:{n}", token, nx=True, ex=300)),
        None,
    )
    assert number is not None, "every Redis database 1-15 is leased by another test"
    url = urllib.parse.urlunsplit(parts._replace(path=f"/{number}"))
    own = redis.Redis.from_url(url)
    own.flushdb()
    try:
        yield url
    finally:
        own.flushdb()
        own.close()
        if lease.get(f"jobguard-test:redis-db:{number}") == token.encode():
            lease.delete(f"jobguard-test:redis-db:{number}")
        lease.close()


def write(code: Snippet, directory: Path) -> Path:
    """The snippet as ``tasks.py`` in ``directory``, exactly as written."""
    path = directory / "tasks.py"
    path.write_text(code.code)
    return path


def environment(directory: Path, database_url: str, broker_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "BROKER_URL": broker_url,
        "PYTHONPATH": str(directory),
    }


def produce(directory: Path, env: dict[str, str]) -> None:
    """``python tasks.py``: the documented call."""
    out = subprocess.run(
        [sys.executable, "tasks.py"], cwd=directory, env=env, capture_output=True, text=True,
        timeout=30, stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, f"python tasks.py failed:\n{out.stdout}\n{out.stderr}"


def create_ledger(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(LEDGER)


def log_count(workers: kills.Workers, text: str) -> int:
    return sum(
        p.read_text(errors="replace").count(text) for p in workers.logs.glob("worker-*.log")
    )


def ledger(url: str) -> list[tuple[int, int]]:
    with psycopg.connect(url) as conn:
        return conn.execute("select account, amount from ledger").fetchall()


def guard_rows(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        if not conn.execute("select to_regclass('processed_jobs') is not null").fetchone()[0]:
            return []
        return [r[0] for r in conn.execute("select job_key from processed_jobs").fetchall()]


def check_applied_once(url: str, workers: kills.Workers) -> None:
    """The documented call, made twice, took effect once, with its guard row."""
    rows = ledger(url)
    assert rows == [(7, 500)], f"ledger: {rows}\n{workers.log_tail()}"
    assert guard_rows(url) == [KEY], f"guard rows: {guard_rows(url)}"


@contextlib.contextmanager
def role_without_create(url: str) -> Iterator[str]:
    """A URL for a login role of its own that may write the ledger but may not create tables
    (PostgreSQL 15 grants no CREATE on ``public`` to other roles): a worker's database user in
    a deployment that migrates in a separate step."""
    role = "jg_worker_" + uuid.uuid4().hex[:10]
    parts = urllib.parse.urlsplit(url)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'create role "{role}" login')
        admin.execute(f'revoke create on schema public from "{role}"')
        admin.execute(f'grant insert, select on ledger to "{role}"')
    netloc = f"{role}@{parts.hostname}:{parts.port or 5432}"
    try:
        yield urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity where usename = %s",
                (role,),
            )
            admin.execute(f'drop owned by "{role}"')
            admin.execute(f'drop role "{role}"')


def migrate_as_admin(url: str, role_url: str) -> None:
    """The separate migration step: the guard table made by a user that may, and the worker's
    role given the rights its guard needs."""
    role = urllib.parse.urlsplit(role_url).username
    with psycopg.connect(url) as conn:
        jobguard.migrate_sync(conn)
        conn.execute(f'grant select, insert, update on processed_jobs to "{role}"')


# The error a worker logs when its database user may not create the guard table.
CANNOT = "this worker could not create it"


def check_retried_until_migrated(
    name: str, pg_url: str, tmp_path: Path, worker_cmd: Callable[[str], list[str]],
    database_url: Callable[[str], str] = lambda url: url, one_line: bool = True,
) -> None:
    """The snippet of framework ``name`` run by workers (``worker_cmd(broker)``) whose database
    user may not create tables (``database_url`` turns the URL into the snippet's form): the
    worker says so (in one line, or at least one where the framework forks per job), the job
    is retried instead of failed while the table is missing, and it applies once, when another
    user migrates."""
    create_ledger(pg_url)
    write(snippet(name), tmp_path)
    with role_without_create(pg_url) as role_url, redis_database() as broker:
        env = environment(tmp_path, database_url(role_url), broker)
        workers = kills.Workers(worker_cmd(broker), env, tmp_path, limit_s=30)
        produce(tmp_path, env)
        workers.start()
        try:
            deadline = time.monotonic() + 20
            while log_count(workers, "guard table not migrated") == 0:
                assert time.monotonic() < deadline, f"no retry\n{workers.log_tail()}"
                time.sleep(0.2)
            lines = [
                line for p in tmp_path.glob("worker-*.log")
                for line in p.read_text().splitlines() if CANNOT in line
            ]
            said = len(lines) == 1 if one_line else len(lines) >= 1
            assert said and "jobguard.migrate" in lines[0], workers.log_tail()
            assert ledger(pg_url) == []
            migrate_as_admin(pg_url, role_url)
            while ledger(pg_url) == []:
                assert time.monotonic() < deadline, f"not applied\n{workers.log_tail()}"
                time.sleep(0.2)
        finally:
            workers.stop()
        check_applied_once(pg_url, workers)
