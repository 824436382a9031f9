"""Confirmation runs: the top feasible configs run again, interleaved, and the best median wins.

A CPU (or shared GPU) measurement of one run moves by 10-30 %, so the best single run is often a
lucky one. Every run of a config counts: when the sampler asks for a point the study already ran,
the trial runs it again and joins that config (user attr `repeats` = the config's first trial;
mark_repeat). After the search phase the sweeper ranks the configs by the median of their runs,
takes the `confirm_top` best feasible ones and tops each up to 1 + `confirm_repeats` runs,
round-robin (A B C A B C: drift over the confirmation phase touches every finalist alike), as
ordinary trials with the user attr `confirms` = the config's first trial. A finalist the search
already ran that often needs no confirmation run. grpo_sweep.study.best.finalists then names the
finalist with the best median.

Budget: confirmation runs count in n_trials. The search phase gets n_trials - top x repeats trials;
confirmation needs the search to keep at least two thirds of them (top is lowered to fit, and below
two finalists it is off: one config confirmed cannot change the winner). The grid sampler runs every
point once: no confirmation. Fewer than two feasible configs after the search, or finalists the
search already repeated: fewer confirmation runs, and the study holds fewer than n_trials trials.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from logging import Logger

    from optuna import Study
    from optuna.trial import FrozenTrial, Trial

from grpo_sweep.study import best as best_rule
from grpo_sweep.study.best import CONFIRMS_ATTR, PLAN_ATTR, REPEATS_ATTR

OVERRIDES_ATTR = "overrides"  # trial user attr: the point as `python train.py` overrides (the sweeper's)


def effective_top(n_trials: int, top: int, repeats: int, sampler: str) -> int:
    """How many finalists this sweep confirms (0: off); see the module docstring."""
    if top <= 0 or repeats <= 0 or sampler == "grid":
        return 0
    fitted = min(top, n_trials // (3 * repeats))
    return fitted if fitted >= 2 else 0


def off_reason(n_trials: int, top: int, repeats: int, sampler: str) -> str:
    if sampler == "grid":
        return "Confirmation off: the grid sampler runs every point once"
    return (
        f"Confirmation off: n_trials={n_trials} leaves no room for confirm_top={top} x confirm_repeats={repeats} "
        f"runs (needs n_trials >= {3 * 2 * repeats} for two finalists); the winner is the best single run"
    )


def search_trials(study: Study) -> list[FrozenTrial]:
    """The study's feasible ok trials that are not confirmation runs (the search's own results)."""
    from .summary import _is_ok as is_ok

    return [t for t in study.get_trials(deepcopy=False) if is_ok(t) and t.user_attrs.get(CONFIRMS_ATTR) is None]


def repeat_of(study: Study, trial: Trial, point: list[str]) -> int | None:
    """The first trial of the config `point` belongs to, when an earlier trial ran the same point
    (the same overrides): the trial's runs pool with that config's. None: a new config."""
    for other in study.get_trials(deepcopy=False):
        if other.number >= trial.number:
            break
        if other.user_attrs.get(OVERRIDES_ATTR) == point and other.user_attrs.get("status") != "surplus":
            return best_rule.config_group(other.user_attrs, other.number)
    return None


def mark_repeat(study: Study, trial: Trial, point: list[str]) -> int | None:
    """repeat_of, recorded on `trial` (user attr `repeats`) when there is one."""
    first = repeat_of(study, trial, point)
    if first is not None:
        trial.set_user_attr(REPEATS_ATTR, first)
    return first


def plan(study: Study, top: int, repeats: int, log: Logger) -> list[dict]:
    """Enqueue the confirmation runs once per study (a resumed sweep finds the plan and reuses it);
    returns them, one dict per run: {"confirms": first trial, "params": ..., "preset": name or None}."""
    existing = study.user_attrs.get(PLAN_ATTR)
    if existing is not None:
        return existing["runs"]
    top_configs = best_rule.finalists(
        search_trials(study),
        value=lambda t: t.value,
        group=lambda t: best_rule.config_group(t.user_attrs, t.number),
        direction=study.direction,
    )[:top]
    if len(top_configs) < 2:
        top_configs = []
    chosen = [best_rule.config_group(f.item.user_attrs, f.item.number) for f in top_configs]
    runs: list[dict] = []
    for round_ in range(repeats):  # each finalist has run at least once: at most `repeats` more
        for first, f in zip(chosen, top_configs):
            if len(f.runs) + round_ < 1 + repeats:
                runs.append({"confirms": first, "params": dict(f.item.params), "preset": f.item.user_attrs.get("preset")})
    study.set_user_attr(PLAN_ATTR, {"finalists": chosen, "runs": runs})
    for run in runs:
        attrs = {CONFIRMS_ATTR: run["confirms"], **({"preset": run["preset"]} if run["preset"] else {})}
        study.enqueue_trial(run["params"], user_attrs=attrs)
    if chosen:
        log.info(
            "Confirmation: trials %s (runs so far: %s) topped up to %d runs each, interleaved (%d runs, counted in n_trials)",
            ", ".join(str(first) for first in chosen),
            ", ".join(str(len(f.runs)) for f in top_configs),
            1 + repeats,
            len(runs),
        )
    else:
        log.info("Confirmation skipped: fewer than two feasible configs to compare")
    return runs
