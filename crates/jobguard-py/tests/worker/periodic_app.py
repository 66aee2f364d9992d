"""The apps the periodic worker tests run as ``python -m jobguard worker``:

- ``app``: the schedule ``every-second``, a ``tick`` job at every second that appends its
  firing's time to ``periodic_ledger`` in the job's transaction; missed firings all caught up;
- ``drain``: the same ``tick`` job without the schedule, to run what is left;
- ``mixed``: the schedule ``mixed`` as the Rust worker's ``--schedule`` file has it (the
  built-in ``noop`` kind, its ``id`` set to the firing's time), for a Python and a Rust
  scheduler on one schedule.

``JOBGUARD_TEST_DRIVER`` picks the pool, ``DATABASE_URL`` the database."""

from __future__ import annotations

import os
from typing import Any

import jobguard
from ledger_app import insert, pool_factory

PERIODIC_LEDGER = """create table if not exists periodic_ledger (
    id bigserial primary key, at text not null, pid int not null default pg_backend_pid())"""

EVERY_SECOND = "* * * * * *"


def make_app(driver: str, url: str, scheduled: bool = True) -> jobguard.App:
    app = jobguard.App(db=pool_factory(driver, url))

    async def tick(conn: Any, at: str) -> None:
        await insert(conn, "insert into periodic_ledger (at) values ($1)", at)

    job = app.job("tick")(tick)
    if scheduled:
        app.periodic(EVERY_SECOND, name="every-second", missed="all", firing_field="at")(job)
    return app


def make_mixed(driver: str, url: str) -> jobguard.App:
    app = jobguard.App(db=pool_factory(driver, url))

    @app.periodic(EVERY_SECOND, name="mixed", missed="all", payload={"id": "x"},
                  firing_field="id")
    @app.job("noop")
    async def noop(conn: Any, id: str) -> None:  # noqa: A002 - the built-in noop's payload
        pass

    return app


if os.environ.get("JOBGUARD_TEST_DRIVER"):
    _driver, _url = os.environ["JOBGUARD_TEST_DRIVER"], os.environ["DATABASE_URL"]
    app = make_app(_driver, _url)
    drain = make_app(_driver, _url, scheduled=False)
    mixed = make_mixed(_driver, _url)
