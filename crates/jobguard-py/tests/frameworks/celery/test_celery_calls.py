"""The quick start's calls, as docs/python.md shows them: ``credit.delay(order, amount)`` and
``credit.apply_async((order, amount))`` on a task defined as ``credit(conn, order, amount)``.
Celery checks a call against the task's signature (``typing``); the caller passes no ``conn``.
"""

from __future__ import annotations

import importlib
import os
import sys
import uuid
from pathlib import Path

import pytest

import jobguard
from frameworks import kills

HERE = Path(__file__).parent
AMQP = os.environ.get("JOBGUARD_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def load_app(env: dict[str, str]):
    """The app module as the producer sees it, configured like the worker."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        sys.modules.pop("celery_app", None)
        sys.path[:0] = [str(HERE), str(HERE.parent)]
        return importlib.import_module("celery_app")
    finally:
        sys.path.remove(str(HERE))
        sys.path.remove(str(HERE.parent))
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_delay_and_apply_async_as_documented(pg_url, tmp_path):
    kills.require(AMQP)
    kills.prepare(pg_url)
    flags = tmp_path / "flags"
    flags.mkdir()
    queue = f"jobguard-test-{uuid.uuid4().hex[:8]}"
    env = {
        "DATABASE_URL": pg_url,
        "JOBGUARD_TEST_BROKER": AMQP,
        "JOBGUARD_TEST_QUEUE": queue,
        "JOBGUARD_TEST_FLAGS": str(flags),
    }
    app = load_app(env)
    credit = app.credit_amount
    try:
        credit.delay("order-8812", 500)
        credit.apply_async(("order-8813", 500))
        credit.apply_async(args=("order-8814",), kwargs={"amount": 500})
        # The check is still there: a call that misses an argument fails on the sender.
        with pytest.raises(TypeError):
            credit.delay("order-8815")
        with pytest.raises(TypeError):
            credit.delay(None, "order-8815", 500)
        cmd = [
            sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool=prefork",
            "--concurrency=1", "--without-heartbeat", "--without-mingle", "--without-gossip",
            "--loglevel=INFO",
        ]
        worker_env = {
            **os.environ, **env, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
        }
        workers = kills.Workers(cmd, worker_env, tmp_path, limit_s=30)
        orders = ["order-8812", "order-8813", "order-8814"]
        workers.run_until(lambda: len(kills.effects(pg_url)) >= len(orders))
        assert kills.effects(pg_url) == {jobguard.key("credit", o): 1 for o in orders}
    finally:
        with app.app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
        app.app.close()
