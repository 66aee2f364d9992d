"""The ```python blocks of README.md and docs/python.md, each with the marker on the line before
it, which says how the tests exercise it:

    <!-- snippet: run -->              run exactly as written, as a script (test_doc_snippets.py)
    <!-- snippet: run queue -->        the same, on a database whose queue tables the Rust
                                       `jobguard worker` made first
    <!-- snippet: framework NAME -->   compiled by test_doc_snippets.py, and run by the tests of
                                       tests/frameworks/NAME in that framework's virtualenv

A block without a marker fails test_doc_snippets.py, so a new snippet cannot go untested.
Snippets connect with ``DATABASE_URL = os.environ["DATABASE_URL"]``: :func:`run` sets
``DATABASE_URL`` to the database it is given and runs the snippet in the directory it is given,
where a snippet's SQLite files land.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCS = ("README.md", "docs/python.md")
KINDS = ("run", "framework")
_MARKER = re.compile(r"<!--\s*snippet:\s*(.*?)\s*-->")


@dataclasses.dataclass(frozen=True)
class Snippet:
    """One ```python block: where it is, its marker (``kind`` and ``args``; ``kind`` is None
    when the block has no marker) and its code."""

    path: str
    line: int
    kind: str | None
    args: tuple[str, ...]
    code: str

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def parse(path: str, text: str) -> list[Snippet]:
    """The ```python blocks of one Markdown text; ``line`` is the fence's, from 1."""
    out: list[Snippet] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        marker = None
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0:
            marker = _MARKER.fullmatch(lines[j].strip())
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        words = marker.group(1).split() if marker else []
        out.append(Snippet(
            path=path, line=i + 1, kind=words[0] if words else None, args=tuple(words[1:]),
            code="\n".join(lines[i + 1:end]) + "\n",
        ))
        i = end + 1
    return out


def snippets() -> list[Snippet]:
    """Every ```python block of the documents in :data:`DOCS`."""
    return [s for path in DOCS for s in parse(path, (ROOT / path).read_text())]


def framework_snippets(name: str) -> list[Snippet]:
    """The blocks marked ``framework NAME``: for the tests of tests/frameworks/NAME."""
    return [s for s in snippets() if s.kind == "framework" and s.args[:1] == (name,)]


def run(
    snippet: Snippet, database_url: str, cwd: Path, python: str = sys.executable,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Runs ``snippet`` as a script named after its place in the docs, with ``DATABASE_URL``
    set, in ``cwd``."""
    script = cwd / f"snippet_{Path(snippet.path).stem}_{snippet.line}.py"
    script.write_text(snippet.code)
    env = {**os.environ, "DATABASE_URL": database_url}
    return subprocess.run(
        [python, script.name], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, stdin=subprocess.DEVNULL,
    )
