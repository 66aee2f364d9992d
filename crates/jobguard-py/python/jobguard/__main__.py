"""``python -m jobguard demo|bench|worker``: the guide's experiment, the guard's and the queue's
benchmarks, and the worker of an App's jobs.

A database that cannot be reached or a driver that is not installed ends the command with one
line on stderr and exit status 2, not a traceback."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from .errors import NotMigrated, UnsupportedConnection
from . import _cli_worker, _demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobguard")
    commands = parser.add_subparsers(dest="command", required=True)
    url_help = "postgres://user@host/db, or sqlite:path.db (default: $DATABASE_URL)"
    demo = commands.add_parser(
        "demo", help="100 credit jobs, each delivered 3 times at once: naive, then guarded"
    )
    demo.add_argument("--database-url", default=os.environ.get("DATABASE_URL"), help=url_help)
    demo.add_argument("--json", action="store_true", help="the report as JSON")
    demo.add_argument("--jobs", type=int, default=100)
    bench = commands.add_parser(
        "bench", help="`bench guard` (the default): the guide's hand-written guard SQL against "
        "jobguard.guard, on asyncpg; `bench queue`: the Python worker beside other PostgreSQL "
        "queues for Python"
    )
    bench.add_argument("what", nargs="?", choices=["guard", "queue"], default="guard")
    bench.add_argument("--database-url", default=os.environ.get("DATABASE_URL"),
                       help="postgres://user@host/db (default: $DATABASE_URL)")
    bench.add_argument("--json", action="store_true", help="the report as JSON")
    bench.add_argument("--jobs", type=int, default=None,
                       help="guard: jobs per variant (10000); queue: jobs per burn-down (5000)")
    bench.add_argument("--rounds", type=int, default=2, help="guard only")
    bench.add_argument("--chunk", type=int, default=500,
                       help="guard only: jobs per chunk; chunks alternate between the variants")
    bench.add_argument("--systems", default="jobguard",
                       help="queue only: comma-separated, of jobguard, procrastinate, pgqueuer, "
                       "oban, awa (peers are installed from PyPI on first use)")
    bench.add_argument("--settings", default="default,best",
                       help="queue only: each system's `default` and/or `best` settings")
    bench.add_argument("--set", action="append", default=[], metavar="NAME=NUMBER",
                       help="queue only: one of the adapters' settings, over the chosen "
                       "settings' own (`--set batch_size=20`; each adapter's docstring names "
                       "its settings); repeatable")
    bench.add_argument("--latency-seconds", type=float, default=5.0,
                       help="queue only: seconds of each pickup-latency run")
    bench.add_argument("--peers-dir", default=None,
                       help="queue only: where the peers' virtualenvs live "
                       "(~/.cache/jobguard/bench-peers)")
    bench.add_argument("--database-prefix", default="jobguard_bench_queue",
                       help="queue only: each system runs on a fresh database of this prefix")
    bench.add_argument("--keep", action="store_true",
                       help="queue only: keep each system's database")
    bench.add_argument("--log-dir", default=None,
                       help="queue only: where the adapters' logs go (a temporary directory)")
    _cli_worker.add_parser(commands)
    args = parser.parse_args(argv)
    if args.command == "worker":
        try:
            return _cli_worker.run(args)
        except (_cli_worker.LoadError, NotMigrated, UnsupportedConnection) as error:
            return _fail("worker", str(error))
    if not args.database_url:
        parser.error("give --database-url, or set DATABASE_URL")

    try:
        return _run(parser, args)
    except _demo.DemoError as error:
        return _fail(args.command, str(error))
    except ModuleNotFoundError as error:
        if error.name != "asyncpg":
            raise
        return _fail(args.command, "PostgreSQL needs the asyncpg driver: "
                                   "pip install 'jobguard[asyncpg]'")


def _fail(command: str, message: str) -> int:
    print(f"python -m jobguard {command}: {message}", file=sys.stderr)
    return 2


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "demo":
        report = asyncio.run(_demo.run(args.database_url, jobs=args.jobs))
        print(json.dumps(report, indent=2) if args.json else _demo.render(report))
        return 0 if report["exactly_once"] else 1
    if not args.database_url.startswith(("postgres://", "postgresql://")):
        parser.error("bench runs on PostgreSQL through asyncpg: give a postgres:// URL")
    if args.what == "queue":
        return _bench_queue(args)
    from . import _bench

    report = asyncio.run(_bench.run(args.database_url, jobs=args.jobs or 10_000,
                                    rounds=args.rounds, chunk=args.chunk))
    print(json.dumps(report, indent=2) if args.json else _bench.render(report))
    return 0


def _bench_queue(args: argparse.Namespace) -> int:
    from pathlib import Path

    from . import _bench_peers, _bench_queue

    args.jobs = args.jobs or 5_000
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    args.peers_dir = Path(args.peers_dir) if args.peers_dir else _bench_peers.DEFAULT_PEERS_DIR
    if any(s not in ("default", "best") for s in args.settings):
        return _fail("bench queue", "--settings takes default, best or both")
    args.overrides = {}
    for item in args.set:
        name, _, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not name.isidentifier() or number != number:
            return _fail("bench queue", f"--set takes NAME=NUMBER (batch_size=20), not {item!r}")
        args.overrides[name] = int(number) if number.is_integer() else number
    try:
        report = asyncio.run(_bench_queue.run(args))
    except ValueError as error:
        return _fail("bench queue", str(error))
    print(json.dumps(report, indent=2) if args.json else _bench_queue.render(report))
    failed = any(e["error"] or not e["exactly_once"] or e["left"] for e in report["systems"]
                 if e["system"] == "jobguard")
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
