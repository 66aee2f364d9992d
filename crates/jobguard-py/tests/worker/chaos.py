"""Worker processes SIGKILLed and SIGSTOPped at random while they run, and the wait for their
queue to settle: what the worker's fault tests share."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from typing import Callable

from conftest import rows

Start = Callable[[], subprocess.Popen]


def python_worker(env: dict[str, str], app: str = "ledger_app:app",
                  extra: tuple[str, ...] = ()) -> Start:
    """Starts ``python -m jobguard worker APP`` (with ``extra`` options) with short leases, so
    that the jobs of a killed or frozen worker are rescued within the test."""
    return lambda: subprocess.Popen(
        [sys.executable, "-m", "jobguard", "worker", app, "--concurrency", "4",
         "--lease", "1", "--poll-interval", "0.1", "--shutdown-timeout", "5", *extra],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def seed() -> int:
    """The random seed of a run: ``JOBGUARD_TEST_SEED`` to repeat one."""
    return int(os.environ.get("JOBGUARD_TEST_SEED", time.time_ns() % 1_000_000))


class Fleet:
    """Worker processes, each restarted by its own start function after a kill."""

    def __init__(self, starts: list[Start]) -> None:
        self.starts = starts
        self.workers = [start() for start in starts]
        self.kills = 0
        self.stops = 0

    def chaos(self, rng: random.Random, seconds: float) -> None:
        """For ``seconds``: every 0.3 to 0.8 s a worker drawn at random is SIGKILLed (and
        started again) or SIGSTOPped for 0.5 to 2 s, past its lease: its waiting jobs are
        rescued and run by the others, and it is fenced off from them when it resumes."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.3, 0.8))
            i = rng.randrange(len(self.workers))
            if rng.random() < 0.6:
                self.workers[i].kill()
                self.workers[i].wait()
                self.workers[i] = self.starts[i]()
                self.kills += 1
            else:
                self.workers[i].send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(0.5, 2.0))
                self.workers[i].send_signal(signal.SIGCONT)
                self.stops += 1

    def stop(self) -> None:
        stop_all(self.workers)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def stop_all(workers: list[subprocess.Popen]) -> None:
    """SIGTERM to every worker (resumed first), SIGKILL to one that does not stop in 15 s."""
    for w in workers:
        w.send_signal(signal.SIGCONT)
        w.terminate()
    for w in workers:
        try:
            w.wait(timeout=15)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()


def wait_until_settled(url: str, seconds: float = 60) -> None:
    """Returns once every job of the queue is completed, or after ``seconds``; the caller
    asserts on what it finds."""
    finish = time.monotonic() + seconds
    while time.monotonic() < finish:
        try:
            [(left,)] = rows(url, "select count(*) from jobguard_jobs where state <> 'completed'")
        except Exception:  # noqa: BLE001 - a database restarting answers again shortly
            left = -1
        if left == 0:
            return
        time.sleep(0.2)
