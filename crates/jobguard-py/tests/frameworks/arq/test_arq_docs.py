"""docs/python.md's arq snippet, run as written: ``arq tasks.WorkerSettings`` on it, on Redis,
and ``python tasks.py`` (``await redis.enqueue_job("credit", "order-8812", 500)``) twice, on a
database without the guard table. The wrapper creates the table before the worker's first job;
the first job applies, the second is a duplicate.

And a worker whose database user may not create tables: its first job says so in one line, is
retried instead of failed, and applies once the table is migrated by another user.
"""

from __future__ import annotations

import sys

from frameworks import documented, kills

NAME = "arq"
# arq logs each finished job: "0.01s ← <id>:credit ● <result>".
FINISHED = ":credit ● "


def worker_cmd() -> list[str]:
    return [sys.executable, "-m", "arq", "tasks.WorkerSettings"]


def test_the_documented_snippet_runs_as_written(pg_url, tmp_path):
    documented.create_ledger(pg_url)
    documented.write(documented.snippet(NAME), tmp_path)
    with documented.redis_database() as broker:
        env = documented.environment(tmp_path, pg_url, broker)
        documented.produce(tmp_path, env)
        documented.produce(tmp_path, env)
        workers = kills.Workers(worker_cmd(), env, tmp_path, limit_s=30)
        workers.run_until(lambda: documented.log_count(workers, FINISHED) >= 2)
        assert documented.log_count(workers, "{'credited': 500}") == 2, workers.log_tail()
        documented.check_applied_once(pg_url, workers)


def test_a_worker_that_cannot_create_the_table_says_so_and_keeps_the_job(pg_url, tmp_path):
    documented.check_retried_until_migrated(NAME, pg_url, tmp_path, lambda _: worker_cmd())
