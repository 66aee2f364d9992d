"""``python -m jobguard worker`` as a process, on each driver: SIGTERM with jobs running lets
them finish, or gives them back past the shutdown timeout (on SQLite, where a sync body holds
the write lock, leaves their leases to expire and be rescued); an app that cannot be loaded
ends it with one line."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

import jobguard
from conftest import is_postgres, rows
from ledger_app import SQLITE_DRIVERS, sqlite_connect


def start(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "jobguard", "worker", "ledger_app:app", *args],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )


def enqueue_slow(url: str, driver: str, orders: list[str]) -> None:
    def enqueue_all(conn: Any) -> None:
        for order in orders:
            jobguard.enqueue_sync(conn, "slow", {"order": order}, key=jobguard.key("slow", order))

    if is_postgres(url):
        import psycopg

        with psycopg.connect(url) as conn, conn.transaction():
            enqueue_all(conn)
        return
    conn = sqlite_connect(url)
    try:
        conn.execute("begin immediate")
        enqueue_all(conn)
        conn.commit()
    finally:
        conn.close()


def wait_running(url: str, count: int, timeout: float = 10.0) -> None:
    """Until ``count`` jobs are locked by their own transactions (their bodies running); on
    SQLite, where one transaction writes at a time, until ``count`` jobs are leased."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if is_postgres(url):
            [(locked,)] = rows(url, "select count(*) from jobguard_jobs where id not in "
                                    "(select id from jobguard_jobs for update skip locked)")
        else:
            [(locked,)] = rows(url, "select count(*) from jobguard_jobs "
                                    "where leased_until is not null")
        if locked >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} jobs did not start within {timeout}s")


def test_sigterm_lets_running_jobs_finish(worker_env, queue_url, driver):
    enqueue_slow(queue_url, driver, [f"s-{i}" for i in range(4)])
    env = dict(worker_env, JOBGUARD_TEST_SLOW="1.5")
    worker = start(env, "--concurrency", "4", "--shutdown-timeout", "20")
    wait_running(queue_url, 4)
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=20)
    assert worker.returncode == 0, err
    assert "4 applied" in err
    assert rows(queue_url, "select count(*) from worker_ledger") == [(4,)]
    assert rows(queue_url, "select distinct state from jobguard_jobs") == [("completed",)]


def test_sigterm_past_the_shutdown_timeout_gives_running_jobs_back(worker_env, queue_url, driver):
    enqueue_slow(queue_url, driver, ["s-1", "s-2"])
    env = dict(worker_env, JOBGUARD_TEST_SLOW="60")
    worker = start(env, "--concurrency", "2", "--shutdown-timeout", "0.2", "--lease", "1")
    wait_running(queue_url, 2)
    started = time.monotonic()
    worker.send_signal(signal.SIGINT)
    _, err = worker.communicate(timeout=20)
    assert worker.returncode == 0, err
    assert time.monotonic() - started < 10
    assert rows(queue_url, "select count(*) from worker_ledger") == [(0,)]
    if driver in SQLITE_DRIVERS:
        # A sync body holds SQLite's write lock until it returns: the process exits without
        # committing it, and the leases are left to expire (a second) and be rescued.
        assert "hold the database; their leases expire and are rescued" in err
        assert rows(queue_url, "select state, attempt from jobguard_jobs") == [
            ("available", 1), ("available", 1)]
        expired = ("select count(*) from jobguard_jobs where leased_until < "
                   "cast((julianday('now') - 2440587.5) * 86400000000.0 as integer)")
        while rows(queue_url, expired) != [(2,)]:
            time.sleep(0.05)
    else:
        # Rolled back and given back at once, their attempt not counted: due now, for any
        # worker (a sync body's transaction ended by the server).
        assert rows(queue_url,
                    "select state, attempt, leased_until is null from jobguard_jobs") == [
            ("available", 0, True), ("available", 0, True)]
    env = dict(worker_env, JOBGUARD_TEST_SLOW="0")
    done = subprocess.run([sys.executable, "-m", "jobguard", "worker", "ledger_app:app",
                           "--until-idle"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert rows(queue_url, "select count(*) from worker_ledger") == [(2,)]


def one_line_failure(env: dict[str, str], spec: str, *options: str) -> str:
    done = subprocess.run([sys.executable, "-m", "jobguard", "worker", spec, *options], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_an_app_that_cannot_be_loaded_ends_the_command_with_one_line(worker_env):
    line = one_line_failure(worker_env, "no_such_module:app")
    assert line.startswith("python -m jobguard worker: cannot import `no_such_module`")
    line = one_line_failure(worker_env, "ledger_app:not_an_app")
    assert "`ledger_app:not_an_app` is a builtins.dict, not a jobguard.App" in line
    line = one_line_failure(worker_env, "ledger_app:missing")
    assert "module `ledger_app` has no attribute `missing`" in line


def test_invalid_worker_options_end_the_command_with_one_line(worker_env):
    line = one_line_failure(worker_env, "ledger_app:app", "--batch-size", "0")
    assert line.endswith("batch_size must be an integer >= 1, not 0"), line
    line = one_line_failure(worker_env, "ledger_app:app", "--concurrency", "0")
    assert "concurrency must be at least 1" in line, line


def test_durations_are_written_as_the_rust_worker_takes_them(worker_env):
    # `jobguard worker --lease 30s --poll 1s`: the same options, the same durations, the same
    # defaults, parsed by the core's parser.
    def worker(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "jobguard", "worker", *options],
                              env=worker_env, capture_output=True, text=True, timeout=60)

    shown = worker("--help")
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    for option, default in (("--lease", "30s"), ("--poll", "1s"), ("--shutdown-timeout", "30s")):
        assert option in text and f"(default: {default})" in text, text
    done = worker("ledger_app:app", "--until-idle", "--lease", "2s", "--poll", "100ms",
                  "--shutdown-timeout", "1m 30s")
    assert done.returncode == 0, done.stderr
    # A bare number is still seconds, as before durations.
    done = worker("ledger_app:app", "--until-idle", "--poll-interval", "0.1", "--lease", "2")
    assert done.returncode == 0, done.stderr
    refused = worker("ledger_app:app", "--lease", "soon")
    assert refused.returncode == 2
    assert "argument --lease" in refused.stderr and "such as 30s" in refused.stderr, \
        refused.stderr
