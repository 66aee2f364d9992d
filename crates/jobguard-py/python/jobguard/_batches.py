"""Grouping a fetch's jobs into the transactions the worker runs them in, as the Rust worker's
``worker/group.rs`` does.

A worker with ``batch_size`` above 1 asks a fetch for a batch's worth of jobs per free slot.
When the fetch brings no more jobs than there are free slots, each job runs alone: the worker
has room to spare, and a job waiting for others to fill its batch would only start later. When
it brings more (a backlog), the jobs of kinds defined with ``batch=True`` fill groups of up to
``batch_size`` in fetch order, and every other job makes a group of its own. Groups beyond the
free slots wait for one; the loop fetches again only once slots are free.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def group(jobs: Sequence[T], free: int, batch_size: int,
          batches: Callable[[T], bool]) -> list[list[T]]:
    """``jobs`` in fetch order, as the groups that each run in one transaction."""
    if batch_size <= 1 or len(jobs) <= free:
        return [[job] for job in jobs]
    groups: list[list[T]] = []
    filling: list[T] | None = None
    for job in jobs:
        if not batches(job):
            groups.append([job])
            continue
        if filling is None or len(filling) == batch_size:
            filling = []
            groups.append(filling)
        filling.append(job)
    return groups
