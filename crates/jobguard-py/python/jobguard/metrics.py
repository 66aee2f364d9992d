"""``jobguard_outcomes_total{kind, outcome}`` through prometheus_client, when it is installed:
the series the Rust library records, with the same name and labels (``outcome`` is
``applied``, ``duplicate`` or ``failed``). A steady trickle of duplicates is at-least-once
delivery at work; a spike is mass redelivery, worth a look.

``jobguard_job_retries_total{kind, framework, outcome}`` counts the framework integrations'
retries of a job after a transient failure, once sent (``outcome="retried"``), the jobs given up
after the last retry (``outcome="exhausted"``) and the jobs whose retry could not be sent
(``outcome="lost"``); neither of the last two is applied, each is logged at error with its key:
alert on any.

``jobguard_periodic_firings_total{schedule, outcome}`` counts the Python scheduler's firings, as
the Rust worker does."""

from __future__ import annotations

from typing import Any

OUTCOMES_TOTAL = "jobguard_outcomes_total"

_prometheus: Any
try:
    import prometheus_client as _prometheus
except ImportError:  # pragma: no cover - exercised without the package
    _prometheus = None

_outcomes: Any = None
if _prometheus is not None:
    try:
        _outcomes = _prometheus.Counter(
            "jobguard_outcomes",
            "Guarded job outcomes per kind: applied, duplicate or failed",
            ["kind", "outcome"],
        )
    except ValueError:  # already registered (module reloaded)
        _outcomes = _prometheus.REGISTRY._names_to_collectors.get(OUTCOMES_TOTAL)

_retries: Any = None
if _prometheus is not None:
    try:
        _retries = _prometheus.Counter(
            "jobguard_job_retries",
            "Guarded jobs run again after a transient failure (retried), given up (exhausted), or "
            "whose retry could not be sent (lost)",
            ["kind", "framework", "outcome"],
        )
    except ValueError:  # already registered (module reloaded)
        _retries = _prometheus.REGISTRY._names_to_collectors.get("jobguard_job_retries_total")


# The labelled children, looked up once per (kind, outcome): `labels()` takes a lock and
# builds a tuple on every call, a cost on the guard's path.
_children: dict[tuple[str, str], Any] = {}


def record_outcome(kind: str, outcome: str) -> None:
    """Counts one outcome of a guarded job of ``kind``."""
    if _outcomes is None:
        return
    child = _children.get((kind, outcome))
    if child is None:
        child = _children.setdefault((kind, outcome), _outcomes.labels(kind=kind, outcome=outcome))
    child.inc()


_firings = None
if _prometheus is not None:
    try:
        _firings = _prometheus.Counter(
            "jobguard_periodic_firings",
            "Periodic firings per schedule: enqueued, already_enqueued or missed",
            ["schedule", "outcome"],
        )
    except ValueError:  # already registered (module reloaded)
        _firings = _prometheus.REGISTRY._names_to_collectors.get("jobguard_periodic_firings_total")


def record_firing(schedule: str, outcome: str) -> None:
    """Counts one periodic firing of ``schedule``: ``enqueued``, ``already_enqueued`` (another
    scheduler had) or ``missed``; the Rust worker's ``jobguard_periodic_firings_total``."""
    if _firings is not None:
        _firings.labels(schedule=schedule, outcome=outcome).inc()


def record_retry(kind: str, framework: str, outcome: str) -> None:
    """Counts one retry (``retried``) or one job given up (``exhausted``) of ``kind``."""
    if _retries is not None:
        _retries.labels(kind=kind, framework=framework, outcome=outcome).inc()
