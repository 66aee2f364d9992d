"""``python -m jobguard demo|bench|worker``: the guide's experiment, the guard's benchmark, and
the worker of an App's jobs.

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
        "bench", help="the guide's hand-written guard SQL against jobguard.guard, on asyncpg"
    )
    bench.add_argument("--database-url", default=os.environ.get("DATABASE_URL"),
                       help="postgres://user@host/db (default: $DATABASE_URL)")
    bench.add_argument("--json", action="store_true", help="the report as JSON")
    bench.add_argument("--jobs", type=int, default=10_000)
    bench.add_argument("--rounds", type=int, default=2)
    bench.add_argument("--chunk", type=int, default=500,
                       help="jobs per chunk; chunks alternate between the two variants")
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
    from . import _bench

    if not args.database_url.startswith(("postgres://", "postgresql://")):
        parser.error("bench runs on PostgreSQL through asyncpg: give a postgres:// URL")
    report = asyncio.run(_bench.run(args.database_url, jobs=args.jobs, rounds=args.rounds,
                                      chunk=args.chunk))
    print(json.dumps(report, indent=2) if args.json else _bench.render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
