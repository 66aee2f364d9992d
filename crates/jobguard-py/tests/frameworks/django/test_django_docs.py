"""docs/python.md's Django snippet, run as written: a project of one file, ``tasks.py``.
``python tasks.py migrate`` creates the guard table on a PostgreSQL database without one;
``celery -A tasks worker`` runs on Redis while ``python tasks.py`` (``credit.delay("order-8812",
500)``) is run twice: the first delivery applies, the second is a duplicate. Then the
snippet's ``credit_account``, called twice for one order, applies once."""

from __future__ import annotations

import subprocess
import sys

from frameworks import documented, kills

NAME = "django"


def worker_cmd() -> list[str]:
    return [
        sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool=prefork",
        "--concurrency=1", "--without-heartbeat", "--without-mingle", "--without-gossip",
        "--loglevel=INFO",
    ]


def python(directory, env, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, *args], cwd=directory, env=env, capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, f"python {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def test_the_documented_snippet_runs_as_written(pg_url, tmp_path):
    documented.create_ledger(pg_url)
    documented.write(documented.snippet(NAME), tmp_path)
    with documented.redis_database() as broker:
        env = documented.environment(tmp_path, pg_url, broker)
        assert "Applying jobguard.0001_initial... OK" in python(tmp_path, env, "tasks.py", "migrate")
        assert documented.guard_rows(pg_url) == []  # the table, empty
        documented.produce(tmp_path, env)
        documented.produce(tmp_path, env)
        workers = kills.Workers(worker_cmd(), env, tmp_path, limit_s=30)
        workers.run_until(lambda: documented.log_count(workers, "succeeded in") >= 2)
        assert documented.log_count(workers, "duplicate delivery") == 1, workers.log_tail()
        documented.check_applied_once(pg_url, workers)
    python(
        tmp_path, env, "-c",
        "import tasks\n"
        "assert tasks.credit_account('order-9', 300)\n"
        "assert not tasks.credit_account('order-9', 300)\n",
    )
    assert sorted(documented.ledger(pg_url)) == [(7, 300), (7, 500)]
