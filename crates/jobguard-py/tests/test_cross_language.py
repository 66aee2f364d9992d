"""Python and Rust on one guard table: a key applied by one is a duplicate for the other, and
the `jobguard` CLI reads and prunes keys that Python applied."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import psycopg
import pytest

import jobguard

CLI = os.environ.get("JOBGUARD_CLI") or shutil.which("jobguard")


@pytest.fixture
def cli():
    if not CLI:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but no jobguard binary: set JOBGUARD_CLI")
        pytest.skip("no jobguard binary (set JOBGUARD_CLI)")

    def run(*args: str, url: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CLI, *args, "--database-url", url],
            capture_output=True,
            text=True,
            check=check,
            stdin=subprocess.DEVNULL,
        )

    return run


def credit(order: str, amount: int = 500) -> dict:
    return {"order": order, "account": 7, "amount": amount}


def ledger(url: str, order: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "select count(*) from jobguard_ledger where job_key = %s", [f"credit:{order}"]
        ).fetchone()[0]


def apply_from_python(url: str, order: str, payload: dict) -> jobguard.Guard:
    with psycopg.connect(url) as conn:
        jobguard.migrate_sync(conn)
        with conn.transaction():
            with jobguard.guard_sync(conn, jobguard.key("credit", order), payload) as g:
                if g.applied:
                    g.set_result({"by": "python"})
        return g


def test_a_key_python_applied_is_a_duplicate_for_the_rust_worker(pg_url, cli):
    # Python migrates first; the Rust worker's migration then finds the same schema.
    assert apply_from_python(pg_url, "o-py", credit("o-py")).applied
    cli("enqueue", "credit", "--payload", json.dumps(credit("o-py")), url=pg_url)
    cli("worker", "--until-idle", url=pg_url)
    assert ledger(pg_url, "o-py") == 0, "the Rust guard applied a key Python had applied"
    report = json.loads(cli("key", "credit:o-py", "--json", url=pg_url).stdout)
    assert report["guard"]["kind"] == "credit"
    assert report["guard"]["result"] == {"by": "python"}


def test_a_key_the_rust_worker_applied_is_a_duplicate_for_python(pg_url, cli):
    cli("enqueue", "credit", "--payload", json.dumps(credit("o-rs")), url=pg_url)
    cli("worker", "--until-idle", url=pg_url)
    assert ledger(pg_url, "o-rs") == 1
    # The same payload: Python's fingerprint equals Rust's, so this is a duplicate...
    again = apply_from_python(pg_url, "o-rs", credit("o-rs"))
    assert again.duplicate and again.first_applied_at is not None
    # ... and another payload under the same key is refused.
    with pytest.raises(jobguard.KeyReused):
        apply_from_python(pg_url, "o-rs", credit("o-rs", amount=501))


def test_the_cli_prunes_keys_python_applied(pg_url, cli):
    apply_from_python(pg_url, "o-old", credit("o-old"))
    with psycopg.connect(pg_url) as conn:
        conn.execute("update processed_jobs set applied_at = now() - interval '30 days'")
    out = cli("prune", "--keep", "14d", "--json", url=pg_url)
    assert "guard" in out.stdout
    with psycopg.connect(pg_url) as conn:
        left = conn.execute("select count(*) from processed_jobs").fetchone()[0]
    assert left == 0
    assert cli("key", "credit:o-old", url=pg_url, check=False).returncode != 0
