"""``python -m jobguard bench queue``: jobguard's Python worker and other PostgreSQL queues for
Python, measured the same way in one run.

Each system runs, one at a time and each on a fresh database of the same server, as a
subprocess: its adapter (``_bench_adapters/``), run by the Python of its own virtualenv, which
speaks the JSON-lines contract of ``_bench_adapters/contract.py``. For each system and each of
its settings (``_bench_peers.SYSTEMS``):

1. **burn-down**: ``--jobs`` no-op jobs enqueued up front, then drained by the worker (jobs/s
   from the first job's start until the queue reports none left); then as many credit jobs,
   whose body inserts a ledger row (in jobguard's case in the job's own transaction, with its
   completion and the claim of its key ``credit:<n>``). Every credit must have exactly one
   ledger row, and no job may be left;
2. **pickup latency**: a second adapter process enqueues no-op jobs, one per transaction, at
   10%, 50% and 90% of the system's measured no-op rate for ``--latency-seconds`` each, while
   the worker runs them: the time from each enqueue's commit to its body's start, p50, p95 and
   p99.

A peer that cannot be installed or run is reported with its error, never left out.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._bench_peers import ADAPTERS, SYSTEMS, InstallFailed, System, python_for
from ._demo import redact

FRACTIONS = (0.1, 0.5, 0.9)
LEDGER_DDL = ("create table bench_ledger (id bigserial primary key, n bigint not null, "
              "account bigint not null, amount bigint not null)")


class AdapterFailed(Exception):
    """An adapter did not start, or answered a command with an error."""


class Adapter:
    """One adapter subprocess: send a command, read its answer."""

    def __init__(self, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        self.proc, self.log_path = proc, log_path

    @classmethod
    async def start(cls, python: str, system: System, url: str, settings: dict[str, Any],
                    log_dir: Path, role: str) -> tuple["Adapter", dict[str, Any]]:
        log_path = log_dir / f"{system.name}-{role}.log"
        log = open(log_path, "ab")
        proc = await asyncio.create_subprocess_exec(
            python, str(ADAPTERS / system.adapter), "--database-url", url,
            "--settings", json.dumps(settings), "--role", role,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
            limit=64 * 1024 * 1024, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        adapter = cls(proc, log_path)
        ready = await adapter._read(timeout=180)
        if not ready.get("ready"):
            await adapter.close()
            raise AdapterFailed(ready.get("error") or adapter.tail())
        return adapter, ready

    def tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no output"
        return " / ".join(lines[-3:]) or "no output"

    async def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except asyncio.TimeoutError:
            raise AdapterFailed(f"no answer within {timeout:.0f}s") from None
        if not line:
            await self.proc.wait()
            raise AdapterFailed(f"exited with status {self.proc.returncode}: {self.tail()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def call(self, op: str, wait: float = 300, **fields: Any) -> dict[str, Any]:
        """Sends ``op`` with ``fields``; its answer, within ``wait`` seconds."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"op": op, **fields}) + "\n").encode())
        await self.proc.stdin.drain()
        answer = await self._read(wait)
        if not answer.get("ok"):
            raise AdapterFailed(f"{op}: {answer.get('error')}")
        return answer

    async def close(self) -> None:
        if self.proc.returncode is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(b'{"op": "quit"}\n')
                await self.proc.stdin.drain()
                await asyncio.wait_for(self.proc.wait(), 30)
            except (asyncio.TimeoutError, ConnectionError):
                self.proc.kill()
                await self.proc.wait()


def _with_db(url: str, name: str) -> str:
    base, _, rest = url.rpartition("/")
    query = rest.partition("?")[2]
    return f"{base}/{name}" + (f"?{query}" if query else "")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


async def _fresh_database(admin_url: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'drop database if exists "{name}" with (force)')
        await conn.execute(f'create database "{name}"')
    finally:
        await conn.close()
    db = await asyncpg.connect(_with_db(admin_url, name))
    try:
        await db.execute(LEDGER_DDL)
    finally:
        await db.close()


async def _drop_database(admin_url: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'drop database if exists "{name}" with (force)')
    finally:
        await conn.close()


async def _ledger(url: str, first: int, count: int) -> dict[str, int]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            "select count(*), count(distinct n), count(*) filter (where n < $1 or n >= $2) "
            "from bench_ledger", first, first + count)
    finally:
        await conn.close()
    return {"ledger_rows": row[0], "ledger_distinct": row[1], "ledger_foreign": row[2]}


async def _latency(worker: Adapter, producer: Adapter, rate: float, first: int,
                   seconds: float) -> dict[str, Any]:
    await worker.call("work")
    produced = await producer.call("produce", kind="noop", first=first, rate=rate,
                                   seconds=seconds, connections=8, wait=seconds * 4 + 120)
    committed = {int(n): t for n, t in produced["committed"]}
    collected = await worker.call("collect", count=len(committed), timeout=60, wait=600)
    started = {int(n): t for n, t in collected["started"]}
    waits = [(started[n] - t) * 1000 for n, t in committed.items() if n in started]
    result: dict[str, Any] = {
        "rate": round(rate, 1), "achieved": round(produced["achieved"], 1),
        "jobs": len(committed), "missing": len(committed) - len(waits),
        "enqueue_failed": produced["failed"],
    }
    for name, q in (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99)):
        result[name] = round(_percentile(waits, q), 2) if waits else None
    return result


async def _run_one(system: System, setting: str, admin_url: str, args: Any, log_dir: Path,
                   log: Any) -> dict[str, Any]:
    overrides = getattr(args, "overrides", {})
    settings = {**system.settings[setting], **overrides}
    described = system.notes[setting]
    if overrides:
        described += " with " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    entry: dict[str, Any] = {"system": system.name, "setting": setting,
                             "package": system.package or "jobguard",
                             "version": system.version, "settings": settings,
                             "described": described, "error": None}
    try:
        python = python_for(system, args.peers_dir, log)
    except (InstallFailed, OSError) as error:
        entry["error"] = f"install: {error}"
        return entry
    name = re.sub(r"[^a-z0-9_]", "_", f"{args.database_prefix}_{system.name}_{setting}")
    url = _with_db(admin_url, name)
    try:
        await _fresh_database(admin_url, name)
    except Exception as error:  # noqa: BLE001 - reported with the system, the others still run
        entry["error"] = f"database {name}: {type(error).__name__}: {error}"
        return entry
    worker = producer = None
    jobs = args.jobs
    try:
        worker, ready = await Adapter.start(python, system, url, settings, log_dir, "worker")
        entry["version"] = ready["version"]
        entry["settings"] = ready["settings"]
        entry["load_before"] = _load()
        await worker.call("enqueue", kind="noop", first=0, count=jobs)
        noop = await worker.call("drain", count=jobs, timeout=120, wait=600)
        entry["noop_jobs_per_s"] = round(jobs / noop["seconds"], 1)
        await worker.call("enqueue", kind="credit", first=jobs, count=jobs)
        credit = await worker.call("drain", count=jobs, timeout=120, wait=600)
        entry["credit_jobs_per_s"] = round(jobs / credit["seconds"], 1)
        entry["runs"] = noop["runs"] + credit["runs"]
        entry.update(await _ledger(url, jobs, jobs))
        entry["exactly_once"] = (entry["ledger_rows"] == entry["ledger_distinct"] == jobs
                                 and entry["ledger_foreign"] == 0)
        log(f"{system.name} ({setting}): {entry['noop_jobs_per_s']} no-op jobs/s, "
            f"{entry['credit_jobs_per_s']} credit jobs/s")
        producer, _ = await Adapter.start(python, system, url, settings, log_dir, "producer")
        entry["latency"] = []
        first = 2 * jobs
        for fraction in FRACTIONS:
            rate = max(fraction * entry["noop_jobs_per_s"], 1.0)
            run = await _latency(worker, producer, rate, first, args.latency_seconds)
            run["fraction"] = fraction
            entry["latency"].append(run)
            first += run["jobs"] + run["enqueue_failed"] + 1
            log(f"{system.name} ({setting}): at {run['rate']}/s pickup p50 {run['p50_ms']} ms, "
                f"p99 {run['p99_ms']} ms")
        entry["left"] = (await worker.call("pending"))["pending"]
        entry["load_after"] = _load()
    except AdapterFailed as error:
        entry["error"] = str(error)
    finally:
        for adapter in (producer, worker):
            if adapter is not None:
                await adapter.close()
        if not args.keep:
            await _drop_database(admin_url, name)
    return entry


async def run(args: Any) -> dict[str, Any]:
    """Runs every system of ``args.systems`` at each of ``args.settings``; the report."""
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown systems {unknown}: choose from {', '.join(SYSTEMS)}")

    def log(message: str) -> None:
        print(f"bench queue: {message}", file=sys.stderr, flush=True)

    report: dict[str, Any] = {
        "database": redact(args.database_url), "jobs": args.jobs,
        "latency_seconds": args.latency_seconds, "cpus": os.cpu_count(),
        "python": platform.python_version(), "load_start": _load(), "systems": [],
    }
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jobguard-bench-queue-") as tmp:
        log_dir = Path(args.log_dir) if args.log_dir else Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        for name in args.systems:
            for setting in args.settings:
                report["systems"].append(
                    await _run_one(SYSTEMS[name], setting, args.database_url, args, log_dir, log))
    report["seconds"] = round(time.monotonic() - started, 1)
    report["load_end"] = _load()
    return report


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['jobs']} jobs per burn-down, pickup runs of {report['latency_seconds']}s "
             f"({report['database']}; load {report['load_start']} -> {report['load_end']})"]
    ref = {e["setting"]: e for e in report["systems"]
           if e["system"] == "jobguard" and not e["error"]}
    for e in report["systems"]:
        head = f"{e['system']} {e['version'] or ''} ({e['setting']}: {e['described']})"
        if e["error"]:
            lines.append(f"  {head}\n    FAILED: {e['error']}")
            continue
        mine = ref.get(e["setting"])
        ratio = ""
        if mine and e["system"] != "jobguard":
            ratio = (f"  [{e['noop_jobs_per_s'] / mine['noop_jobs_per_s']:.2f}x / "
                     f"{e['credit_jobs_per_s'] / mine['credit_jobs_per_s']:.2f}x jobguard's]")
        lines.append(f"  {head}")
        lines.append(f"    burn-down: {e['noop_jobs_per_s']:8.1f} no-op jobs/s, "
                     f"{e['credit_jobs_per_s']:8.1f} credit jobs/s{ratio}; ledger "
                     f"{e['ledger_rows']} rows for {report['jobs']} credits"
                     f"{'' if e['exactly_once'] else ' (NOT exactly once)'}"
                     + (f"; {e['left']} jobs left" if e["left"] else ""))
        for run in e["latency"]:
            lines.append(f"    pickup at {run['fraction']:.0%} ({run['achieved']:.0f}/s of "
                         f"{run['rate']:.0f}/s offered): p50 {run['p50_ms']} ms, p95 "
                         f"{run['p95_ms']} ms, p99 {run['p99_ms']} ms"
                         + (f", {run['missing']} never started" if run["missing"] else ""))
    return "\n".join(lines)
