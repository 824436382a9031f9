"""Progress of a long sweep: each finished trial's line says `trial k/N`, the best feasible
objective so far and an estimate of the time left. (A running trial prints its own
`[trial] step i/N` lines: the trial child writes to the sweep's console.)

The estimate is the study's own pace since this worker started: counted trials finished since
then, over the time it took, times the trials still to count. With several workers on one study
that pace is all of theirs together, so the estimate holds for the study, not one worker.
"""

from __future__ import annotations

import datetime
import math
from typing import TYPE_CHECKING

from grpo_sweep.study.attrs import Key, Status

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

    from grpo_sweep.study.best import Finalist


class Progress:
    def __init__(self, n_trials: int, started: datetime.datetime | None = None):
        self.n_trials = n_trials
        self.started = started or datetime.datetime.now()
        self.counted_at_start: int | None = None

    def line(self, counted: int, best: Finalist[FrozenTrial] | None, objective: str, now: datetime.datetime | None = None) -> str:
        """`trial k/N | best <objective>=<v> (trial n) | ~<t> left`.

        Args:
            counted: The study's counted trials.
            best: Its best feasible config (grpo_sweep.study.best.Finalist: the median of its runs, its first
                trial); None: none yet.
            objective: The metric the study optimises.
            now: The time to measure from; None: now.

        Returns:
            The line.
        """
        now = now or datetime.datetime.now()
        if best is None:
            shown_best = "no feasible trial yet"
        else:
            runs = f", median of {len(best.runs)} runs" if len(best.runs) > 1 else ""
            shown_best = f"best {objective}={_num(best.median)} (trial {best.item.number}{runs})"
        left = self.time_left(counted, now)
        eta = "" if left is None else f" | ~{_duration(left)} left"
        # Confirmation may run past n_trials while confirm_budget allows (confirm.py): said, not hidden.
        past = f" (+{counted - self.n_trials} confirmation runs within confirm_budget)" if counted > self.n_trials else ""
        return f"trial {min(counted, self.n_trials)}/{self.n_trials}{past} | {shown_best}{eta}"

    def start(self, counted: int) -> None:
        """Record how many trials the study held when this worker started (a resumed sweep)."""
        self.counted_at_start = counted

    def time_left(self, counted: int, now: datetime.datetime) -> float | None:
        """Seconds left at the pace since start; None before any trial finished since then."""
        done_here = counted - (self.counted_at_start or 0)
        if done_here <= 0:
            return None
        remaining = max(0, self.n_trials - counted)
        return (now - self.started).total_seconds() / done_here * remaining


def _num(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def counts(study: Study) -> tuple[int, list[int]]:
    """(trials that count toward n_trials, numbers of RUNNING trials).

    Counted: COMPLETE, PRUNED, and FAIL unless the failure was retried (a killed worker's or an
    interrupted trial: its re-run counts instead) or the trial was a surplus never run.
    """
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    retried = {n for t in trials for n in (t.system_attrs.get(Key.RETRY_HISTORY) or [])}
    counted = 0
    for t in trials:
        finished = t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        failed_for_good = (
            t.state == TrialState.FAIL and t.number not in retried and t.user_attrs.get(Key.STATUS) != Status.SURPLUS
        )
        if finished or failed_for_good:
            counted += 1
    running = sorted(t.number for t in trials if t.state == TrialState.RUNNING)
    return counted, running


def room(study: Study, target: int) -> int:
    """Trials still to start before the study counts `target`: not counted, running or queued yet."""
    counted, running = counts(study)
    waiting = sum(t.state.name == "WAITING" for t in study.get_trials(deepcopy=False))
    return target - counted - len(running) - waiting
