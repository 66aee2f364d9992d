"""A throwaway PostgreSQL cluster of a test's own, made with ``initdb`` on a free port, which the
test may restart in immediate mode (a crash: every connection cut, no checkpoint, the WAL
replayed on start); stopped and deleted afterwards. The shared server is never restarted.

As the Rust fault run's ``Cluster`` (crates/jobguard-cli/tests/it/common/cluster.rs): the
newest server programs on PATH or in Debian's ``/usr/lib/postgresql/<version>/bin``, handed to
the ``postgres`` user when run as root (initdb and the server refuse root)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def bin_dir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are, if anywhere."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).parent
    versions = []
    for entry in Path("/usr/lib/postgresql").glob("*/bin"):
        if (entry / "initdb").is_file() and (entry / "pg_ctl").is_file():
            try:
                versions.append((int(entry.parent.name), entry))
            except ValueError:
                continue
    return max(versions)[1] if versions else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A cluster on a free port; :meth:`delete` stops it and removes its files."""

    def __init__(self, bin: Path) -> None:
        self.bin = bin
        self.root = os.geteuid() == 0
        # The postgres user must reach it when root hands it over: not a TMPDIR under /root.
        self.dir = Path(tempfile.mkdtemp(prefix="jobguard-py-pg-",
                                         dir="/tmp" if self.root else None))
        if self.root:
            shutil.chown(self.dir, "postgres", "postgres")
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        self.run("initdb", "-D", "data", "-U", "postgres", "-A", "trust", "--no-sync")
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 "
                   f"-c unix_socket_directories={self.dir} -c max_connections=200 -c fsync=off")
        self.run("pg_ctl", "start", "-D", "data", "-l", "server.log", "-w", "-t", "60",
                 "-o", options)

    def command(self, program: str, *args: str) -> list[str]:
        command = [str(self.bin / program), *args]
        return ["runuser", "-u", "postgres", "--", *command] if self.root else command

    def run(self, program: str, *args: str) -> None:
        done = subprocess.run(self.command(program, *args), cwd=self.dir, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout}\n{done.stderr}\nserver log:\n{self.log()}")

    def log(self) -> str:
        try:
            return (self.dir / "server.log").read_text()[-4000:]
        except OSError:
            return ""

    def restart_immediate(self) -> None:
        """Crashes the server and starts it again; returns once it accepts connections."""
        self.run("pg_ctl", "restart", "-D", "data", "-m", "immediate", "-l", "server.log",
                 "-w", "-t", "60")

    def delete(self) -> None:
        try:
            self.run("pg_ctl", "stop", "-D", "data", "-m", "immediate", "-w")
        except RuntimeError:
            # The postmaster this cluster started, by the pid it wrote.
            pid_file = self.dir / "data" / "postmaster.pid"
            if pid_file.exists():
                pid = int(pid_file.read_text().split()[0])
                subprocess.run(["kill", "-KILL", str(pid)], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
