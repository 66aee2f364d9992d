"""``python -m django ...`` on the tests' project, in a process of its own, against a
PostgreSQL database and a SQLite file of the caller's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def environment(database_url: str, sqlite_path: str, **extra: str) -> dict[str, str]:
    """The environment of a process of the tests' project: its settings, its databases, and
    ``tests/`` and this directory on the path (``frameworks.kills``, ``djproject``)."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "djproject.settings",
        "JOBGUARD_DJANGO_DATABASE_URL": database_url,
        "JOBGUARD_DJANGO_SQLITE": sqlite_path,
        "PYTHONPATH": os.pathsep.join(
            p for p in [str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH")] if p
        ),
        **extra,
    }


def manage(*args: str, database_url: str, sqlite_path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "django", *args], env=environment(database_url, sqlite_path),
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )


def migrate(database: str, database_url: str, sqlite_path: str) -> str:
    """``migrate --database DATABASE``; its output."""
    out = manage("migrate", "--database", database, database_url=database_url,
                 sqlite_path=sqlite_path)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout
