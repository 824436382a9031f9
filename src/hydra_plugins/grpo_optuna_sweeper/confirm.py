"""Confirmation runs: the top feasible configs run again, interleaved, and the best median wins.

A CPU (or shared GPU) measurement of one run moves by 10-30 %, so the best single run is often a
lucky one. After the search phase the sweeper enqueues the `confirm_top` best feasible configs
`confirm_repeats` more times each, round-robin (A B C A B C: drift over the confirmation phase
touches every finalist alike), as ordinary trials with the user attr `confirms` = the trial they
repeat. grpo_sweep.study.best.best_of_runs then names the config with the best median.

Budget: confirmation runs count in n_trials. The search phase gets n_trials - top x repeats trials;
confirmation needs the search to keep at least two thirds of them (top is lowered to fit, and below
two finalists it is off: one config confirmed cannot change the winner). The grid sampler runs every
point once: no confirmation. Fewer than two feasible configs after the search: no confirmation runs,
and the study holds fewer than n_trials trials.
"""

from __future__ import annotations

from typing import Any

from grpo_sweep.study import best as best_rule

PLAN_ATTR = "confirmation"  # study user attr: {"finalists": [trial numbers], "runs": count}
CONFIRMS_ATTR = "confirms"  # trial user attr: the trial number a confirmation run repeats


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


def search_trials(study: Any) -> list:
    """The study's feasible ok trials that are not confirmation runs (the search's own results)."""
    from .summary import _is_ok as is_ok

    return [t for t in study.get_trials(deepcopy=False) if is_ok(t) and t.user_attrs.get(CONFIRMS_ATTR) is None]


def plan(study: Any, top: int, repeats: int, log: Any) -> list[dict]:
    """Enqueue the confirmation runs once per study (a resumed sweep finds the plan and reuses it);
    returns them, one dict per run: {"confirms": trial number, "params": ..., "preset": name or None}."""
    existing = study.user_attrs.get(PLAN_ATTR)
    if existing is not None:
        return existing["runs"]
    ranked = best_rule.ranked(search_trials(study), value=lambda t: t.value, direction=study.direction)[:top]
    runs: list[dict] = []
    if len(ranked) >= 2:
        for _ in range(repeats):
            for t in ranked:
                runs.append({"confirms": t.number, "params": dict(t.params), "preset": t.user_attrs.get("preset")})
    study.set_user_attr(PLAN_ATTR, {"finalists": [t.number for t in ranked], "runs": runs})
    for run in runs:
        attrs = {CONFIRMS_ATTR: run["confirms"], **({"preset": run["preset"]} if run["preset"] else {})}
        study.enqueue_trial(run["params"], user_attrs=attrs)
    if runs:
        log.info(
            "Confirmation: trials %s run %d more times each, interleaved (%d runs, counted in n_trials)",
            ", ".join(str(t.number) for t in ranked),
            repeats,
            len(runs),
        )
    else:
        log.info("Confirmation skipped: fewer than two feasible configs to compare")
    return runs
