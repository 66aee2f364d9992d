"""docs/python.md's RQ snippet, run as written: ``rq worker -w jobguard.rq.GuardedWorker`` on
it, on Redis, and ``python tasks.py`` (``queue.enqueue("tasks.credit", "order-8812", 500)``)
twice, on a database without the guard table. The guard creates the table before the first
job; the first job applies, the second is a duplicate (the ledger has one row) and returns the first one's
result.

And a worker whose database user may not create tables: the job says so (one line at error per
work horse: RQ forks one per job) and is retried instead of failed, and applies once the table
is migrated by another user.
"""

from __future__ import annotations

import sys
from pathlib import Path

from frameworks import documented, kills

NAME = "rq"
# RQ logs each job that returned: "default: Job OK (<id>)".
FINISHED = ": Job OK ("


def sqlalchemy_url(url: str) -> str:
    return "postgresql+psycopg://" + url.partition("://")[2]


def worker_cmd(broker: str) -> list[str]:
    return [
        str(Path(sys.executable).parent / "rq"), "worker", "--url", broker,
        "-w", "jobguard.rq.GuardedWorker",
    ]


def test_the_documented_snippet_runs_as_written(pg_url, tmp_path):
    from redis import Redis
    from rq import Queue

    documented.create_ledger(pg_url)
    documented.write(documented.snippet(NAME), tmp_path)
    with documented.redis_database() as broker:
        env = documented.environment(tmp_path, sqlalchemy_url(pg_url), broker)
        documented.produce(tmp_path, env)
        documented.produce(tmp_path, env)
        workers = kills.Workers(worker_cmd(broker), env, tmp_path, limit_s=30)
        workers.run_until(lambda: documented.log_count(workers, FINISHED) >= 2)
        documented.check_applied_once(pg_url, workers)
        redis = Redis.from_url(broker)
        registry = Queue(connection=redis).finished_job_registry
        results = [
            Queue(connection=redis).fetch_job(job_id).return_value()
            for job_id in registry.get_job_ids()
        ]
        redis.close()
        assert results == [{"credited": 500}] * 2, results


def test_a_worker_that_cannot_create_the_table_says_so_and_keeps_the_job(pg_url, tmp_path):
    documented.check_retried_until_migrated(
        NAME, pg_url, tmp_path, worker_cmd, database_url=sqlalchemy_url, one_line=False
    )
