"""The one best-trial rule: the feasible trial with the best objective in the study's direction.

Used by the sweeper's summary (best.yaml, the final table) and by the report, so both always name
the same winner. A config run more than once (the sampler asked for it again, or the sweeper's
confirm_top confirmed it) counts by the median over its runs (`finalists`). What
counts as feasible is the caller's to say (an Optuna trial's constraints, or a report row's
category); the direction is always the study's own. The noise the study measured (`relative_noise`)
says whether the leader is separated from the others (`within_noise`); when it is not, the configs
within its noise tie, and among those the study can call within 5 % of the leader (`indifferent`)
the one with the most memory headroom wins, else the best median (`decide`, `Verdict`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeGuard, TypeVar

from .attrs import ConfirmationState, Key

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

    Ties keep the earlier item (the lower trial number).

    Args:
        items: The candidates, in trial order.
        value: An item's objective value; None or a non-finite value is no candidate.
        direction: "maximize" or "minimize" (or Optuna's StudyDirection).

    Returns:
        The best item, or None.
    """
    key = sort_key(direction)
    candidates = [(key(v), i, item) for i, item in enumerate(items) if _finite(v := value(item))]
    return min(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else None


def ranked(items: Iterable[T], *, value: Callable[[T], float | None], direction: object) -> list[T]:
    """Items with a finite value, best first (ties in their original order).

    Args:
        items: The candidates, in trial order.
        value: An item's objective value; None or a non-finite value is left out.
        direction: "maximize" or "minimize" (or Optuna's StudyDirection).

    Returns:
        The items with a finite value, best first.
    """
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
CONFIRMS_ATTR = Key.CONFIRMS  # a confirmation run: the config's first trial
REPEATS_ATTR = Key.REPEATS  # a search trial the sampler asked for again: the config's first trial


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
    state = ConfirmationState.from_dict(study_user_attrs.get(Key.CONFIRMATION))
    return list(state.finalists) if state and state.finalists else None


def gave_back(stored: dict | None) -> bool:
    """Whether confirmation (`stored`: the study's Key.CONFIRMATION), undecidable or unaffordable
    before its first round, gave its reserved runs back to the search: it ran nothing, and every
    config competes by its median."""
    state = ConfirmationState.from_dict(stored)
    return bool(state and state.given_back)


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

    Args:
        items: The runs, in trial order.
        value: A run's objective value; None or a non-finite value is left out.
        group: A run's config (`config_group`); runs of one config form one group.
        direction: "maximize" or "minimize" (or Optuna's StudyDirection).
        compete: The groups the confirmation phase chose (the study's Key.CONFIRMATION finalists).
            Only they compete once it exists, so a config seen once with a lucky run cannot beat a
            confirmed median. None (no confirmation): every config competes with the median of its
            runs (one run: that run).

    Returns:
        The competing groups, best median first.
    """
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


# --- noise and ties: the one rule the confirmation phase, the summary and the report share ---------
# The noise is measured on the study itself: every config run more than once gives its runs' sample
# variance relative to their mean, and those pool over configs by their degrees of freedom (n - 1
# each), so two runs of three configs tell as much as four runs of one. With 2-3 runs per config a
# single config's spread is itself very noisy; the pooled estimate is not, and the floor keeps one
# lucky pair of equal runs from claiming a precision no shared machine has.
NOISE_FLOOR = 0.02  # relative standard deviation never taken below 2 % of the median
INTERVAL_Z = 2.0  # a config's interval: median +- 2 sigma / sqrt(runs) (about 95 % for normal noise)


def relative_noise(groups: Iterable[Finalist]) -> tuple[float | None, int]:
    """(the pooled relative standard deviation of runs of one config, floored at NOISE_FLOOR, or None
    when no config ran twice; the number of configs it pools)."""
    squares, dof, configs = 0.0, 0, 0
    for f in groups:
        if len(f.runs) < 2:
            continue
        mean = statistics.fmean(f.runs)
        if not mean:
            continue
        squares += sum((v / mean - 1.0) ** 2 for v in f.runs)
        dof += len(f.runs) - 1
        configs += 1
    if not dof:
        return None, 0
    return max(NOISE_FLOOR, math.sqrt(squares / dof)), configs


def interval(f: Finalist, sigma: float, more: float = 0.0) -> tuple[float, float]:
    """The range a config's true median lies in at the measured noise: median +- Z sigma |median| / sqrt(n).

    Args:
        f: The config and its runs.
        sigma: The study's relative noise (a run's spread over its median).
        more: Extra runs at the same median: the interval they would give (what a budget could buy).

    Returns:
        (low, high) of the interval.
    """
    half = INTERVAL_Z * sigma * abs(f.median) / math.sqrt(len(f.runs) + more)
    return f.median - half, f.median + half


def within_noise(a: Finalist, b: Finalist, sigma: float | None, more: float = 0.0) -> bool | None:
    """Whether two configs' intervals overlap (neither is separated from the other); None when the
    study has measured no noise yet (no config ran twice): nothing can be said.

    Args:
        a: One config and its runs.
        b: The other.
        sigma: The study's relative noise, or None when none is measured.
        more: Extra runs of each at the same medians (see `interval`).

    Returns:
        True when the intervals overlap, False when they are apart, None without noise.
    """
    if sigma is None:
        return None
    lo_a, hi_a = interval(a, sigma, more)
    lo_b, hi_b = interval(b, sigma, more)
    return lo_a <= hi_b and lo_b <= hi_a


# The indifference zone: the leader's median is the study's best estimate of the best config, and a
# finalist whose whole interval lies within 5 % of it is, by the same interval rule, at most 5 % off
# it: as good a pick for the user (the search's own goal is a config within 5 % of the best), so a run
# that could only tell the two apart is not worth its seconds.
INDIFFERENCE = 0.05


def indifferent(leader: Finalist, other: Finalist, sigma: float | None, zone: float = INDIFFERENCE, more: float = 0.0) -> bool:
    """Whether the study can tell that `other` is within `zone` of `leader`: both ends of other's
    interval lie within zone x |leader's median| of that median. False when no noise is measured
    (nothing can be said).

    Args:
        leader: The config with the best median.
        other: The config compared with it.
        sigma: The study's relative noise, or None when none is measured.
        zone: The share of the leader's median that counts as "as good".
        more: Extra runs of `other` at the same median (see `interval`).

    Returns:
        Whether other's whole interval lies within the zone.
    """
    if sigma is None:
        return False
    lo, hi = interval(other, sigma, more)
    return max(abs(lo - leader.median), abs(hi - leader.median)) <= zone * abs(leader.median)


def decidable(leader: Finalist, other: Finalist, sigma: float, more: float, zone: float = INDIFFERENCE) -> bool:
    """Whether `more` runs of each, at the medians and the noise measured now, would separate the two
    or show `other` within `zone` of the leader: if not, spending them cannot settle the pair
    (the medians may still move, but the study could not tell that they had).

    Args:
        leader: The config with the best median.
        other: The config compared with it.
        sigma: The study's relative noise.
        more: Extra runs of each.
        zone: The indifference zone, a share of the leader's median.

    Returns:
        Whether those runs could settle the pair.
    """
    return within_noise(leader, other, sigma, more) is False or indifferent(leader, other, sigma, zone, more)


def memory_used(
    f: Finalist, peak_of: Callable[[T], object], budget_of: Callable[[T], object]
) -> tuple[float | None, float | None]:
    """The config's largest peak over its runs, and that peak's share of the budget.

    Args:
        f: The config and its runs.
        peak_of: A run's peak memory in bytes (None or non-finite: unknown).
        budget_of: A run's budget in bytes (None, 0 or non-finite: unknown).

    Returns:
        (peak bytes, share of the budget); None where unknown.
    """
    peaks = [p for m in f.members if _finite(p := peak_of(m))]
    budgets = [b for m in f.members if _finite(b := budget_of(m)) and b > 0]
    if not peaks:
        return None, None
    peak = max(peaks)
    return peak, (peak / budgets[0] if budgets else None)


@dataclass
class Verdict(Generic[T]):
    """Who wins, and how sure the study is. `by_median`: the configs best median first; `leader` its
    first. `tie`: the leader and every config within its noise (empty when the leader is separated
    or no noise is measured). `close`: the leader and the tied configs the study can call within
    INDIFFERENCE of it (`indifferent`); empty unless there are two. `winner`: the leader, or, when
    `close` holds two or more, the one of them with the most memory headroom (the smallest share of
    the budget at its worst run's peak; bytes where no budget is known): they are as good a pick as
    each other, so the safer one for a long run wins. A tied config not shown to be within
    INDIFFERENCE may be that much slower: the best median wins over it (at a noise of 20 % the
    headroom among every tied config would pick the slower, leaner config as often as not).
    `ranked`: by_median with the winner moved first (what best.yaml and the report list).
    With `flagged` (decide): a config with a run that changed the learning competes only when every
    config does; `passed_over` the flagged configs ranked above the winner, `winner_flagged` when
    every competing config was flagged and the best won anyway."""

    by_median: list[Finalist[T]]
    sigma: float | None
    noise_configs: int
    tie: list[Finalist[T]]
    winner: Finalist[T] | None
    used: dict[int, tuple[float | None, float | None]]  # id(finalist) -> memory_used
    close: list[Finalist[T]] = field(default_factory=list)
    passed_over: list[Finalist[T]] = field(default_factory=list)
    winner_flagged: bool = False
    zone: float = INDIFFERENCE  # the indifference zone the verdict used (hydra.sweeper.indifference)
    agreed: bool = False  # `close` is the configs whose runs and model agreed within the zone (no noise needed)

    @property
    def leader(self) -> Finalist[T] | None:
        return self.by_median[0] if self.by_median else None

    @property
    def ranked(self) -> list[Finalist[T]]:
        if self.winner is None:
            return []
        return [self.winner, *(f for f in self.by_median if f is not self.winner)]

    def memory(self, f: Finalist[T]) -> tuple[float | None, float | None]:
        """memory_used of one of the ranked configs: (worst peak bytes, its share of the budget)."""
        return self.used.get(id(f), (None, None))

    def unseparated(self) -> list[Finalist[T]]:
        """The configs the leader is not yet separated from: within its noise, or unknown (no noise measured)."""
        if self.leader is None:
            return []
        return [f for f in self.by_median[1:] if within_noise(self.leader, f, self.sigma) is not False]

    def undecided(self) -> list[Finalist[T]]:
        """The unseparated configs the study cannot yet call as good as the leader (`indifferent`): the
        ones a run could still turn into a better or a worse pick."""
        leader = self.leader
        return [f for f in self.unseparated() if leader is None or not indifferent(leader, f, self.sigma, self.zone)]


def decide(
    items: Iterable[T],
    *,
    value: Callable[[T], float | None],
    group: Callable[[T], object],
    direction: object,
    compete: Collection[object] | None = None,
    peak_of: Callable[[T], object] = lambda _: None,
    budget_of: Callable[[T], object] = lambda _: None,
    flagged: Callable[[T], bool] | None = None,
    zone: float = INDIFFERENCE,
    agreed: Collection[object] | None = None,
) -> Verdict[T]:
    """The verdict over `items` (see Verdict): the noise measured on every config of the study, the
    competing configs ranked, the tie around the leader, its winner. The leader, its tie and the
    winner are chosen among the configs none of whose runs is flagged; only when every competing
    config is flagged do they all compete (`winner_flagged`).

    Args:
        items: The runs, in trial order.
        value: A run's objective value; None or a non-finite value is left out.
        group: A run's config (`config_group`).
        direction: "maximize" or "minimize" (or Optuna's StudyDirection).
        compete: The groups that compete, as in `finalists`; None: every config.
        peak_of: A run's peak memory in bytes.
        budget_of: A run's budget in bytes.
        flagged: Whether a run changed the learning (grpo_sweep.report.learning.check_trials);
            None: no run did.
        zone: The indifference zone, a share of the leader's median.
        agreed: The configs (groups) whose runs and forecast agreed within the zone of the
            leader's (confirmation's `agreed`): with the leader they are `close` without a measured noise.

    Returns:
        The Verdict.
    """
    items = list(items)
    every = finalists(items, value=value, group=group, direction=direction)
    sigma, configs = relative_noise(every)
    ranked_ = every if compete is None else finalists(items, value=value, group=group, direction=direction, compete=compete)
    if not ranked_:
        return Verdict([], sigma, configs, [], None, {})
    used = {id(f): memory_used(f, peak_of, budget_of) for f in ranked_}
    marked = [f for f in ranked_ if flagged is not None and any(flagged(m) for m in f.members)]
    field_ = [f for f in ranked_ if not any(f is m for m in marked)] or ranked_
    every_flagged = bool(marked) and len(marked) == len(ranked_)

    def settled(tie: list[Finalist[T]], winner: Finalist[T], close: list[Finalist[T]] | None = None) -> Verdict[T]:
        above = [] if every_flagged else ranked_[: next(i for i, f in enumerate(ranked_) if f is winner)]
        passed = [f for f in above if any(f is m for m in marked)]
        return Verdict(ranked_, sigma, configs, tie, winner, used, close or [], passed, every_flagged, zone, agreeing)

    leader = field_[0]
    shown = set(agreed or ())
    agreeing = bool(shown) and group(leader.item) in shown
    tie = [f for f in field_ if f is leader or within_noise(leader, f, sigma) or (agreeing and group(f.item) in shown)]
    if len(tie) < 2:
        return settled([], leader)
    close = [f for f in tie if f is leader or indifferent(leader, f, sigma, zone) or (agreeing and group(f.item) in shown)]
    if len(close) < 2:
        return settled(tie, leader)
    by_share = all(used[id(f)][1] is not None for f in close)

    def risk(f: Finalist) -> float:
        peak, share = used[id(f)]
        known = share if by_share else peak
        return known if known is not None else math.inf  # an unmeasured peak never counts as safer

    winner = min(close, key=lambda f: (risk(f), close.index(f)))  # equal headroom: the better median
    return settled(tie, winner, close)
