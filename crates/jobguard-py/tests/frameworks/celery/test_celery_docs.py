"""docs/python.md's Celery snippet, run as written: ``celery -A tasks worker`` on it, on Redis,
and ``python tasks.py`` (``credit.delay("order-8812", 500)``) twice, on a database without the
guard table. The worker creates the table when its pool process starts; the first job applies,
the second is a duplicate.

And a worker whose database user may not create tables: it says so in one line when it starts,
the job is retried instead of failed, and applies once the table is migrated by another user.
"""

from __future__ import annotations

import sys
import time

from frameworks import documented, kills

NAME = "celery"
# Celery logs each finished task; the duplicate delivery also says so.
SUCCEEDED = "Task tasks.credit["
CANNOT = documented.CANNOT


def sqlalchemy_url(url: str) -> str:
    return "postgresql+psycopg://" + url.partition("://")[2]


def worker_cmd() -> list[str]:
    return [
        sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool=prefork",
        "--concurrency=1", "--without-heartbeat", "--without-mingle", "--without-gossip",
        "--loglevel=INFO",
    ]


def test_the_documented_snippet_runs_as_written(pg_url, tmp_path):
    documented.create_ledger(pg_url)
    documented.write(documented.snippet(NAME), tmp_path)
    with documented.redis_database() as broker:
        env = documented.environment(tmp_path, sqlalchemy_url(pg_url), broker)
        documented.produce(tmp_path, env)
        documented.produce(tmp_path, env)
        workers = kills.Workers(worker_cmd(), env, tmp_path, limit_s=30)
        workers.run_until(lambda: documented.log_count(workers, "succeeded in") >= 2)
        assert documented.log_count(workers, "duplicate delivery") == 1, workers.log_tail()
        documented.check_applied_once(pg_url, workers)


def test_a_worker_that_cannot_create_the_table_says_so_at_start_and_keeps_the_job(
    pg_url, tmp_path
):
    documented.create_ledger(pg_url)
    documented.write(documented.snippet(NAME), tmp_path)
    with documented.role_without_create(pg_url) as role_url, \
            documented.redis_database() as broker:
        env = documented.environment(tmp_path, sqlalchemy_url(role_url), broker)
        workers = kills.Workers(worker_cmd(), env, tmp_path, limit_s=30)
        workers.start()
        try:
            deadline = time.monotonic() + 20
            while documented.log_count(workers, CANNOT) == 0:
                assert time.monotonic() < deadline, f"no error at start\n{workers.log_tail()}"
                time.sleep(0.2)
            lines = [
                line for p in tmp_path.glob("worker-*.log")
                for line in p.read_text().splitlines() if CANNOT in line
            ]
            assert len(lines) == 1 and "jobguard.migrate" in lines[0], lines
            # The job: not applied, not failed, retried until the table exists.
            documented.produce(tmp_path, env)
            while documented.log_count(workers, "guard table not migrated") == 0:
                assert time.monotonic() < deadline, f"no retry\n{workers.log_tail()}"
                time.sleep(0.2)
            assert documented.ledger(pg_url) == []
            documented.migrate_as_admin(pg_url, role_url)
            while documented.ledger(pg_url) == []:
                assert time.monotonic() < deadline, f"not applied\n{workers.log_tail()}"
                time.sleep(0.2)
            assert documented.log_count(workers, "raised unexpected") == 0, workers.log_tail()
        finally:
            workers.stop()
        documented.check_applied_once(pg_url, workers)
