"""The one best-trial rule: the feasible trial with the best objective in the study's direction.

Used by the sweeper's summary (best.yaml, the final table) and by the report, so both always name
the same winner. A config run more than once (the sampler asked for it again, or the sweeper's
confirm_top confirmed it) counts by the median over its runs (`finalists`, `best_of_runs`). What
counts as feasible is the caller's to say (an Optuna trial's constraints, or a report row's
category); the direction is always the study's own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Generic, TypeGuard, TypeVar

T = TypeVar("T")
N = TypeVar("N")
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


def _finite(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --- the median-of-runs rule (hydra.sweeper.confirm_top / confirm_repeats) -------------------------
# A config is one point of the search space: every run of it (the search's first run, the search
# asking for the same point again, the confirmation runs) joins one group, keyed by the number of
# the config's first trial. The sweeper writes these trial user attributes; the summary and the
# report read them through config_group, so both group the same way.
CONFIRMS_ATTR = "confirms"  # a confirmation run: the config's first trial
REPEATS_ATTR = "repeats"  # a search trial the sampler asked for again: the config's first trial
PLAN_ATTR = "confirmation"  # study user attr: {"finalists": [first trials], "runs": [...]}


def config_group(attrs: dict, number: N) -> int | N:
    """The group of a trial with user attributes `attrs`: the config's first trial (its number, an
    int), else `number` (the trial's own; the report passes a run's name where it has no number)."""
    for name in (CONFIRMS_ATTR, REPEATS_ATTR):
        if attrs.get(name) is not None:
            return attrs[name]
    return number


def competing(study_user_attrs: dict) -> list | None:
    """The configs (first trials) the confirmation phase chose: only they compete for best once it
    has chosen; None before it, or when it was off or skipped (every config competes)."""
    chosen = (study_user_attrs.get(PLAN_ATTR) or {}).get("finalists")
    return list(chosen) if chosen else None


@dataclass
class Finalist(Generic[T]):
    """One config and every run of it: the search's runs and its confirmation runs."""

    item: T  # the config's first run with a value (the trial best.yaml and the report name)
    members: list[T]  # every run, the first first, whatever its outcome
    runs: list[float]  # the finite objective values of those runs, in order
    median: float

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the runs; None with fewer than two runs."""
        if len(self.runs) < 2 or not self.median:
            return None
        return (max(self.runs) - min(self.runs)) / abs(self.median)


def finalists(
    items: Iterable[T],
    *,
    value: Callable[[T], float | None],
    group: Callable[[T], object],
    direction: object,
    compete: Collection[object] | None = None,
) -> list[Finalist[T]]:
    """Group runs of the same config (group(item), see config_group) and rank the groups by the
    median of their finite values, best first. Ties keep the earlier group.

    compete: the groups the confirmation phase chose (the study's PLAN_ATTR finalists); only they
    compete once it exists, so a config seen once with a lucky run cannot beat a confirmed median.
    None (no confirmation): every config competes with the median of its runs (one run: that run)."""
    groups: dict[object, list[T]] = {}
    for item in items:
        groups.setdefault(group(item), []).append(item)
    built = []
    for key, members in groups.items():
        if compete is not None and key not in compete:
            continue
        valued = [(m, v) for m in members if _finite(v := value(m))]
        if valued:
            runs = [v for _, v in valued]
            built.append(Finalist(valued[0][0], members, runs, statistics.median(runs)))
    return ranked(built, value=lambda f: f.median, direction=direction)


def best_of_runs(
    items: Iterable[T], *, value: Callable[[T], float | None], group: Callable[[T], object], direction: object
) -> Finalist[T] | None:
    """The winner under the median-of-runs rule (`finalists`, every config competing), or None when
    nothing has a value. With every config run once it is exactly `best` (its median is its value)."""
    ranked_groups = finalists(items, value=value, group=group, direction=direction)
    return ranked_groups[0] if ranked_groups else None


def within_noise(a: Finalist, b: Finalist) -> bool | None:
    """Whether two finalists' runs overlap (each one's range reaches into the other's); None when
    either ran once only: one run says nothing about its noise."""
    if len(a.runs) < 2 or len(b.runs) < 2:
        return None
    return min(a.runs) <= max(b.runs) and min(b.runs) <= max(a.runs)
