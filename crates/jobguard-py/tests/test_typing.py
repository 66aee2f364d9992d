"""The package is typed (``py.typed``): ``mypy --strict`` passes on its source and on every
```python example of README.md and docs/python.md, as a user's code type-checked against the
installed package sees it. The settings are the package's own (crates/jobguard-py/pyproject.toml:
strict, and the untyped frameworks and asyncpg as ``Any``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import doc_snippets

CRATE = Path(__file__).resolve().parents[1]
CONFIG = CRATE / "pyproject.toml"
# mypy's cache, kept in the virtualenv (a cached one in scripts/test): a run after the first
# checks only the files that changed, instead of SQLAlchemy's and the standard library's stubs
# again. mypy keys its cache on each file's content, so a stale entry is never used.
CACHE = Path(sys.prefix) / "mypy-cache"

pytest.importorskip("mypy", reason="mypy is in tests/requirements.txt")


def mypy(*args: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(CONFIG), "--cache-dir", str(cache),
         *args],
        cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )


def test_the_package_passes_mypy_strict() -> None:
    result = mypy("python/jobguard", cwd=CRATE, cache=CACHE / "package")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_python_example_in_the_docs_passes_mypy_strict(tmp_path: Path) -> None:
    groups: dict[bool, list[str]] = {False: [], True: []}
    for snippet in doc_snippets.snippets():
        name = f"snippet_{Path(snippet.path).stem}_{snippet.line}.py".replace("-", "_")
        (tmp_path / name).write_text(snippet.code)
        groups[snippet.kind == "framework"].append(name)
    assert groups[False] and groups[True], "no ```python blocks found"
    # Each example is a module of its own, so two examples may both define `credit`. A
    # framework's examples are checked where the framework is not installed: its names are
    # `Any`, and so are its decorators, which --strict would otherwise refuse.
    failures = []
    for framework, files in groups.items():
        flags = ["--allow-untyped-decorators"] if framework else []
        result = mypy(*flags, *files, cwd=tmp_path, cache=CACHE / f"docs-{framework}")
        if result.returncode != 0:
            failures.append(result.stdout + result.stderr)
    assert not failures, "\n".join(failures)


def test_the_bench_adapters_pass_mypy_strict() -> None:
    # Scripts, each importing `contract` beside it and a peer queue's package, which is
    # installed in that peer's own virtualenv only: its names and decorators are `Any` here.
    adapters = CRATE / "python" / "jobguard" / "_bench_adapters"
    files = sorted(p.name for p in adapters.glob("*.py"))
    assert "contract.py" in files and len(files) >= 6, files
    result = mypy("--ignore-missing-imports", "--allow-untyped-decorators",
                  "--explicit-package-bases", *files, cwd=adapters, cache=CACHE / "adapters")
    assert result.returncode == 0, result.stdout + result.stderr
