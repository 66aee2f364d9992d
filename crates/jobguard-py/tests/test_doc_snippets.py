"""Every ```python block of README.md and docs/python.md, exercised as its marker says
(doc_snippets.py): ``run`` blocks run exactly as written on a database of their own and must
exit 0; ``framework`` blocks compile here and run in their framework's tests. A block without a
marker fails."""

from __future__ import annotations

import ast

import pytest

from doc_snippets import KINDS, run, snippets
from test_cross_language import cli  # noqa: F401  (the fixture)

ALL = snippets()


def test_the_docs_have_runnable_snippets():
    kinds = [s.kind for s in ALL]
    assert kinds.count("run") >= 5, kinds
    assert {"README.md", "docs/python.md"} <= {s.path for s in ALL if s.kind == "run"}


@pytest.mark.parametrize("snippet", ALL, ids=[s.id for s in ALL])
def test_every_snippet_is_marked_and_compiles(snippet):
    assert snippet.kind in KINDS, (
        f"{snippet.id}: put `<!-- snippet: run -->` (or `run queue`, `framework NAME`) on the "
        "line before the block"
    )
    # A framework block may show a producer's `await task.kiq(...)` at top level: its
    # framework's tests run it in an event loop; a `run` block compiles as a plain script.
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if snippet.kind == "framework" else 0
    compile(snippet.code, snippet.id, "exec", flags=flags)


RUNNABLE = [s for s in ALL if s.kind == "run"]


@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.id for s in RUNNABLE])
def test_a_runnable_snippet_runs_as_written(snippet, pg_url, tmp_path, request):
    if "queue" in snippet.args:
        request.getfixturevalue("cli")("worker", "--until-idle", url=pg_url)
    out = run(snippet, pg_url, tmp_path)
    assert out.returncode == 0, f"{snippet.id} failed:\n{out.stderr}"
