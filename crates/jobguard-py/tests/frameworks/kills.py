"""Real workers killed with SIGKILL, for every framework's test.

A task calls :func:`die_here` at two points: ``before-commit`` (the effect written, the
transaction still open) and ``after-commit`` (committed, the message not acked yet). A flag file
``<stage>.<key>`` in ``$JOBGUARD_TEST_FLAGS`` arms one point for one key; the first delivery
that reaches it removes the flag and kills its worker, so each armed point kills exactly one
worker, whatever the timing. :func:`run_workers` restarts a worker that died and waits until
every delivery has finished; the test then counts effects per key.

Every finished delivery leaves a row in ``deliveries``: an applied one in the job's own
transaction (with the effect in ``ledger``), a duplicate one after the guard reported it.

The retry tests arm other points, each once per key, in the job's transaction after its effect
(:func:`misbehave`): ``transient`` fails the transaction for a reason that passes (its
connection terminated with ``pg_terminate_backend``, or a serialization failure raised by the
server), ``overrun`` sleeps past the job's time limit, ``stop`` stops the worker with SIGSTOP
(a helper sends SIGCONT later). A job that did not commit must be run again until it does.
``refuse`` makes the worker's next sends of the key's retry raise (once, or as many times as
the flag says), as a broker refusing the publish would (:func:`refuse_send`, called by the
app's send). The apps record every count of
``jobguard_job_retries_total`` as a row in ``retries`` (:func:`count_retries`), so that a
test reads the counter of its worker processes.

``JOBGUARD_TEST_UNGUARDED=1`` runs the same tasks without the guard: the tests must then fail
(the check that they can).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import psycopg

import jobguard

# The brokers the framework suites kill workers on: scripts/test's, else the default ports.
BROKERS = {
    "rabbitmq": os.environ.get("JOBGUARD_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    "redis": os.environ.get("JOBGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
}
STAGES = ("before-commit", "after-commit")
# A safety net for a worker that hangs, not an assertion on speed: the wait fails with the
# workers' logs instead of blocking CI.
HANG_LIMIT_S = 120

SCHEMA = [
    "create table ledger (job_key text not null, pid int not null)",
    "create table deliveries (job_key text not null, outcome text not null, pid int not null)",
    "create table retries (framework text not null, outcome text not null, pid int not null)",
]


def require(url: str) -> None:
    """Skips the test when the broker at ``url`` does not answer (fails it with CI=true)."""
    import socket
    import urllib.parse

    import pytest

    parts = urllib.parse.urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=5).close()
    except OSError as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the broker at {parts.hostname}:{parts.port}: {error}")
        pytest.skip(f"no broker at {parts.hostname}:{parts.port}: {error}")


def unguarded() -> bool:
    return os.environ.get("JOBGUARD_TEST_UNGUARDED") == "1"


def prepare(url: str) -> None:
    with psycopg.connect(url) as conn:
        jobguard.migrate_sync(conn)
        for statement in SCHEMA:
            conn.execute(statement)


def arm(flags: Path, stage: str, key: str) -> None:
    (flags / f"{stage}.{key}").touch()


def die_here(stage: str, key: str, *, group: bool = False, parent: bool = False) -> None:
    """Kills this worker with SIGKILL when ``stage`` is armed for ``key`` (once); with
    ``group``, its whole process group (a Celery master and its pool); with ``parent``, its
    parent's process group first (an RQ worker and its scheduler, whose work horse has a
    process group of its own)."""
    flags = Path(os.environ["JOBGUARD_TEST_FLAGS"])
    try:
        (flags / f"{stage}.{key}").unlink()
    except FileNotFoundError:
        return
    (flags / f"killed.{stage}.{key}").write_text(str(os.getpid()))
    sys.stdout.flush()
    sys.stderr.flush()
    if parent:
        os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)
    if group:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def record(conn: Any, key: str, outcome: str) -> None:
    """A finished delivery, on a psycopg connection (in its transaction, if one is open)."""
    conn.execute(
        "insert into deliveries (job_key, outcome, pid) values (%s, %s, %s)",
        (key, outcome, os.getpid()),
    )


def record_duplicate(url: str, key: str) -> None:
    with psycopg.connect(url) as conn:
        record(conn, key, "duplicate")


def finished(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("select count(*) from deliveries").fetchone()[0]


def effects(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("select job_key, count(*) from ledger group by job_key").fetchall()
    return dict(rows)


def duplicates(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "select job_key, count(*) from deliveries where outcome = 'duplicate' group by 1"
        ).fetchall()
    return dict(rows)


def killed(flags: Path) -> list[str]:
    return sorted(p.name.removeprefix("killed.") for p in flags.glob("killed.*"))


def _take(stage: str, key: str) -> str | None:
    """The content of the flag ``<stage>.<key>`` when it is armed (the flag is removed and a
    ``fired.<stage>.<key>`` marker left), else ``None``."""
    flags = Path(os.environ["JOBGUARD_TEST_FLAGS"])
    try:
        content = (flags / f"{stage}.{key}").read_text()
        (flags / f"{stage}.{key}").unlink()
    except FileNotFoundError:
        return None
    (flags / f"fired.{stage}.{key}").write_text(str(os.getpid()))
    return content


def refuse_send(key: str) -> bool:
    """Whether this send of ``key``'s retry is to fail: true while ``refuse`` is armed, as many
    times as the flag says (once when it is empty)."""
    flag = Path(os.environ["JOBGUARD_TEST_FLAGS"]) / f"refuse.{key}"
    try:
        left = int(flag.read_text() or 1) - 1
    except FileNotFoundError:
        return False
    if left > 0:
        flag.write_text(str(left))
    else:
        _take("refuse", key)
    return True


def count_retries(url: str) -> None:
    """From now on, every count of ``jobguard_job_retries_total`` in this process (and the
    processes it forks) is also written as a row of ``retries``."""
    from jobguard import _retry

    counted = _retry.record_retry

    def record(kind: str, framework: str, outcome: str) -> None:
        counted(kind, framework, outcome)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "insert into retries (framework, outcome, pid) values (%s, %s, %s)",
                (framework, outcome, os.getpid()),
            )

    _retry.record_retry = record


def retries(url: str) -> dict[str, int]:
    """The counts of ``jobguard_job_retries_total`` per outcome the workers made."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("select outcome, count(*) from retries group by 1").fetchall()
    return dict(rows)


def _transient_sql(key: str, backend_pid: int) -> str | None:
    """When ``transient`` is armed for ``key``: the statement to run next on the job's
    connection, which fails (its backend was just terminated, or it raises 40001)."""
    how = _take("transient", key)
    if how is None:
        return None
    if how == "terminate":
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as other:
            other.execute("select pg_terminate_backend(%s)", (backend_pid,))
        return "select 1"
    return (
        "do $$ begin raise exception 'could not serialize access (test)' "
        "using errcode = 'serialization_failure'; end $$"
    )


def _stop_here(key: str) -> None:
    seconds = _take("stop", key)
    if seconds is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.getpid()
    subprocess.Popen(
        ["sh", "-c", f"sleep {seconds}; kill -CONT {pid} 2>/dev/null"],
        start_new_session=True, stdin=subprocess.DEVNULL,
    )
    os.kill(pid, signal.SIGSTOP)


def misbehave(conn: Any, key: str) -> None:
    """The retry tests' points on a psycopg connection, in the job's open transaction."""
    sql = _transient_sql(key, conn.info.backend_pid)
    if sql is not None:
        conn.execute(sql)
    seconds = _take("overrun", key)
    if seconds is not None:
        time.sleep(float(seconds))
    _stop_here(key)


async def misbehave_async(conn: Any, key: str) -> None:
    """:func:`misbehave` on an asyncpg connection."""
    sql = _transient_sql(key, conn.get_server_pid())
    if sql is not None:
        await conn.execute(sql)
    seconds = _take("overrun", key)
    if seconds is not None:
        await asyncio.sleep(float(seconds))
    _stop_here(key)


def arm_retries(flags: Path, keys: list[str], overrun_s: float, stop_s: float) -> None:
    """Every key's first attempt fails transiently (terminated connection or serialization
    failure, alternately); the first key's second attempt overruns its time limit by sleeping
    ``overrun_s``, the second key's stops its worker for ``stop_s``."""
    for n, key in enumerate(keys):
        (flags / f"transient.{key}").write_text("terminate" if n % 2 == 0 else "serialization")
    (flags / f"overrun.{keys[0]}").write_text(str(overrun_s))
    (flags / f"stop.{keys[1]}").write_text(str(stop_s))


def fired(flags: Path) -> list[str]:
    return sorted(p.name.removeprefix("fired.") for p in flags.glob("fired.*"))


def check_each_applied_once(url: str, flags: Path, keys: list[str], workers: "Workers") -> None:
    """Every armed point fired, and every key took effect exactly once."""
    armed = sorted(
        [f"transient.{k}" for k in keys] + [f"overrun.{keys[0]}", f"stop.{keys[1]}"]
    )
    assert fired(flags) == armed, f"armed points that did not fire: {fired(flags)}"
    counts = effects(url)
    assert counts == {k: 1 for k in keys}, f"effects per key: {counts}\n{workers.log_tail()}"


def check_retries_logged(workers: "Workers", at_least: int) -> None:
    """The wrapper logged at least ``at_least`` runs of a job again (``_retry.retrying``'s line,
    one per retry, each counted in ``jobguard_job_retries_total``)."""
    logged = sum(
        p.read_text(errors="replace").count("did not commit (")
        for p in workers.logs.glob("worker-*.log")
    )
    assert logged >= at_least, f"{logged} retries logged\n{workers.log_tail()}"


class Workers:
    """``count`` worker processes started from ``cmd``, each in a session of its own; a worker
    that dies by SIGKILL is started again."""

    def __init__(
        self, cmd: list[str], env: dict[str, str], logs: Path, limit_s: float = HANG_LIMIT_S,
        count: int = 1,
    ) -> None:
        self.cmd, self.env, self.logs, self.limit_s = cmd, env, logs, limit_s
        self.started = 0
        self.procs: list[subprocess.Popen | None] = [None] * count

    def start(self, slot: int = 0) -> None:
        self.started += 1
        out = open(self.logs / f"worker-{self.started}.log", "wb")
        self.procs[slot] = subprocess.Popen(
            self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        out.close()

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None:
                self._stop(proc)

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        # The deliveries are done: a worker that takes long to shut down (taskiq's process
        # manager can) is killed after a few seconds; a stopped one is continued first.
        try:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
        # What the worker left behind in its group (a prefork child) goes too.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def log_tail(self) -> str:
        parts = []
        for path in sorted(self.logs.glob("worker-*.log")):
            parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    def run_until(self, done: Callable[[], bool]) -> None:
        """Runs workers until ``done()``; restarts one killed by SIGKILL, fails on any other
        exit."""
        deadline = time.monotonic() + self.limit_s
        for slot in range(len(self.procs)):
            self.start(slot)
        try:
            while not done():
                for slot, proc in enumerate(self.procs):
                    rc = proc.poll()
                    if rc == -signal.SIGKILL:
                        self.start(slot)
                    elif rc is not None:
                        raise AssertionError(f"a worker exited with {rc}\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"the deliveries did not finish within {self.limit_s}s\n"
                        f"{self.log_tail()}"
                    )
                time.sleep(0.2)
        finally:
            self.stop()


def arm_both(flags: Path, keys: list[str]) -> None:
    """The first key's worker dies after its commit, the second key's before it."""
    arm(flags, "after-commit", keys[0])
    arm(flags, "before-commit", keys[1])


def check_exactly_once(
    url: str, flags: Path, keys: list[str], published: int, workers: Workers
) -> None:
    """Every key took effect once; every other delivery, the redelivery of the worker killed
    after its commit included, was reported as a duplicate; both armed workers died."""
    armed = sorted([f"after-commit.{keys[0]}", f"before-commit.{keys[1]}"])
    assert killed(flags) == armed, (
        f"the armed kills did not all happen: {killed(flags)}\n{workers.log_tail()}"
    )
    counts = effects(url)
    assert counts == {k: 1 for k in keys}, f"effects per key: {counts}"
    dups = duplicates(url)
    # Each key published `published` times, plus the redelivery of the after-commit kill.
    assert sum(dups.values()) >= len(keys) * (published - 1) + 1, f"duplicates: {dups}"
    assert dups.get(keys[0], 0) >= published, f"the after-commit redelivery: {dups}"


def expected_finished(keys: list[str], published: int) -> int:
    # Every message finishes once, and the delivery killed after its commit had finished too.
    return len(keys) * published + 1
