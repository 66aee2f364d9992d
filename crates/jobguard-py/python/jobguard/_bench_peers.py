"""The queues ``python -m jobguard bench queue`` measures, their settings, and the virtualenv
each runs in.

A peer is installed from PyPI into a virtualenv of its own (``<peers dir>/<name>-<version>``,
made on first use), so that its dependencies never meet jobguard's, and its adapter (a script
in ``_bench_adapters/``, which imports nothing of jobguard's) runs with that virtualenv's
Python. jobguard's own adapter runs with the Python running the bench.

Each system has two settings: its documented defaults, and the settings its documentation
gives for throughput, within 20 connections. Where a library has no default (a queue's limit,
a worker count), its README's example is taken as the default.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ADAPTERS = Path(__file__).resolve().parent / "_bench_adapters"
DEFAULT_PEERS_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / \
    "jobguard" / "bench-peers"


@dataclasses.dataclass(frozen=True)
class System:
    """A queue the bench measures: its package, adapter and the settings it runs at."""

    name: str
    adapter: str
    package: str | None  # None: jobguard itself, run by this Python
    version: str | None
    settings: dict[str, dict[str, Any]]
    notes: dict[str, str]
    python: tuple[int, int] = (3, 10)
    extras: tuple[str, ...] = ()

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SYSTEMS: dict[str, System] = {s.name: s for s in [
    System(
        "jobguard", "jobguard_adapter.py", None, None,
        {"default": {"concurrency": 10},
         "best": {"concurrency": 18, "pool": 20, "batch_size": 50}},
        {"default": "Worker(concurrency=10) on an asyncpg pool of concurrency + 2, one job "
                    "per transaction (docs/python.md, Running workers)",
         "best": "concurrency 18 on a pool of 20, kinds defined with batch=True and "
                 "Worker(batch_size=50) (docs/python.md, Batches: choosing the size)"},
    ),
    System(
        "procrastinate", "procrastinate_adapter.py", "procrastinate", "3.10.0",
        {"default": {}, "best": {"concurrency": 18, "pool": 20}},
        {"default": "run_worker_async(): concurrency 1, listen_notify on; psycopg pool of 4",
         "best": "run_worker_async(concurrency=18) (App.run_worker_async's reference, "
                 "howto/production/concurrency); PsycopgConnector(max_size=20)"},
        extras=("psycopg[binary,pool]",),
    ),
    System(
        "pgqueuer", "pgqueuer_adapter.py", "pgqueuer", "1.6.0",
        {"default": {}, "best": {"batch_size": 50, "pool": 20}},
        {"default": "QueueManager.run(): batch_size 10, no task limit, on one asyncpg "
                    "connection (AsyncpgDriver, the README's example)",
         "best": "run(batch_size=50) (QueueManager.run's reference) on AsyncpgPoolDriver "
                 "with a pool of 20"},
        extras=("asyncpg",),
    ),
    System(
        "oban", "oban_adapter.py", "oban", "0.7.0",
        {"default": {"limit": 10}, "best": {"limit": 18, "pool": 20}},
        {"default": "queues={'default': 10} (the README's example; a queue has no default "
                    "limit); Oban.create_pool() of 10",
         "best": "queues={'default': 18} (Oban(queues=...), 'Defining Queues'); "
                 "create_pool(max_size=20)"},
        python=(3, 12),
    ),
    System(
        "awa", "awa_adapter.py", "awa-pg", "0.6.9",
        {"default": {"workers": 4}, "best": {"workers": 18, "pool": 20}},
        {"default": "start([('default', 4)]) (the README's quick start), "
                    "AsyncClient(max_connections=10), poll_interval_ms 200",
         "best": "start([('default', 18)]), AsyncClient(max_connections=20)"},
        extras=("asyncpg",),
    ),
]}


class InstallFailed(Exception):
    """A peer's virtualenv could not be made: the message says why."""


def _interpreter(minimum: tuple[int, int]) -> str:
    """A Python of at least ``minimum``: this one, else a ``python3.N`` on PATH (or pyenv's)
    that runs."""
    if sys.version_info[:2] >= minimum:
        return sys.executable
    for minor in range(14, minimum[1] - 1, -1):
        candidates = [shutil.which(f"python3.{minor}")]
        candidates += sorted(glob.glob(os.path.expanduser(
            f"~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}")), reverse=True)
        for found in candidates:
            if found and subprocess.run([found, "-c", "import venv"], capture_output=True,
                                        stdin=subprocess.DEVNULL).returncode == 0:
                return found
    raise InstallFailed(f"needs Python >= {minimum[0]}.{minimum[1]}: none on PATH "
                        f"(python3.{minimum[1]} ...)")


def python_for(system: System, peers_dir: Path, log: Any) -> str:
    """The Python that runs ``system``'s adapter: this one for jobguard, the peer's own
    virtualenv's (made and installed from PyPI when missing) for a peer."""
    if system.package is None:
        return sys.executable
    venv = peers_dir / f"{system.package}-{system.version}"
    python = venv / "bin" / "python"
    marker = venv / ".jobguard-bench-installed"
    wanted = " ".join((system.requirement,) + system.extras)
    if marker.exists() and marker.read_text() == wanted:
        return str(python)
    peers_dir.mkdir(parents=True, exist_ok=True)
    base = _interpreter(system.python)
    log(f"installing {wanted} into {venv}")
    for step in ([base, "-m", "venv", "--clear", str(venv)],
                 [str(python), "-m", "pip", "install", "-q", *wanted.split()]):
        done = subprocess.run(step, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise InstallFailed(f"`{' '.join(step)}` failed: {' / '.join(tail)}")
    marker.write_text(wanted)
    return str(python)
