"""docs/python.md's Dramatiq snippet, run as written: ``dramatiq tasks`` on it, on Redis, and
``python tasks.py`` (``credit.send("order-8812", 500)``) twice, on a database without the guard
table. The guard creates the table before the worker's first job; the first job applies, the
second is a duplicate.

And a worker whose database user may not create tables: its first job says so in one line, is
retried instead of failed, and applies once the table is migrated by another user.
"""

from __future__ import annotations

import sys

from frameworks import documented, kills

NAME = "dramatiq"


def sqlalchemy_url(url: str) -> str:
    return "postgresql+psycopg://" + url.partition("://")[2]


def worker_cmd() -> list[str]:
    return [sys.executable, "-m", "dramatiq", "tasks", "--processes", "1", "--threads", "2"]


def test_the_documented_snippet_runs_as_written(pg_url, tmp_path):
    documented.create_ledger(pg_url)
    documented.write(documented.snippet(NAME), tmp_path)
    with documented.redis_database() as broker:
        env = documented.environment(tmp_path, sqlalchemy_url(pg_url), broker)
        documented.produce(tmp_path, env)
        documented.produce(tmp_path, env)
        workers = kills.Workers(worker_cmd(), env, tmp_path, limit_s=30)
        workers.run_until(
            lambda: documented.log_count(workers, "duplicate delivery") >= 1
            and len(documented.ledger(pg_url)) >= 1
        )
        documented.check_applied_once(pg_url, workers)


def test_a_worker_that_cannot_create_the_table_says_so_and_keeps_the_job(pg_url, tmp_path):
    documented.check_retried_until_migrated(
        NAME, pg_url, tmp_path, lambda _: worker_cmd(), database_url=sqlalchemy_url
    )
