"""The one best-trial rule: the feasible trial with the best objective in the study's direction.

Used by the sweeper's summary (best.yaml, the final table) and by the report, so both always name
the same winner. With confirmation runs (the sweeper's confirm_top), the winner is the config with
the best median over its runs (`best_of_runs`). What counts as feasible is the caller's to say (an
Optuna trial's constraints, or a report row's category); the direction is always the study's own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

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


# --- the median-of-runs rule (hydra.sweeper.confirm_top / confirm_repeats) -------------------------
@dataclass
class Finalist(Generic[T]):
    """One config and every run of it: the original trial and its confirmation runs."""

    item: T  # the original run (the first of its group)
    members: list[T]  # every run, the original first, whatever its outcome
    runs: list[float]  # the finite objective values of those runs, in order
    median: float

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the runs; None with fewer than two runs."""
        if len(self.runs) < 2 or not self.median:
            return None
        return (max(self.runs) - min(self.runs)) / abs(self.median)


def finalists(
    items: Iterable[T], *, value: Callable[[T], float | None], group: Callable[[T], object], direction: object
) -> list[Finalist[T]]:
    """Group runs of the same config (group(item): the trial a confirmation run confirms, else its
    own number) and rank the groups by the median of their finite values, best first.

    When any group has more than one run (confirmation ran), only such groups compete: a config seen
    once was not a finalist, and its single run is not comparable with a median. Ties keep the
    earlier group."""
    groups: dict[object, list[T]] = {}
    for item in items:
        groups.setdefault(group(item), []).append(item)
    built = []
    for members in groups.values():
        runs = [v for m in members if _finite(v := value(m))]
        if runs:
            built.append(Finalist(members[0], members, runs, statistics.median(runs)))
    if any(len(f.members) > 1 for f in built):
        built = [f for f in built if len(f.members) > 1]
    return ranked(built, value=lambda f: f.median, direction=direction)


def best_of_runs(
    items: Iterable[T], *, value: Callable[[T], float | None], group: Callable[[T], object], direction: object
) -> Finalist[T] | None:
    """The winner under the median-of-runs rule (`finalists`), or None when nothing has a value.
    Without confirmation runs it is exactly `best` (each config has one run, its median is its value)."""
    ranked_groups = finalists(items, value=value, group=group, direction=direction)
    return ranked_groups[0] if ranked_groups else None


def within_noise(a: Finalist, b: Finalist) -> bool | None:
    """Whether two finalists' runs overlap (each one's range reaches into the other's); None when
    either ran once only: one run says nothing about its noise."""
    if len(a.runs) < 2 or len(b.runs) < 2:
        return None
    return min(a.runs) <= max(b.runs) and min(b.runs) <= max(a.runs)
