"""Keys, fingerprints and API keys: computed by jobguard's Rust core, byte for byte."""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Literal

from . import _native
from .errors import InvalidFormat, InvalidKey, InvalidName, PayloadError

MAX_KEY_LEN: int = _native.MAX_KEY_LEN
MAX_KIND_LEN: int = _native.MAX_KIND_LEN
#: The largest job payload, as JSON bytes, the queue accepts (the Rust queue's limit).
MAX_PAYLOAD_BYTES: int = _native.MAX_PAYLOAD_BYTES


def _part(index: int, part: object) -> str:
    # str and int only: str() of anything else (floats, None, objects) is not a stable key.
    if isinstance(part, bool) or not isinstance(part, (str, int)):
        raise InvalidKey(
            f"part {index} of the job key is a {type(part).__name__}: pass business ids as "
            "str or int, and hash anything longer (hashlib.blake2b) into a hex str"
        )
    return str(part)


def key(kind: str, *parts: object) -> str:
    """The job key of a business operation: ``key("credit", "order-8812")`` is
    ``"credit:order-8812"``; ``:`` and ``%`` inside parts are escaped as in Rust's ``JobKey``.

    Raises :class:`InvalidKey` for an empty or non-identifier kind, no parts, an empty part,
    NUL, or a key over 512 bytes once encoded.
    """
    if not isinstance(kind, str):
        raise InvalidKey(f"the job key kind is a {type(kind).__name__}, not a str")
    encoded = [_part(i, p) for i, p in enumerate(parts)]
    try:
        return _native.key(kind, encoded)
    except ValueError as error:
        raise InvalidKey(str(error)) from None


def parse_key(encoded: str) -> tuple[str, list[str]]:
    """The kind and parts of an encoded key: ``parse_key("k:a%3Ab:c") == ("k", ["a:b", "c"])``."""
    try:
        return _native.parse_key(encoded)
    except (ValueError, TypeError) as error:
        raise InvalidKey(str(error)) from None


def kind_of(encoded: str) -> str:
    """The kind of an encoded key (``credit`` for ``credit:order-8812``), the whole key checked."""
    try:
        return _native.kind_of(encoded)
    except (ValueError, TypeError) as error:
        raise InvalidKey(str(error)) from None


def to_json(value: Any, what: str = "payload") -> str:
    """``value`` as JSON text, refusing what JSON cannot carry (NaN, sets, objects)."""
    try:
        return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise PayloadError(f"the {what} is not JSON-serialisable: {error}") from None


def check_job_payload(key: str, text: str) -> None:
    """Refuses a job payload (its JSON ``text``) that breaks the Rust queue's rules: over
    :data:`MAX_PAYLOAD_BYTES` of JSON, or a NUL character. The rule and its message are the
    core's, so Python refuses what Rust refuses."""
    reason = _native.payload_problem_of(text)
    if reason is not None:
        raise PayloadError(f"the payload of job `{key}` cannot be enqueued: {reason}")


def fingerprint_bytes(payload: Any) -> bytes:
    """The 32 bytes the guard table stores for ``payload``."""
    try:
        return _native.fingerprint(to_json(payload))
    except ValueError as error:
        raise PayloadError(f"the payload is not JSON jobguard can hash: {error}") from None


def fingerprint(payload: Any) -> str:
    """The fingerprint of a JSON-serialisable payload, as 64 hex digits: the same as Rust's
    ``Fingerprint::of`` of the same value (object key order does not matter)."""
    return fingerprint_bytes(payload).hex()


Alphabet = Literal["printable", "token", "alphanumeric"]


@dataclasses.dataclass(frozen=True)
class ApiKeyFormat:
    """The idempotency keys an API accepts: at most ``max_len`` characters of ``alphabet``
    (``printable``: visible ASCII; ``token``: letters, digits, ``-_.:``; ``alphanumeric``)."""

    max_len: int
    alphabet: Alphabet = "printable"

    def __post_init__(self) -> None:
        if self.max_len < 32:
            raise InvalidFormat(
                f"a maximum length of {self.max_len} leaves no room for the 32-character hash "
                "that keeps keys distinct; allow at least 32 characters"
            )


STRIPE = ApiKeyFormat(255, "printable")
_FORMATS = {"stripe": STRIPE}


def api_key(key: str, operation: str, format: ApiKeyFormat | str = "stripe") -> str:
    """The idempotency key to send an external API for ``operation`` of the job ``key``:
    ``api_key("charge:order-8812", "create-charge") == "charge:order-8812:create-charge"``,
    hashed to fit when the format is shorter or stricter (as Rust's ``ApiKey::derive``)."""
    if isinstance(format, str):
        try:
            format = _FORMATS[format]
        except KeyError:
            raise InvalidFormat(
                f"unknown API key format {format!r}: use 'stripe' or an ApiKeyFormat"
            ) from None
    try:
        return _native.api_key(key, operation, format.max_len, format.alphabet)
    except ValueError as error:
        message = str(error)
        if "alphabet" in message or "idempotency-key format" in message:
            raise InvalidFormat(message) from None
        raise InvalidKey(message) from None


@dataclasses.dataclass(frozen=True)
class Horizon:
    """How long after a key was applied a duplicate of its job can still arrive (seconds)."""

    terms: list[tuple[str, float, str]]
    total: float
    text: str

    def __str__(self) -> str:
        return self.text


def horizon(
    *,
    max_attempts: int,
    base: float,
    max_delay: float,
    jitter: float = 0.0,
    lease: float = 0.0,
    replay_window: float = 0.0,
) -> Horizon:
    """The retention horizon of a retry schedule, as the Rust library computes it: every retry
    delay at its jitter upper bound, one lease (job timeout) per attempt, the declared replay
    window and a replayed job's attempts. Keep guard rows at least this long."""
    terms, total, text = _native.horizon(max_attempts, base, max_delay, jitter, lease, replay_window)
    return Horizon(terms, total, text)


def guard_sql(dialect: str, table: str, schema: str | None = None) -> dict[str, Any]:
    """The guard's statements for ``dialect`` on ``table``: the text the Rust guard runs.
    Built once per table (every guard asks for them); the dict is shared: do not change it."""
    try:
        return _guard_sql(dialect, table, schema)
    except ValueError as error:
        raise InvalidName(str(error)) from None


@functools.lru_cache(maxsize=256)
def _guard_sql(dialect: str, table: str, schema: str | None) -> dict[str, Any]:
    return _native.guard_sql(dialect, table, schema)


def queue_sql(dialect: str, table: str, schema: str | None = None) -> dict[str, Any]:
    """The queue's enqueue statements for ``dialect`` on ``table``: the text the Rust
    ``Queue::enqueue_tx`` runs."""
    try:
        return _queue_sql(dialect, table, schema)
    except ValueError as error:
        raise InvalidName(str(error)) from None


@functools.lru_cache(maxsize=256)
def _queue_sql(dialect: str, table: str, schema: str | None) -> dict[str, Any]:
    return _native.queue_sql(dialect, table, schema)
