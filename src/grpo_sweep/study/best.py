"""The one best-trial rule: the feasible trial with the best objective in the study's direction.

Used by the sweeper's summary (best.yaml, the final table) and by the report, so both always name
the same winner. What counts as feasible is the caller's to say (an Optuna trial's constraints, or a
report row's category); the direction is always the study's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
DIRECTIONS = ("maximize", "minimize")


def normalize_direction(direction: object) -> str:
    """'maximize' | 'minimize' from a string or Optuna's StudyDirection (MAXIMIZE / MINIMIZE)."""
    name = str(getattr(direction, "name", direction)).lower()
    if name not in DIRECTIONS:
        raise ValueError(f"direction={direction}: must be one of {', '.join(DIRECTIONS)}")
    return name


def sort_key(direction: object) -> Callable[[float], float]:
    """A key that sorts objective values best first."""
    sign = -1.0 if normalize_direction(direction) == "maximize" else 1.0
    return lambda value: sign * value


def best(items: Iterable[T], *, value: Callable[[T], float | None], direction: object) -> T | None:
    """The item with the best finite `value` (None values are not candidates); None when there is none.

    Ties keep the earlier item (the lower trial number)."""
    key = sort_key(direction)
    candidates = [(key(v), i, item) for i, item in enumerate(items) if _finite(v := value(item))]
    return min(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else None


def ranked(items: Iterable[T], *, value: Callable[[T], float | None], direction: object) -> list[T]:
    """Items with a finite value, best first (ties in their original order)."""
    key = sort_key(direction)
    scored = [(key(v), i, item) for i, item in enumerate(items) if _finite(v := value(item))]
    return [item for _, _, item in sorted(scored, key=lambda c: (c[0], c[1]))]


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
