"""RQ workers killed with SIGKILL on Redis: one effect per key, none lost.

A work horse killed mid-job (its worker alive) is failed by the worker from the copy of the job
it read before the horse started: ``GuardedWorker`` reads back the retries the guard gave the
job, and RQ retries it. A worker killed with its horse leaves the job in the
``StartedJobRegistry``; a worker's maintenance retries it once its heartbeat has expired
(``job_monitoring_interval`` + 60 s), and the retry runs once the dead worker's scheduler lock
has expired (61 s): the test runs that cleanup with a cutoff past the expiry, and removes the
lock, instead of waiting a minute. Without the guard (jobs enqueued with ``Retry``, as RQ
needs for any of this) the key killed after its commit is applied twice; without the retries
the guard sets, a killed job goes to the ``FailedJobRegistry`` and its key is lost.

And jobs whose transaction did not commit, run again: each key enqueued once, every key's first
run fails transiently (its connection terminated with ``pg_terminate_backend``, or a
serialization failure raised by the server), the first key's second run sleeps past its 2 s
``job_timeout``, the second key's stops its work horse with SIGSTOP for 5 s, past it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jobguard
from frameworks import documented, kills

HERE = Path(__file__).parent
KEYS = [f"o-{n}" for n in range(5)]
PUBLISHED = 2
RETRY_KEYS = [f"r-{n}" for n in range(6)]
# Long enough to show a hang or a lost key; a passing run takes about 15 s.
LIMIT_S = 50
JOB_TIMEOUT_S = 2


def publish(broker: str, orders: list[str], count: int) -> None:
    from redis import Redis
    from rq import Queue, Retry

    # Without the guard, RQ runs a failed or killed job again only with a Retry.
    retry = Retry(max=10) if kills.unguarded() else None
    redis = Redis.from_url(broker)
    queue = Queue(connection=redis)
    for _ in range(count):
        for order in orders:
            queue.enqueue("rq_app.credit", order, job_timeout=JOB_TIMEOUT_S, retry=retry)
    redis.close()


def prepare(pg_url: str, tmp_path: Path, broker: str, worker: bool) -> tuple[Path, dict]:
    kills.prepare(pg_url)
    flags = tmp_path / "flags"
    flags.mkdir()
    env = {
        **os.environ,
        "DATABASE_URL": pg_url,
        "JOBGUARD_TEST_FLAGS": str(flags),
        "JOBGUARD_TEST_KILL_WORKER": "1" if worker else "0",
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
    }
    return flags, env


def worker_cmd(broker: str) -> list[str]:
    cls = "rq.Worker" if kills.unguarded() else "jobguard.rq.GuardedWorker"
    return [
        str(Path(sys.executable).parent / "rq"), "worker", "--url", broker, "--worker-class",
        cls, "--with-scheduler", "--maintenance-interval", "1",
    ]


def test_killed_work_horses_apply_each_key_once(pg_url, tmp_path):
    keys = [jobguard.key("credit", order) for order in KEYS]
    with documented.redis_database() as broker:
        flags, env = prepare(pg_url, tmp_path, broker, worker=False)
        kills.arm_both(flags, keys)
        publish(broker, KEYS, PUBLISHED)
        workers = kills.Workers(worker_cmd(broker), env, tmp_path, limit_s=LIMIT_S)
        expected = kills.expected_finished(keys, PUBLISHED)
        workers.run_until(lambda: kills.finished(pg_url) >= expected)
        kills.check_exactly_once(pg_url, flags, keys, PUBLISHED, workers)


def test_a_job_abandoned_with_its_killed_worker_is_run_again(pg_url, tmp_path):
    from redis import Redis
    from rq import Queue
    from rq.scheduler import RQScheduler

    keys = [jobguard.key("credit", order) for order in KEYS]
    with documented.redis_database() as broker:
        flags, env = prepare(pg_url, tmp_path, broker, worker=True)
        kills.arm_both(flags, keys)
        publish(broker, KEYS, PUBLISHED)
        workers = kills.Workers(worker_cmd(broker), env, tmp_path, limit_s=LIMIT_S)
        redis = Redis.from_url(broker)
        registry = Queue(connection=redis).started_job_registry
        deadline = time.monotonic() + LIMIT_S
        expected = kills.expected_finished(keys, PUBLISHED)
        try:
            while kills.finished(pg_url) < expected:
                assert time.monotonic() < deadline, f"not finished\n{workers.log_tail()}"
                proc = workers.procs[0]
                if proc is None or proc.poll() == -9:
                    # What a minute brings: a worker's maintenance fails or retries the dead
                    # worker's job once its heartbeat expired, and the dead scheduler's lock
                    # expires, so the new worker's scheduler runs the scheduled retries.
                    registry.cleanup(timestamp=time.time() + 3600)
                    redis.delete(RQScheduler.get_locking_key("default"))
                    workers.start()
                elif proc.poll() is not None:
                    raise AssertionError(f"a worker exited with {proc.poll()}")
                time.sleep(0.2)
        finally:
            workers.stop()
            redis.close()
        kills.check_exactly_once(pg_url, flags, keys, PUBLISHED, workers)


def test_transient_failures_and_job_timeouts_are_run_again(pg_url, tmp_path):
    keys = [jobguard.key("credit", order) for order in RETRY_KEYS]
    with documented.redis_database() as broker:
        flags, env = prepare(pg_url, tmp_path, broker, worker=False)
        kills.arm_retries(flags, keys, overrun_s=4, stop_s=5)
        publish(broker, RETRY_KEYS, 1)
        workers = kills.Workers(worker_cmd(broker), env, tmp_path, limit_s=LIMIT_S)
        workers.run_until(lambda: len(kills.effects(pg_url)) >= len(keys))
        kills.check_each_applied_once(pg_url, flags, keys, workers)
        # Each armed point was run again with the guard's retries (logged and counted).
        kills.check_retries_logged(workers, len(keys) + 2)
