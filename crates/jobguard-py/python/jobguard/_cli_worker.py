"""``python -m jobguard worker module:app``: loads the app and runs its worker.

A module that does not import, or an attribute that is not a :class:`jobguard.App`, ends the
command with one line naming it (exit status 2), not a traceback."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from typing import Any

from . import _native
from .app import App
from .worker import Worker


def duration(text: str) -> float:
    """Seconds of a duration written as ``jobguard worker`` takes it (``30s``, ``500ms``,
    ``2m``: the core's parser). A bare number is read as seconds, as this command took it
    before durations."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return _native.parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class LoadError(Exception):
    """The app cannot be loaded, or the worker's options are invalid: the message names what
    and why."""


def add_parser(commands: Any) -> None:
    worker = commands.add_parser(
        "worker", help="run the jobs an App defines from jobguard's queue, until SIGTERM/SIGINT"
    )
    worker.add_argument("app", help="module:attribute of the jobguard.App, e.g. myapp.jobs:app")
    worker.add_argument("--queue", default="default")
    worker.add_argument("--concurrency", type=int, default=10,
                        help="jobs run at once (default: %(default)s)")
    worker.add_argument("--batch-size", type=int, default=1,
                        help="jobs of kinds defined with batch=True run up to this many in one "
                             "transaction when a backlog builds (PostgreSQL; 1: off)")
    # Durations as `jobguard worker` takes them (30s, 500ms, 2m), and its option names.
    worker.add_argument("--lease", type=duration, default="30s",
                        help="how long a fetched job is held before another worker may take it "
                             "(default: %(default)s)")
    worker.add_argument("--poll", "--poll-interval", dest="poll_interval", type=duration,
                        default="1s",
                        help="how often an idle worker looks for jobs where no notification "
                             "wakes it (default: %(default)s)")
    worker.add_argument("--shutdown-timeout", type=duration, default="30s",
                        help="how long running jobs may finish after SIGTERM/SIGINT "
                             "(default: %(default)s)")
    worker.add_argument("--until-idle", action="store_true",
                        help="stop once no job of the app's kinds is due and none runs")
    worker.add_argument("--migrate", action="store_true",
                        help="create the queue's and the guard's tables first (app.migrate())")


def load_app(spec: str) -> App:
    """The App at ``module:attribute`` (attribute ``app`` when omitted)."""
    module_name, _, attribute = spec.partition(":")
    attribute = attribute or "app"
    if not module_name:
        raise LoadError(f"`{spec}` names no module: give module:attribute, e.g. myapp.jobs:app")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import failure is the user's to fix
        raise LoadError(f"cannot import `{module_name}`: {type(error).__name__}: {error}") from None
    app = module
    for part in attribute.split("."):
        try:
            app = getattr(app, part)
        except AttributeError:
            raise LoadError(f"module `{module_name}` has no attribute `{attribute}`") from None
    if not isinstance(app, App):
        raise LoadError(
            f"`{spec}` is a {type(app).__module__}.{type(app).__qualname__}, not a jobguard.App"
        )
    return app


def run(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    logging.basicConfig(level=os.environ.get("JOBGUARD_LOG", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:  # the options are checked before anything connects
        worker = Worker(
            app, queue=args.queue, concurrency=args.concurrency, lease=args.lease,
            poll_interval=args.poll_interval, shutdown_timeout=args.shutdown_timeout,
            until_idle=args.until_idle, batch_size=args.batch_size,
        )
    except ValueError as error:
        raise LoadError(str(error)) from None

    async def main() -> Any:
        if args.migrate:
            await app.migrate()
        return await worker.run()

    stats = asyncio.run(main())
    print(f"{stats.applied} applied, {stats.duplicates} duplicates, {stats.failed} failed, "
          f"{stats.dead} dead, {stats.fenced} fenced, {stats.released} given back"
          + (f"; {stats.batches} batches, {stats.batches_rolled_back} rolled back"
             if args.batch_size > 1 else ""),
          file=sys.stderr)
    return 0
