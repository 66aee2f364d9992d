"""Worker processes killed and stopped at random: the pieces the fault tests share.

``start_worker`` runs ``python -m jobguard worker APP`` as a process of its own; ``unleash``
SIGKILLs (and restarts) or SIGSTOPs (then SIGCONTs) one of them at random for a while; and
``stop_all`` ends them, resuming any left stopped."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from typing import Callable

WORKER_OPTIONS = ["--concurrency", "4", "--lease", "1", "--poll-interval", "0.1",
                  "--shutdown-timeout", "5"]


def start_worker(env: dict[str, str], app: str = "ledger_app:app",
                 options: list[str] = WORKER_OPTIONS) -> subprocess.Popen:
    """A ``python -m jobguard worker`` process of ``app``, with short leases."""
    return subprocess.Popen(
        [sys.executable, "-m", "jobguard", "worker", app, *options],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def unleash(workers: list[subprocess.Popen], start: Callable[[], subprocess.Popen],
            seconds: float, rng: random.Random) -> tuple[int, int]:
    """For ``seconds``, every 0.3 to 0.8 s: SIGKILL one worker at random and start another in
    its place (``start``), or SIGSTOP it for 0.5 to 2 s, past its lease, so that its jobs are
    rescued and it is fenced off when it resumes. Returns (kills, stops)."""
    kills = stops = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(0.3, 0.8))
        i = rng.randrange(len(workers))
        if rng.random() < 0.6:
            workers[i].kill()
            workers[i].wait()
            workers[i] = start()
            kills += 1
        else:
            workers[i].send_signal(signal.SIGSTOP)
            time.sleep(rng.uniform(0.5, 2.0))
            workers[i].send_signal(signal.SIGCONT)
            stops += 1
    return kills, stops


def stop_all(workers: list[subprocess.Popen]) -> None:
    """Resumes and terminates every worker; kills one that does not end within 15 s."""
    for w in workers:
        w.send_signal(signal.SIGCONT)
        w.terminate()
    for w in workers:
        try:
            w.wait(timeout=15)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()
