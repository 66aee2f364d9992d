"""What the Celery kill and retry tests share, for a plain Celery app
(``frameworks/celery``) and for a Django project's (``frameworks/django``): a queue of the
test's own on the broker with a producer for it, deleted when the test ends, and the prefork
worker's command line."""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from pathlib import Path
from typing import Iterator

from celery import Celery

from frameworks import kills


@contextlib.contextmanager
def queue(broker: str) -> Iterator[tuple[str, Celery]]:
    """The name of a new queue on ``broker`` (a key of ``kills.BROKERS``) and a producer;
    the queue is deleted when the block ends."""
    name = f"jobguard-test-{uuid.uuid4().hex[:8]}"
    producer = Celery(broker=kills.BROKERS[broker])
    try:
        yield name, producer
    finally:
        with producer.connection_for_write() as conn:
            conn.default_channel.queue_delete(name)
        producer.close()


def publish(producer: Celery, queue: str, orders: list[str], times: int = 1) -> None:
    """``credit`` for each order, ``times`` rounds of them."""
    for _ in range(times):
        for order in orders:
            producer.send_task("credit", args=[order], queue=queue)


def worker_command(app: str, concurrency: int) -> list[str]:
    """A prefork worker of the Celery app ``app``, without the cluster chatter that would slow
    a worker's restart."""
    return [
        sys.executable, "-m", "celery", "-A", app, "worker", "--pool=prefork",
        f"--concurrency={concurrency}", "--without-heartbeat", "--without-mingle",
        "--without-gossip", "--loglevel=INFO",
    ]


def app_environment(pg_url: str, broker: str, queue: str, flags: Path,
                    **extra: str) -> dict[str, str]:
    """The environment ``frameworks/celery/celery_app.py`` reads: its database, broker, queue
    and flags directory, and the path it imports ``kills`` from; ``extra`` added."""
    here = Path(__file__).parent
    return {
        **os.environ,
        "DATABASE_URL": pg_url,
        "JOBGUARD_TEST_BROKER": kills.BROKERS[broker],
        "JOBGUARD_TEST_QUEUE": queue,
        "JOBGUARD_TEST_FLAGS": str(flags),
        "PYTHONPATH": os.pathsep.join([str(here / "celery"), str(here)]),
        **extra,
    }
