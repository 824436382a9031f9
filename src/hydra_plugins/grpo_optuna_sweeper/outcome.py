"""A trial's metrics.json -> what Optuna is told: state, objective value, the memory constraint, attributes.

- ok: COMPLETE with the objective; the memory constraint (tell_constraint) = peak - allowed (<= 0 fits;
  0 when there is no budget or no device-comparable peak: it ran without OOM).
- oom: COMPLETE but infeasible: constraint = the deficit (bytes over the budget), so constraint-aware
  samplers (TPE, GP, NSGA-II read `trial.constraints` in Optuna 5) learn where the wall is. The value
  is the worst possible (0 tokens/s when maximising): an OOM produced nothing.
- slow (stopped early by trial.stop_below, the sweeper's early stop): PRUNED with its partial
  throughput (the last intermediate value) and its measured peak's constraint: neither an OOM nor a
  failure. A sampler blind to PRUNED (GP) is told COMPLETE at the partial throughput instead.
- failed / timeout / no metrics: FAIL, the reason in user attributes (samplers ignore FAIL trials).
- pre-screened (the estimator predicts over budget by more than the margin): PRUNED without running,
  with the predicted deficit as its constraint (TPE ranks infeasible PRUNED trials by it too). A
  sampler that learns from COMPLETE trials only (Optuna's GPSampler) is told COMPLETE at the worst
  value instead (`for_sampler`): told PRUNED, it never learns and proposes the same point again.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard, overload

from grpo_sweep.memory.oom_message import parse_oom_message
from grpo_sweep.memory.throughput import SPEED_KEYS
from grpo_sweep.study.attrs import Key, Status
from grpo_sweep.units import GIB

from . import handles

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial, Trial

# A metrics.json record as read (grpo_sweep.metrics.TrialMetrics) or built by a test.
Record = Mapping[str, Any]

CONSTRAINT = "memory_over_budget_bytes"
# The memory constraint is stored in the list form `system_attrs["constraints"] = [bytes over]`:
# optuna-dashboard (0.21) reads only that form (not the named `constraints:<name>` one Optuna 5's
# trial.set_constraint writes: our OOM trials showed there as ordinary trials with value 0), and
# Optuna 5 reads it as one constraint (named "0"). One form, not both: GPSampler fits one model per
# constraint and requires the same number on every trial, so both forms would double the model and
# break a study resumed from trials that have one. memory_constraint() reads either form.
DASHBOARD_CONSTRAINTS = Key.CONSTRAINTS
SAMPLERS_BLIND_TO_PRUNED = ("gp",)  # optuna.samplers.GPSampler fits on COMPLETE trials only
RECORD_ATTRS = (
    "tokens_per_s",
    "samples_per_s",
    "step_time_s",
    "reward_mean",
    "reward_first",
    "reward_last",
    "reward_change",
    "reward_seconds_per_step",
    "peak_memory_bytes",
    "world_size",  # a trial of N processes (trial.num_processes): the peak above is its largest rank's
    "strategy",
    "rank_peak_memory_bytes",
    "memory_source",
    "trainable_params",
    "device",
    "backend",
    "wall_time_s",
    "run_dir",
    "wandb_run_id",
    "deficit_bytes",
    "peak_phase",  # calibration.py: the phase whose prediction the measured peak corrects
    *SPEED_KEYS,  # the step's phases and its distance from the card's limit (memory/throughput.py speed_record)
)


@dataclass
class Outcome:
    state: str  # COMPLETE | FAIL | PRUNED (optuna.trial.TrialState names)
    value: float | None = None
    constraint: float | None = None  # > 0: infeasible
    attrs: dict = field(default_factory=dict)


def worst_value(direction: str) -> float:
    return 0.0 if direction == "maximize" else math.inf


def allowed_bytes(budget_bytes: float | None, headroom: float | None) -> float | None:
    if budget_bytes is None:
        return None
    return budget_bytes * (headroom if headroom is not None else 1.0)


def comparable(record: Record) -> bool:
    """Whether the measured peak is device memory (CUDA, or the CPU tensor tracker on a simulated card).

    Process RSS on CPU includes the whole Python/torch runtime (~0.4 GiB), so it says nothing about
    whether the tensors would fit a card: such trials are feasible (they did not OOM), constraint 0.
    """
    return not str(record.get("memory_source") or "").startswith("cpu-rss")


def oom_deficit(record: Record, budget_bytes: float | None) -> tuple[float, str]:
    """Bytes over the budget for an OOM trial, and how that number was obtained."""
    for source in (record, record.get("oom") or {}):
        deficit = source.get("deficit_bytes")
        if _number(deficit) and deficit > 0:
            return float(deficit), "metrics"
    parsed = parse_oom_message(record.get("error") or "")
    if parsed.get("deficit_bytes"):
        return float(parsed["deficit_bytes"]), "oom message"
    peak = record.get("peak_memory_bytes")
    if budget_bytes is not None and _number(peak) and peak > budget_bytes:
        return float(peak - budget_bytes), "peak - budget"
    if parsed.get("requested_bytes"):
        return float(parsed["requested_bytes"]), "requested allocation"
    return 1.0, "unknown (OOM with no sizes: marked just infeasible)"


def judge(
    record: Record | None, *, objective: str, direction: str, budget_bytes: float | None, headroom: float | None
) -> Outcome:
    """Turn one trial's metrics.json record into what the study is told.

    Args:
        record: The trial's record, or None when it wrote none.
        objective: The metric the study optimises.
        direction: "minimize" or "maximize".
        budget_bytes: The memory budget, or None.
        headroom: The fraction of the budget a peak may use, or None.

    Returns:
        The trial's Outcome.
    """
    if record is None:
        return Outcome("FAIL", attrs={Key.STATUS: Status.FAILED, Key.ERROR: "the job left no metrics.json"})
    attrs = {key: record.get(key) for key in RECORD_ATTRS if record.get(key) is not None}
    attrs[Key.STATUS] = status = record.get("status")
    if record.get("error"):
        attrs[Key.ERROR] = str(record["error"])[:1000]
    if isinstance(record.get("levers"), dict):
        attrs[Key.LEVERS] = record["levers"]
    allowed = allowed_bytes(budget_bytes, headroom)
    peak = record.get("peak_memory_bytes")
    if status == Status.OK:
        value = record.get(objective)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            attrs[Key.ERROR] = f"objective {objective!r} is not a number in metrics.json: {value!r}"
            attrs[Key.STATUS] = Status.FAILED  # a FAIL is never counted ok or feasible (summary, report)
            return Outcome("FAIL", attrs=attrs)
        # Every COMPLETE trial carries the constraint (GPSampler requires the same constraints on all).
        # It ran without OOM, so when its peak cannot be compared with the card it is feasible: 0.
        constraint = 0.0
        if allowed is not None and _number(peak) and comparable(record):
            constraint = float(peak - allowed)
        return Outcome("COMPLETE", float(value), constraint, attrs)
    if status == Status.OOM:
        deficit, how = oom_deficit(record, budget_bytes)
        attrs[Key.DEFICIT_BYTES], attrs[Key.DEFICIT_SOURCE] = deficit, how
        if budget_bytes is not None and allowed is not None:
            deficit += budget_bytes - allowed  # with headroom, the wall is `allowed`, not the card
        return Outcome("COMPLETE", worst_value(direction), deficit, attrs)
    if status == Status.SLOW:
        value = record.get(objective)
        constraint = 0.0
        if allowed is not None and _number(peak) and comparable(record):
            constraint = float(peak - allowed)
        return Outcome("PRUNED", float(value) if _number(value) else None, constraint, attrs)
    attrs.setdefault(Key.ERROR, f"trial status {status!r}")
    return Outcome("FAIL", attrs=attrs)


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def timed_steps(record: Record | None, objective: str) -> list[tuple[int, float]]:
    """(step, value) for each timed step of a trial (its history after the warm-up step): what the
    sweeper reports to Optuna as intermediate values. Only for an objective the history carries; a step
    that trained a generation again (no new `tokens`, num_iterations) has no tokens/s of its own."""
    rows = (record or {}).get("history") or []
    reused = {i for i, r in enumerate(rows) if i and r.get("tokens") == 0 and objective == "tokens_per_s"}
    return [
        (int(r["step"]), float(r[objective]))
        for i, r in enumerate(rows)
        if i and i not in reused and _number(r.get(objective)) and "step" in r
    ]


def stop_threshold(best_value: float | None, stop_below: float | None, objective: str, direction: str) -> float | None:
    """trial.stop_below for the next trial, or None (off, no feasible trial yet, or an objective the
    speed meter cannot watch: tokens_per_s, maximize).

    Args:
        best_value: The best feasible value so far, or None.
        stop_below: The fraction of it below which a trial stops, or None.
        objective: The metric the study optimises.
        direction: "minimize" or "maximize".

    Returns:
        stop_below x best_value, or None.
    """
    if not stop_below or objective != "tokens_per_s" or direction != "maximize" or not _number(best_value):
        return None
    return float(stop_below) * float(best_value)


def prescreen_verdict(
    predicted_bytes: float, limit_bytes: float | None, margin: float, *, raw_bytes: float | None = None, trials: int = 0
) -> Outcome | None:
    """PRUNED (never run) when the estimate exceeds the budget by more than `margin`; else None: run it.

    Args:
        predicted_bytes: The calibrated prediction once `trials` measured trials back it, else the raw one.
        limit_bytes: The budget, or None (nothing is pruned).
        margin: The prediction's allowance (calibration.py), else the fixed prescreen_margin.
        raw_bytes: The estimator's own prediction, recorded beside the calibrated one.
        trials: The measured trials behind the calibration.

    Returns:
        The PRUNED Outcome, or None.
    """
    if limit_bytes is None or predicted_bytes <= limit_bytes * (1 + margin):
        return None
    deficit = float(predicted_bytes - limit_bytes)
    if trials and raw_bytes is not None:
        why = (
            f"calibrated prediction {predicted_bytes / GIB:.3f} GiB (raw {raw_bytes / GIB:.3f} GiB x "
            f"{predicted_bytes / raw_bytes:.3f}, from {trials} measured trials) > budget {limit_bytes / GIB:.3f} GiB "
            f"+ {margin:.1%} allowance: not run"
        )
    else:
        why = f"predicted {predicted_bytes / GIB:.2f} GiB > budget {limit_bytes / GIB:.2f} GiB + {margin:.0%} margin: not run"
    return Outcome(
        "PRUNED",
        constraint=deficit,
        attrs={Key.STATUS: Status.PRUNED, Key.DEFICIT_BYTES: deficit, Key.DEFICIT_SOURCE: "estimator", Key.ERROR: why},
    )


def tell_constraint(trial: "Trial", value: float) -> None:
    """Record the memory constraint (bytes over the allowed memory; > 0 infeasible) on an Optuna
    trial, in the one form both Optuna's samplers and optuna-dashboard read (see above)."""
    trial.storage.set_trial_system_attr(handles.trial_id(trial), DASHBOARD_CONSTRAINTS, [float(value)])


def memory_constraint(frozen: "FrozenTrial") -> float | None:
    """A finished trial's memory constraint, whichever form it was written in (None: not told)."""
    constraints = frozen.constraints
    return constraints.get(CONSTRAINT, constraints.get("0"))


@overload
def for_sampler(outcome: Outcome, sampler: str, direction: str) -> Outcome: ...
@overload
def for_sampler(outcome: None, sampler: str, direction: str) -> None: ...
@overload
def for_sampler(outcome: Outcome | None, sampler: str, direction: str) -> Outcome | None: ...
def for_sampler(outcome: Outcome | None, sampler: str, direction: str) -> Outcome | None:
    """A pre-screen verdict as `sampler` can learn from it (see the module docstring).

    Args:
        outcome: The verdict, or None.
        sampler: The sampler's name.
        direction: "minimize" or "maximize".

    Returns:
        The Outcome to tell, or None.
    """
    if outcome is None or outcome.state != "PRUNED" or sampler not in SAMPLERS_BLIND_TO_PRUNED:
        return outcome
    if outcome.attrs.get(Key.STATUS) == Status.SLOW:  # measured, just slower: the partial value is real
        return Outcome(
            "COMPLETE", outcome.value if outcome.value is not None else worst_value(direction), outcome.constraint, outcome.attrs
        )
    return Outcome("COMPLETE", worst_value(direction), outcome.constraint, outcome.attrs)
