"""Keys, fingerprints and API keys against the vectors jobguard-core's Rust test generated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import jobguard

GOLDEN = json.loads((Path(__file__).parent / "golden.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", GOLDEN["keys"], ids=lambda c: repr(c["kind"])[:20])
def test_keys(case):
    if case.get("error"):
        with pytest.raises(jobguard.InvalidKey):
            jobguard.key(case["kind"], *case["parts"])
        return
    encoded = jobguard.key(case["kind"], *case["parts"])
    assert encoded == case["encoded"]
    assert encoded.encode() == case["encoded"].encode()
    assert jobguard.parse_key(encoded) == (case["kind"], case["parts"])


@pytest.mark.parametrize("case", GOLDEN["fingerprints"], ids=lambda c: c["json"][:24])
def test_fingerprints(case):
    assert jobguard.fingerprint(json.loads(case["json"])) == case["hex"]


@pytest.mark.parametrize(
    "case", GOLDEN["api_keys"], ids=lambda c: f"{c['key'][:16]}-{c['alphabet']}-{c['max_len']}"
)
def test_api_keys(case):
    fmt = jobguard.ApiKeyFormat(case["max_len"], case["alphabet"])
    assert jobguard.api_key(case["key"], case["step"], fmt) == case["api_key"]


def test_the_vectors_cover_what_they_should():
    assert len(GOLDEN["keys"]) >= 15 and len(GOLDEN["fingerprints"]) >= 20
    assert any(c.get("error") for c in GOLDEN["keys"])
    assert any(len(c["api_key"]) < len(c["key"]) for c in GOLDEN["api_keys"])


def test_int_parts_are_their_decimal_form_and_other_types_are_refused():
    assert jobguard.key("credit", 8812) == "credit:8812"
    for bad in (1.5, None, True, b"x"):
        with pytest.raises(jobguard.InvalidKey):
            jobguard.key("credit", bad)


def test_stripe_is_the_default_format_and_short_formats_are_refused():
    assert jobguard.api_key("charge:order-8812", "create-charge") == "charge:order-8812:create-charge"
    with pytest.raises(jobguard.InvalidFormat):
        jobguard.ApiKeyFormat(16)
    with pytest.raises(jobguard.InvalidKey):
        jobguard.api_key("charge:order-8812", "bad step")
