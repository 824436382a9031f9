"""The sweep's report at its end (summary.write_summary: best.yaml, trials.csv, report.html), with
the concessions' price tags when the sweep allowed any or a trial took one."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from grpo_sweep.config.local import validate_here
from grpo_sweep.memory.estimator import estimate
from grpo_sweep.study.attrs import Key
from grpo_sweep.units import budget_bytes

from . import concessions, identity, space
from .plan import SweepPlan
from .standings import is_ok, learning_verdict, verdict
from .summary import write_summary

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

    from grpo_sweep.memory.estimator import Estimate

    from .failures import Stop

# A job's config for overrides (plan.Composer).
Compose = Callable[[list[str]], DictConfig]


def write_report(study: Study, plan: SweepPlan, compose: Compose, quiet: bool = False, stopped: Stop | None = None) -> dict:
    """Write the sweep's summary (summary.write_summary), its concessions priced.

    Args:
        study: The study.
        plan: The sweep's plan.
        compose: A job's config for overrides (plan.Composer), to price the concessions.
        quiet: Write the summary, do not print it.
        stopped: The failures.Stop that ended the sweep (the summary ends with its words), or None.

    Returns:
        What summary.write_summary returns.
    """

    study.set_user_attr(Key.LEARNING_TOLERANCE, plan.learning_tolerance)  # for report.html and `grpo-sweep report`
    learning = learning_verdict(study, plan.learning_tolerance)
    tags = price_tags(study, plan, compose, learning[0].ranked) if plan.concessions or _any_taken(study) else None
    return write_summary(
        study,
        plan.sweep_dir,
        recipe=plan.recipe,
        price_tags=tags,
        learning=learning,
        learning_tolerance=plan.learning_tolerance,
        storage_url=plan.storage_url,
        objective=identity.objective_of(study, plan.objective),  # the one the study was created with
        top_k=plan.settings.top_k,
        headroom=plan.settings.headroom,
        quiet=quiet,
        stopped=stopped,
    )


def _any_taken(study: Study) -> bool:
    return any(t.user_attrs.get(concessions.TAKEN_ATTR) for t in study.get_trials(deepcopy=False))


def price_tags(study: Study, plan: SweepPlan, compose: Compose, ranked: list | None = None) -> dict | None:
    """concessions.price_tags for this study: what the winner gave up and what it bought. Never fails
    the sweep (the trials and best.yaml matter more): on an error it says why instead.

    Args:
        study: The study.
        plan: The sweep's plan.
        compose: A job's config for overrides, to estimate a point.
        ranked: The finalists, winner first, as the summary ranks them (standings.learning_verdict);
            None: standings.verdict's.

    Returns:
        The price tags, or {"error": why} when pricing failed.
    """
    from grpo_sweep.memory.throughput import relative_step_time

    def predict(overrides: list[str]) -> tuple[DictConfig, Estimate]:
        cfg = compose(overrides)
        validate_here(cfg)
        return cfg, estimate(cfg)

    def estimate_recipe() -> dict | None:
        try:
            cfg, est = predict(list(plan.fixed))
        except Exception:  # noqa: BLE001 - no estimate: the reason says so
            return None
        return {"peak_bytes": est.total_bytes, "budget_bytes": est.budget_bytes or budget_bytes(cfg)}

    def estimate_without(trial: FrozenTrial, setting: str) -> dict | None:
        point = list(trial.user_attrs.get(Key.OVERRIDES) or [])
        try:
            cfg_used, used = predict(point)
            cfg_back, back = predict([*point, space.to_override(setting, plan.recipe[setting])])
        except Exception:  # noqa: BLE001 - unpriced: said in the row
            return None
        out = {"peak_bytes": back.total_bytes, "fits": bool(back.fits)}
        try:
            ratio = relative_step_time(cfg_used)["tokens_per_s"] / relative_step_time(cfg_back)["tokens_per_s"]
            out["tokens_per_s_ratio"] = ratio
        except Exception:  # noqa: BLE001 - a card without speeds: memory only
            pass
        return out

    try:
        ranked = verdict(study).ranked if ranked is None else ranked
        winner = ranked[0] if ranked else None
        median = {m.number: float(f.median) for f in ranked for m in f.members}  # a trial counts by its config
        tags = concessions.price_tags(
            study.get_trials(deepcopy=False),
            plan.recipe,
            set(plan.concession_params),
            is_ok=is_ok,
            maximize=plan.settings.direction == "maximize",
            best=winner.item if winner else None,
            best_value=float(winner.median) if winner else None,
            estimate_without=estimate_without,
            estimate_recipe=estimate_recipe,
            value_of=lambda t: median.get(t.number, t.value),
        )
    except Exception as err:  # noqa: BLE001 - see the docstring
        return {"error": f"{type(err).__name__}: {err}"}
    study.set_user_attr(Key.PRICE_TAGS, tags)  # the report's Concessions section
    return tags
