"""``jobguard.enqueue`` keeps the Rust queue's payload rules, from the core: at most
``MAX_PAYLOAD_BYTES`` of JSON and no NUL character, on PostgreSQL and SQLite, sync and async.
A payload that breaks them is ``PayloadError`` and nothing is written; the transaction goes on."""

from __future__ import annotations

import json

import pytest

import jobguard
from conftest import CLIENTS, DRIVERS, SQLITE_DRIVERS, count
from test_cross_language import cli  # noqa: F401  (the fixture)

LIMIT = jobguard.MAX_PAYLOAD_BYTES
# `{"blob":"` + the string + `"}` is the JSON the queue stores.
FRAME = len(json.dumps({"blob": ""}, separators=(",", ":")))


def blob(json_bytes: int) -> dict:
    return {"blob": "x" * (json_bytes - FRAME)}


REFUSED = {
    "two_mebibytes": ({"blob": "x" * (2 << 20)}, "over the limit of 1048576"),
    "one_byte_over": (blob(LIMIT + 1), "is 1048577 bytes of JSON, over the limit of 1048576"),
    "nul_in_a_value": ({"note": "a\u0000b"}, "NUL character"),
    "nul_in_a_nested_key": ({"lines": [{"k\u0000": 1}]}, "NUL character"),
}


def test_the_limit_is_the_rust_queues():
    assert jobguard.MAX_PAYLOAD_BYTES == 1 << 20


@pytest.fixture(params=DRIVERS)
def queue_client_factory(request, cli):  # noqa: F811
    """Opens a client of the driver on a database whose queue tables the Rust worker made."""
    driver = request.param
    if driver in SQLITE_DRIVERS:
        target = request.getfixturevalue("sqlite_path")
        url = f"sqlite:{target}"
    else:
        target = url = request.getfixturevalue("pg_url")
    cli("worker", "--until-idle", url=url)  # the worker migrates the queue's tables
    return lambda: CLIENTS[driver].open(target)


async def enqueue(client, kind, payload, key=None):
    if client.is_async:
        return await jobguard.enqueue(client.conn, kind, payload, key=key)
    return await client.call(
        lambda: jobguard.enqueue_sync(client.conn, kind, payload, key=key)
    )


@pytest.mark.parametrize("case", sorted(REFUSED))
async def test_a_payload_breaking_the_rules_is_refused_and_nothing_is_written(
    queue_client_factory, case
):
    payload, reason = REFUSED[case]
    client = await queue_client_factory()
    try:
        await client.begin()
        refused_key = jobguard.key("credit", "refused")
        with pytest.raises(jobguard.PayloadError, match=reason) as raised:
            await enqueue(client, "credit", payload, key=refused_key)
        assert isinstance(raised.value, jobguard.Error)
        assert f"the payload of job `{refused_key}` cannot be enqueued" in str(raised.value)
        # Nothing was sent: the transaction is intact and goes on.
        kept = await enqueue(client, "credit", {"order": "kept"}, key=jobguard.key("credit", "kept"))
        await client.commit()
        assert kept.inserted
        await client.begin()
        total = await count(client, "select count(*) from jobguard_jobs", [])
        refused = await count(
            client, "select count(*) from jobguard_jobs where job_key = $1", [refused_key]
        )
        await client.commit()
        assert (total, refused) == (1, 0)
    finally:
        await client.close()


async def test_a_payload_at_the_limit_is_enqueued(queue_client_factory):
    client = await queue_client_factory()
    try:
        await client.begin()
        at_limit = await enqueue(client, "noop", blob(LIMIT))
        await client.commit()
        assert at_limit.inserted
    finally:
        await client.close()
