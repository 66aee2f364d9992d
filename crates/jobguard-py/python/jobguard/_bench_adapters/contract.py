"""The contract between ``python -m jobguard bench queue`` and one queue's adapter.

An adapter is a script run by the Python of the queue's own virtualenv (the standard library
and the queue's package, never jobguard's for a peer), as
``python ADAPTER --database-url URL --settings JSON --role worker|producer`` (a producer
finds the tables the worker made). It speaks JSON lines: it prints one
``{"ready": true, "system", "version", "settings"}`` line once its tables exist, then reads one
command a line on stdin and answers each with one line on stdout (``{"ok": true, ...}`` or
``{"ok": false, "error": "..."}``); its logs go to stderr.

Jobs are numbered by the orchestrator: job ``n``'s arguments are ``{"n": n}`` for the ``noop``
kind and ``{"n": n, "account": n % 100, "amount": 1}`` for ``credit``, whose body inserts one
row ``(n, account, amount)`` into ``bench_ledger`` (which the orchestrator made).

Commands:

- ``{"op": "enqueue", "kind", "first", "count"}``: jobs ``first .. first+count-1``, with the
  queue's bulk insert; not timed.
- ``{"op": "drain", "count"}``: starts the worker and stops it once ``count`` jobs started and
  the queue reports none left to settle; ``seconds`` is from the first job's start to then.
- ``{"op": "work"}``: starts the worker and answers once it has run for ``WARM_UP`` seconds, so
  that its start (a new pool's connections, its listener) is not counted as the pickup of the
  first jobs produced; ``{"op": "collect", "count", "timeout"}`` waits for
  ``count`` jobs to start and settle, stops the worker, and answers each job's start time.
- ``{"op": "produce", "kind", "first", "rate", "seconds", "connections"}``: enqueues one job
  per transaction at ``rate`` a second for ``seconds``, and answers each job's commit time.
- ``{"op": "pending"}``: how many jobs the queue has not settled.
- ``{"op": "quit"}``.

A job's start is the wall clock (``time.time()``) when its body is entered; its commit is the
wall clock when the enqueueing transaction's commit returned. Both processes run on one
machine, so the difference is the pickup latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback
from typing import Any, Callable

LEDGER = "bench_ledger"
# Seconds a worker started for a pickup run runs before the producer starts: a long-running
# worker's pickup is what is measured, not a cold start's.
WARM_UP = 1.0
INSERT_LEDGER = f"insert into {LEDGER} (n, account, amount) values ($1, $2, $3)"
INSERT_LEDGER_PSYCOPG = f"insert into {LEDGER} (n, account, amount) values (%s, %s, %s)"


def args_of(kind: str, n: int) -> dict[str, Any]:
    """Job ``n``'s arguments."""
    if kind == "credit":
        return {"n": n, "account": n % 100, "amount": 1}
    return {"n": n}


class Adapter:
    """One queue behind the contract. Subclasses fill in the queue's calls; ``started`` is
    called by the queue's job body with the job's number, first thing."""

    system = "?"
    version = "?"

    def __init__(self, url: str, settings: dict[str, Any]) -> None:
        self.url, self.settings = url, settings
        self.role = "worker"
        self.starts: dict[int, float] = {}
        self.runs = 0

    def started(self, n: int) -> None:
        self.runs += 1
        self.starts.setdefault(n, time.time())

    async def open(self) -> None:
        """Connects, and creates the queue's tables when ``role`` is ``worker``."""

    async def enqueue_bulk(self, kind: str, first: int, count: int) -> None:
        raise NotImplementedError

    async def enqueue_one(self, kind: str, n: int) -> None:
        """Enqueues job ``n`` in a transaction of its own; returns once it committed."""
        raise NotImplementedError

    async def start_worker(self) -> None:
        raise NotImplementedError

    async def stop_worker(self) -> None:
        raise NotImplementedError

    async def pending(self) -> int:
        """Jobs not yet settled (waiting, running, or run but not acknowledged)."""
        raise NotImplementedError

    async def close(self) -> None:
        pass


async def _wait_settled(adapter: Adapter, count: int, timeout: float) -> float:
    """Waits until ``count`` jobs started and the queue has none left; the time then."""
    deadline = time.monotonic() + timeout
    seen, progress = -1, time.monotonic()
    while len(adapter.starts) < count:
        if len(adapter.starts) != seen:
            seen, progress = len(adapter.starts), time.monotonic()
        if time.monotonic() - progress > timeout or time.monotonic() > deadline:
            raise TimeoutError(f"{len(adapter.starts)} of {count} jobs started; no progress "
                               f"for {timeout:.0f}s")
        await asyncio.sleep(0.005)
    while await adapter.pending():
        if time.monotonic() > deadline:
            raise TimeoutError(f"all {count} jobs started but the queue still has some "
                               f"after {timeout:.0f}s")
        await asyncio.sleep(0.01)
    return time.time()


async def _produce(adapter: Adapter, kind: str, first: int, rate: float, seconds: float,
                   connections: int) -> dict[str, Any]:
    total = max(int(rate * seconds), 1)
    committed: list[list[float]] = []
    errors: list[str] = []
    slots = asyncio.Semaphore(connections)

    async def one(n: int) -> None:
        try:
            await adapter.enqueue_one(kind, n)
            committed.append([n, time.time()])
        except Exception as error:  # noqa: BLE001 - counted and reported
            errors.append(repr(error))
        finally:
            slots.release()

    tasks = []
    start = time.monotonic()
    for i in range(total):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await slots.acquire()
        tasks.append(asyncio.ensure_future(one(first + i)))
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - start
    return {"committed": committed, "offered": rate, "achieved": len(committed) / elapsed,
            "errors": errors[:5], "failed": len(errors)}


async def _command(adapter: Adapter, cmd: dict[str, Any]) -> dict[str, Any]:
    op = cmd["op"]
    if op == "enqueue":
        t = time.monotonic()
        await adapter.enqueue_bulk(cmd["kind"], cmd["first"], cmd["count"])
        return {"seconds": time.monotonic() - t}
    if op == "drain":
        adapter.starts.clear()
        adapter.runs = 0
        await adapter.start_worker()
        try:
            done = await _wait_settled(adapter, cmd["count"], cmd.get("timeout", 120.0))
        finally:
            await adapter.stop_worker()
        first = min(adapter.starts.values())
        return {"seconds": done - first, "started": len(adapter.starts), "runs": adapter.runs}
    if op == "work":
        adapter.starts.clear()
        adapter.runs = 0
        await adapter.start_worker()
        await asyncio.sleep(WARM_UP)
        return {}
    if op == "collect":
        try:
            await _wait_settled(adapter, cmd["count"], cmd.get("timeout", 60.0))
        finally:
            await adapter.stop_worker()
        return {"started": [[n, t] for n, t in adapter.starts.items()], "runs": adapter.runs}
    if op == "pending":
        return {"pending": await adapter.pending()}
    if op == "produce":
        return await _produce(adapter, cmd["kind"], cmd["first"], cmd["rate"], cmd["seconds"],
                              cmd.get("connections", 4))
    raise ValueError(f"unknown op {op!r}")


async def _serve(make: Callable[[str, dict[str, Any]], Adapter]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--settings", default="{}")
    parser.add_argument("--role", choices=["worker", "producer"], default="worker")
    args = parser.parse_args()
    adapter = make(args.database_url, json.loads(args.settings))
    adapter.role = args.role
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def say(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    try:
        await adapter.open()
    except Exception as error:  # noqa: BLE001 - the orchestrator reports it
        traceback.print_exc()
        say({"ready": False, "error": f"{type(error).__name__}: {error}"})
        return 1
    say({"ready": True, "system": adapter.system, "version": adapter.version,
         "settings": adapter.settings})
    try:
        while line := await reader.readline():
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            try:
                say({"ok": True, **await _command(adapter, cmd)})
            except Exception as error:  # noqa: BLE001 - the orchestrator reports it
                traceback.print_exc()
                say({"ok": False, "error": f"{type(error).__name__}: {error}"})
    finally:
        await adapter.close()
    return 0


def main(make: Callable[[str, dict[str, Any]], Adapter]) -> None:
    """Runs the adapter ``make(url, settings)`` returns until ``quit`` or end of input."""
    sys.exit(asyncio.run(_serve(make)))
