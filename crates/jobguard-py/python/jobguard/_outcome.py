"""What a guarded delivery came to: :class:`Applied`, or :class:`Duplicate` with what the
first delivery left."""

from __future__ import annotations

import dataclasses
import datetime as _dt
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Applied(Generic[T]):
    """This delivery applied the key; ``value`` is what the function returned (also stored
    as the key's result when it is not None)."""

    value: T
    applied = True
    duplicate = False


@dataclasses.dataclass(frozen=True)
class Duplicate:
    """An earlier delivery applied the key, at ``first_applied_at``, and stored ``result``
    (``None`` when it stored none). From :func:`jobguard.guarded`, the function was not called;
    from :meth:`Guard.held`, the delivery skips its effect."""

    first_applied_at: _dt.datetime | None
    result: Any
    applied = False
    duplicate = True
