"""One trial before it runs: its point suggested, composed and checked, and the pre-screen's verdict.

`prepare` decides and returns a Prepared; the caller records `Prepared.attrs` on the trial in one
call (`apply`) whether the trial runs or not. One exception, written by `prepare` itself before
anything slow (composing, checking, estimating): the trial's point. Who runs the trial is written
earlier still, by the loop right after `study.ask()`: a worker killed while it prepares leaves the
trial RUNNING with no heartbeat yet, and the next run finds that worker dead and releases the trial
at once (workers.fail_dead_workers) instead of waiting out grace_period.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from grpo_sweep.config.local import validate_here
from grpo_sweep.levers import recipe_of, requested_levers
from grpo_sweep.memory.vllm import check_kv_cache_bytes
from grpo_sweep.study.attrs import Key, Status
from grpo_sweep.units import budget_bytes

from . import concessions, confirm, handles, space
from .forecast import predicted_tokens_per_s
from .launch_config import HYDRA_OVERRIDES_ATTR
from .outcome import Outcome, stop_threshold
from .plan import SweepPlan, cached
from .prescreen import Prescreen
from .standings import best_finalist
from .start import outside_space

if TYPE_CHECKING:
    from optuna.trial import Trial


@dataclass(frozen=True)
class Prepared:
    overrides: list[str]  # the job's command line (the point, and the trial's own settings)
    attrs: dict[str, Any]  # user attributes to record on the trial
    outcome: Outcome | None  # what to tell instead of running it (invalid, pruned, dropped); None: run it

    def apply(self, trial: Trial) -> None:
        for key, value in self.attrs.items():
            trial.set_user_attr(key, value)


def prepare(trial: Trial, plan: SweepPlan, prescreen: Prescreen, compose: Callable[[list[str]], DictConfig]) -> Prepared:
    """Suggest the point, compose and check it.

    Args:
        trial: The trial asked.
        plan: The sweep's plan.
        prescreen: The pre-screen that judges the point.
        compose: A job's config for overrides.

    Returns:
        The job's overrides and attributes, with an Outcome when it must not run (invalid, pruned).
    """
    attrs: dict[str, Any] = {}
    preset = trial.user_attrs.get(Key.PRESET)
    enqueued = handles.fixed_params(trial)
    outside = None if preset else outside_space(plan, enqueued)
    if outside:  # queued by an earlier run of this study under another held recipe: not a point of this search
        return Prepared(
            [], attrs, Outcome("FAIL", attrs={Key.STATUS: Status.SURPLUS, Key.ERROR: f"start point dropped: {outside}"})
        )
    params = {}
    for key, dist in plan.distributions.items():
        if preset and key not in enqueued:
            continue  # a preset trial runs the preset's own value for levers outside the space
        params[key] = handles.suggest(trial, key, dist)
    point = list(plan.fixed)  # what `python train.py ...` needs to run this point again
    if preset:
        point.append(f"preset={preset}")
    point += [space.to_override(k, v) for k, v in params.items()]
    overrides = point + [
        space.to_override("trial.study", plan.settings.study_name),
        f"trial.number={trial.number}",
        f"hydra.sweep.subdir=trial_{trial.number:04d}",
    ]
    early: dict[str, Any] = {}
    overrides += _stop_override(trial, plan, early)
    early[confirm.OVERRIDES_ATTR] = point
    if plan.hydra_overrides:
        early[HYDRA_OVERRIDES_ATTR] = list(plan.hydra_overrides)
    if trial.user_attrs.get(confirm.CONFIRMS_ATTR) is None:
        first = confirm.repeat_of(trial.study, trial, point)  # the same point again: its runs pool with the first's
        if first is not None:
            early[confirm.REPEATS_ATTR] = first
    Prepared([], early, None).apply(trial)  # before anything slow: see the module docstring
    cfg = None
    try:
        # The job's config without its `hydra` node does not depend on the hydra.* overrides (the
        # trial's subdir), so they stay out of its key in the sweep's cache: every point of one set
        # of group choices is a copy of one composition (plan.Composer.configs).
        cfg = cached(compose).config([o for o in overrides if not o.startswith("hydra.")])
        validate_here(cfg)  # resolves the split (gradient_accumulation_steps from completions_per_step)
        check_kv_cache_bytes(cfg)
    except Exception as err:  # noqa: BLE001 - an invalid point is a FAIL, not a dead sweep
        if cfg is not None:
            attrs[Key.LEVERS] = requested_levers(cfg)
        return Prepared(overrides, attrs, Outcome("FAIL", attrs={Key.STATUS: Status.INVALID, Key.ERROR: str(err)[:1000]}))
    attrs[Key.LEVERS] = requested_levers(cfg)
    recipe = recipe_of(cfg)
    taken = concessions.diff(plan.recipe, recipe)
    attrs[concessions.TAKEN_ATTR] = taken
    attrs[concessions.CPS] = recipe[concessions.CPS]
    refused = plan.refusal(recipe)
    if refused:
        return Prepared(overrides, attrs, Outcome("FAIL", attrs={Key.STATUS: Status.INVALID, Key.ERROR: f"{refused}: not run"}))
    budget = budget_bytes(cfg)
    if budget is not None:
        attrs[Key.BUDGET_BYTES] = budget
    speed = predicted_tokens_per_s(cfg)
    if speed is not None:  # recorded with the pre-screen off too: the report ranks the trials by it
        attrs[Key.PREDICTED_TOKENS_PER_S] = speed
    verdict = prescreen.verdict(cfg, budget)
    attrs.update(verdict.attrs)
    if verdict.runs and verdict.calibrated is not None:  # metrics.json records what the pre-screen used
        overrides.append("++" + space.to_override("trial.prescreen", verdict.calibrated.attrs()))
    return Prepared(overrides, attrs, verdict.outcome)


def _stop_override(trial: Trial, plan: SweepPlan, attrs: dict) -> list[str]:
    """`trial.stop_below=<tokens/s>` (stop_below x the best feasible so far) for a search trial;
    never for a confirmation run (it must run to its end) or before any trial is feasible.

    Args:
        trial: The trial asked.
        plan: The sweep's plan.
        attrs: The trial's attributes so far.

    Returns:
        The override, or no override.
    """
    if trial.user_attrs.get(confirm.CONFIRMS_ATTR) is not None:
        return []

    settings = plan.settings
    best = best_finalist(trial.study) if settings.stop_below else None
    threshold = stop_threshold(best.median if best else None, settings.stop_below, plan.objective, settings.direction)
    if threshold is None:
        return []
    attrs[Key.STOP_BELOW] = threshold
    return [f"trial.stop_below={threshold:.6g}"]
