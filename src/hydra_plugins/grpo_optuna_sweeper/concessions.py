"""Equal learning: the recipe a sweep holds, the concessions it may take, and what each one bought.

A user comes with a recipe (completions per optimiser step, generations per prompt, lengths, LoRA
rank and targets, precision: grpo_sweep.levers.KINDS). The sweep searches the knobs (the split of the
completions into micro-batch x accumulation, checkpointing, vLLM's share, ...) at that recipe, and
changes a recipe setting only when `hydra.sweeper.concessions` lists it. Every trial records the
concessions it took (user attr `concessions_taken`); at the end `price_tags` says what the winner
gave up and what each concession bought, from trials that differ only there where the study has them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Set
from typing import TYPE_CHECKING, Any, cast

from grpo_sweep.levers import KINDS, RECIPE, RECIPE_SETTINGS, kind_in, listed_as, why_in
from grpo_sweep.study.attrs import Key
from grpo_sweep.units import MIB

from .config import SweeperSettingError

if TYPE_CHECKING:
    from logging import Logger

    from optuna.trial import FrozenTrial

TAKEN_ATTR = Key.CONCESSIONS_TAKEN  # trial user attr: {recipe setting: the value this trial used}
CPS = "completions_per_step"


def diff(recipe: dict, other: dict) -> dict:
    """{setting: other's value} for each recipe setting where `other` differs from `recipe` (one recorded
    only when set, levers._RECORDED_WHEN_ON, counts where either has it)."""
    keys = [*recipe, *(k for k in other if k not in recipe)]
    return {k: other.get(k) for k in keys if other.get(k) != recipe.get(k)}


def allowed_names(groups: set[str], searched: Set[str] = frozenset()) -> list[str]:
    listed = [*RECIPE_SETTINGS, "model", "task", "seed"]
    return [*listed, *sorted((set(groups) | _recipe_params(searched)) - set(listed))]


def _recipe_params(searched: Set[str], recipe: dict | None = None) -> set[str]:
    """The searched settings that are recipe, by name (an override's `+`/`~` left off)."""
    return {key.lstrip("+~") for key in searched if kind_in(key, recipe) == RECIPE}


def check_list(concessions: list[str], groups: set[str], recipe: dict | None = None, searched: Set[str] = frozenset()) -> None:
    """Each entry of hydra.sweeper.concessions names a recipe setting, a searched config group, or a searched
    setting that is recipe (levers.kind_of: every setting not listed as a knob), once.

    Args:
        concessions: The hydra.sweeper.concessions entries.
        groups: The config groups the sweep searches.
        recipe: The held recipe, for the settings whose kind depends on it (levers.CONDITIONS: the split under bnpo).
        searched: The settings the sweep searches.
    """
    twice = sorted({name for name in concessions if list(concessions).count(name) > 1})
    if twice:
        raise SweeperSettingError(
            f"hydra.sweeper.concessions={list(concessions)}: {', '.join(twice)} listed twice; name each once"
        )
    for name in concessions:
        if name in groups or (name in KINDS and kind_in(name, recipe) == RECIPE) or name in _recipe_params(searched, recipe):
            continue
        why = (
            f"{name} is a knob ({why_in(name, recipe)}): searching it never needs a concession"
            if name in KINDS
            else f"{name} is not a recipe setting"
        )
        raise SweeperSettingError(f"hydra.sweeper.concessions: {why}; allowed: {', '.join(allowed_names(groups, searched))}")


def covered(setting: str, via: str, concessions: list[str]) -> bool:
    """Whether a change of `setting` made by the search parameter `via` is a declared concession.

    Args:
        setting: The recipe setting changed.
        via: The search parameter that changes it.
        concessions: The hydra.sweeper.concessions entries.

    Returns:
        True when `setting` or `via` is listed.
    """
    return setting in concessions or via.lstrip("+~") in concessions


def check_space(
    distributions: dict, concessions: list[str], changes: Callable[[str], set[str]], recipe: dict | None = None
) -> dict[str, set]:
    """Stop (SweeperSettingError) when a search parameter changes a recipe setting `concessions` does not list.

    Args:
        distributions: The search space, parameter to distribution.
        concessions: The hydra.sweeper.concessions entries.
        changes: changes(key) -> the recipe settings the parameter can change (a group: found by composing each choice).
        recipe: The held recipe, for the settings whose kind depends on it.

    Returns:
        {param: the recipe settings it changes}: the concession parameters.
    """
    held_split = CPS not in concessions
    out = {}
    for key in distributions:
        if key == "gradient_accumulation_steps" and held_split:
            raise SweeperSettingError(
                "hydra.sweeper.params.gradient_accumulation_steps: derived while the recipe's completions_per_step is "
                "held (completions_per_step / per_device_train_batch_size): search per_device_train_batch_size, the "
                "split, instead; or list completions_per_step in hydra.sweeper.concessions to change the effective batch"
            )
        changed = set(changes(key))
        if recipe is not None and key in KINDS:
            # a choice whose kind has a condition on its own value (levers.CONDITIONS: an 8-bit optimiser)
            choices = getattr(distributions[key], "choices", ())
            if any(kind_in(key, {**recipe, key: v}) == RECIPE for v in choices):
                changed.add(key)
        if key == "per_device_train_batch_size" and held_split:
            changed.discard(CPS)  # the split of a held total: a knob
        missing = sorted(s for s in changed if not covered(s, key, concessions))
        if missing:
            reasons = "; ".join(
                f"{s}: {why_in(s, recipe)}" if s in KINDS else f"{s}: not listed as a knob (levers.KINDS)" for s in missing
            )
            names = [key.lstrip("+~") if s == listed_as(key) else s for s in missing]  # the searched setting itself
            raise SweeperSettingError(
                f"hydra.sweeper.params.{key}: changes the recipe ({reasons}). A sweep holds the recipe and searches "
                f"knobs; to let it trade {', '.join(names)} for speed, list {'it' if len(names) == 1 else 'them'} in "
                f"hydra.sweeper.concessions (e.g. hydra.sweeper.concessions=[{','.join(names)}]), or fix the value"
            )
        if changed:
            out[key] = changed
    return out


def setting_changes(key: str, recipe: dict | None = None) -> set[str]:
    """The recipe settings a searched setting changes: the KINDS entry it falls under (levers.listed_as:
    `trial.grpo_config.temperature` changes trial.grpo_config) when it is recipe under the held recipe
    (levers.kind_in, e.g. the micro-batch under loss_type=bnpo), and any setting KINDS does not call a
    knob is recipe; none for a knob."""
    return {listed_as(key)} if kind_in(key, recipe) == RECIPE else set()


def divisors_only(distributions: dict, totals: list[int], log: Logger) -> dict:
    """With completions_per_step held (or searched), keep only the micro-batches and generation counts that
    divide every total: a split that does not divide is never proposed.

    Args:
        distributions: The search space, parameter to distribution.
        totals: The completions_per_step values the sweep can run.
        log: Where a dropped value is said.

    Returns:
        The space without the values that do not divide.
    """
    from optuna.distributions import CategoricalDistribution, IntDistribution

    out = dict(distributions)
    g = 0
    for t in totals:
        g = math.gcd(g, int(t))
    for key in ("per_device_train_batch_size", "num_generations"):
        dist = out.get(key)
        if dist is None:
            continue
        if isinstance(dist, CategoricalDistribution):
            values = list(dist.choices)
        elif isinstance(dist, IntDistribution) and not dist.log:
            values = list(range(dist.low, dist.high + 1, dist.step))
        else:
            raise SweeperSettingError(
                f"hydra.sweeper.params.{key}: must be a choice or range while completions_per_step is held "
                f"(only the values that divide completions_per_step={g} can run)"
            )
        keep = [v for v in values if isinstance(v, int) and v > 0 and g % v == 0]
        if not keep:
            raise SweeperSettingError(
                f"hydra.sweeper.params.{key}={values}: none divides completions_per_step={g}; "
                f"allowed: {[d for d in range(1, g + 1) if g % d == 0]}"
            )
        if keep != values:
            log.info(
                "Recipe held: %s %s dropped (they do not divide completions_per_step=%d; never proposed)",
                key,
                [v for v in values if v not in keep],
                g,
            )
            out[key] = CategoricalDistribution(keep)
    return out


# --- the price tags --------------------------------------------------------------------------------


def _taken(t: FrozenTrial) -> dict:
    return dict(t.user_attrs.get(TAKEN_ATTR) or {})


def _knobs(t: FrozenTrial, concession_params: set[str]) -> dict:
    return {k: v for k, v in t.params.items() if k not in concession_params}


def fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


def price_tags(
    trials: list[FrozenTrial],
    recipe: dict,
    concession_params: set[str],
    *,
    is_ok: Callable[[FrozenTrial], bool],
    maximize: bool,
    best: FrozenTrial | None,
    best_value: float | None,
    estimate_without: Callable[[FrozenTrial, str], dict | None],
    estimate_recipe: Callable[[], dict | None],
    value_of: Callable[[FrozenTrial], float | None] | None = None,
) -> dict:
    """The note's table as data: the fastest configuration at the full recipe (or why none fits), the
    cheapest concession(s) that fit, and for each concession the winner took: the recipe value, the
    value used, and the objective and peak it bought. Measured from a trial that differs only there
    (same knobs, the other concessions the same), else estimated and labelled so.

    Args:
        trials: The study's trials.
        recipe: The held recipe.
        concession_params: The search parameters that change recipe settings.
        is_ok: Whether a trial finished feasible.
        maximize: Whether a larger objective is better.
        best: The winner, or None.
        best_value: The winner's value, or None.
        estimate_without: estimate_without(winner, setting) -> {peak_bytes, fits, tokens_per_s_ratio} of the
            winner at the recipe value, or None.
        estimate_recipe: The estimate of the recipe's own point, or None.
        value_of: value_of(trial) -> the value a trial counts by (the median of its config's runs; default its own).

    Returns:
        The table's data.
    """
    done = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    ok = [t for t in done if is_ok(t)]
    sign = 1 if maximize else -1
    # Only ok trials are valued: COMPLETE, so each holds a value.
    value = cast("Callable[[FrozenTrial], float]", value_of or (lambda t: t.value))
    out: dict[str, Any] = {"recipe": recipe}
    full = sorted((t for t in ok if not _taken(t)), key=lambda t: sign * value(t), reverse=True)
    out.update(_full_recipe(full, done, ok, recipe, value=value, sign=sign, estimate_recipe=estimate_recipe))
    if best is None:
        out["winner"] = None
        return out
    taken = _taken(best)
    out["winner"] = {"trial": best.number, "objective": best_value, "concessions": len(taken)}
    if full and best_value and out["full_recipe"]["objective"]:
        out["winner"]["vs_full_recipe"] = best_value / out["full_recipe"]["objective"]
    rows = []
    for setting, used in taken.items():
        row = {"setting": setting, "recipe": recipe.get(setting), "used": used}
        rest = {k: v for k, v in taken.items() if k != setting}
        twins = [
            t
            for t in done
            if t.number != best.number and _taken(t) == rest and _knobs(t, concession_params) == _knobs(best, concession_params)
        ]
        twin_ok = [t for t in twins if is_ok(t)]
        if twin_ok:
            row.update(_measured(best, max(twin_ok, key=lambda t: sign * value(t)), value))
        elif twins:
            row.update(_refused_at_recipe(best, twins[0]))
        else:
            row.update(_estimated(best, estimate_without(best, setting)))
        rows.append(row)
    out["taken"] = rows
    return out


def _full_recipe(
    full: list[FrozenTrial],
    done: list[FrozenTrial],
    ok: list[FrozenTrial],
    recipe: dict,
    *,
    value: Callable[[FrozenTrial], float],
    sign: int,
    estimate_recipe: Callable[[], dict | None],
) -> dict:
    """The fastest configuration at the full recipe; where none fits, why not and the cheapest
    concession(s) that fit (the fewest settings given up, then the best value).

    Args:
        full: the ok trials at the full recipe, best first.
        done: the finished trials (COMPLETE or PRUNED).
        ok: the finished trials that count.
        recipe: the recipe the sweep holds.
        value: the value a trial counts by.
        sign: 1 when maximising, -1 when minimising.
        estimate_recipe: the estimator's {peak_bytes, budget_bytes} at the recipe, for the reason.

    Returns:
        {"full_recipe": ...}, with "cheapest" (None when no concession fits) where the full recipe
        does not fit.
    """
    if full:
        t = full[0]
        return {
            "full_recipe": {
                "fits": True,
                "trial": t.number,
                "objective": value(t),
                "peak_memory_bytes": t.user_attrs.get(Key.PEAK_MEMORY_BYTES),
                "knobs": dict(t.params),
            }
        }
    out: dict[str, Any] = {"full_recipe": {"fits": False, "reason": _why_full_does_not_fit(done, estimate_recipe)}}
    fits = [t for t in ok if _taken(t)]
    if not fits:
        out["cheapest"] = None
        return out
    t = min(fits, key=lambda t: (len(_taken(t)), -sign * value(t)))
    out["cheapest"] = {
        "trial": t.number,
        "concessions": {k: {"recipe": recipe.get(k), "used": v} for k, v in _taken(t).items()},
        "objective": value(t),
        "peak_memory_bytes": t.user_attrs.get(Key.PEAK_MEMORY_BYTES),
    }
    return out


def _measured(best: FrozenTrial, twin: FrozenTrial, value: Callable[[FrozenTrial], float]) -> dict:
    """A concession's price measured: the winner against its best twin at the recipe value.

    Args:
        best: the winner.
        twin: the best ok trial that differs from it only in this setting.
        value: the value a trial counts by.

    Returns:
        The row's measured columns: the objective and the peak at the recipe and as used.
    """
    peak_w, peak_t = best.user_attrs.get(Key.PEAK_MEMORY_BYTES), twin.user_attrs.get(Key.PEAK_MEMORY_BYTES)
    at_recipe, used_value = value(twin), value(best)
    return {
        "basis": "measured",
        "vs_trial": twin.number,
        "objective_at_recipe": at_recipe,
        "objective_used": used_value,
        "objective_ratio": used_value / at_recipe if at_recipe else None,
        "peak_at_recipe_bytes": peak_t,
        "peak_used_bytes": peak_w,
        "peak_saved_bytes": peak_t - peak_w if peak_t is not None and peak_w is not None else None,
        "bought": f"{used_value / at_recipe:.2f}x objective" if at_recipe else "-",
    }


def _refused_at_recipe(best: FrozenTrial, twin: FrozenTrial) -> dict:
    """A concession's price where its twin at the recipe value ran and did not count (an OOM, a prune)."""
    status = twin.user_attrs.get(Key.STATUS) or twin.state.name.lower()
    return {
        "basis": "measured",
        "vs_trial": twin.number,
        "status_at_recipe": status,
        "peak_at_recipe_bytes": twin.user_attrs.get(Key.PEAK_MEMORY_BYTES) or twin.user_attrs.get(Key.PREDICTED_PEAK_BYTES),
        "peak_used_bytes": best.user_attrs.get(Key.PEAK_MEMORY_BYTES),
        "bought": f"it fits: at the recipe value trial {twin.number} was {status}",
    }


def _estimated(best: FrozenTrial, est: dict | None) -> dict:
    """A concession's price with no twin: the estimator's {peak_bytes, fits, tokens_per_s_ratio} of
    the winner at the recipe value (None: it could not price it)."""
    row: dict[str, Any] = {"basis": "estimated", "peak_used_bytes": best.user_attrs.get(Key.PEAK_MEMORY_BYTES)}
    if est is None:
        row["bought"] = "not measured, and the estimator could not price it"
        return row
    row.update(peak_at_recipe_bytes=est.get("peak_bytes"), fits_at_recipe=est.get("fits"))
    if est.get("tokens_per_s_ratio"):
        row["objective_ratio"] = est["tokens_per_s_ratio"]
    parts = []
    if est.get("fits") is False:
        parts.append("it fits (at the recipe value the estimator predicts it would not)")
    if est.get("tokens_per_s_ratio"):
        parts.append(f"~{est['tokens_per_s_ratio']:.2f}x tokens/s (the throughput model)")
    row["bought"] = "; ".join(parts) or "no measured twin; the estimator sees no memory difference that matters"
    return row


def _why_full_does_not_fit(done: list, estimate_recipe: Callable[[], dict | None]) -> str:
    at_recipe = [t for t in done if not _taken(t)]
    if at_recipe:
        parts = []
        for t in sorted(at_recipe, key=lambda t: t.user_attrs.get(Key.PREDICTED_PEAK_BYTES) or math.inf)[:3]:
            status = t.user_attrs.get(Key.STATUS) or t.state.name.lower()
            pred, budget = t.user_attrs.get(Key.PREDICTED_PEAK_BYTES), t.user_attrs.get(Key.BUDGET_BYTES)
            knobs = " ".join(f"{k}={fmt(v)}" for k, v in t.params.items())
            need = f", predicted {pred / MIB:.0f} MiB of {budget / MIB:.0f} MiB" if pred and budget else ""
            parts.append(f"trial {t.number} ({knobs}): {status}{need}")
        return "no knob setting tried made the full recipe fit: " + "; ".join(parts)
    est = estimate_recipe()
    if est and est.get("peak_bytes") and est.get("budget_bytes"):
        return (
            f"no trial ran the full recipe; the estimator predicts {est['peak_bytes'] / MIB:.0f} MiB "
            f"for a budget of {est['budget_bytes'] / MIB:.0f} MiB at the recipe's own knobs"
        )
    return "no trial ran the full recipe"


def describe(tags: dict, objective: str) -> str:
    """The printed Concessions table (best.yaml `concessions` in words)."""
    if not tags:
        return ""
    lines = ["\nConcessions (what the winner gave up from the recipe, and what it bought):"]
    full = tags.get("full_recipe") or {}
    if full.get("fits"):
        peak = full.get("peak_memory_bytes")
        lines.append(
            f"  full recipe: fits; fastest trial {full['trial']}, {objective} {full['objective']:.4g}"
            + (f", peak {peak / MIB:.0f} MiB" if peak else "")
        )
    else:
        lines.append(f"  full recipe: does not fit: {full.get('reason')}")
        cheap = tags.get("cheapest")
        if cheap:
            what = ", ".join(f"{k} {fmt(v['recipe'])} -> {fmt(v['used'])}" for k, v in cheap["concessions"].items())
            lines.append(
                f"  cheapest concession that fits: {what} (trial {cheap['trial']}, {objective} {cheap['objective']:.4g})"
            )
        elif "cheapest" in tags:
            lines.append("  no concession tried made it fit")
    winner = tags.get("winner")
    if winner is None:
        return "\n".join(lines)
    if not tags.get("taken"):
        lines.append(f"  the winner (trial {winner['trial']}) runs the full recipe: it gave nothing up")
    elif winner.get("vs_full_recipe"):
        lines.append(
            f"  the winner (trial {winner['trial']}) gave up {winner['concessions']} setting(s) for "
            f"{winner['vs_full_recipe']:.2f}x the full recipe's {objective}:"
        )
    for row in tags.get("taken", []):
        peak = ""
        if row.get("peak_at_recipe_bytes") and row.get("peak_used_bytes"):
            peak = f", peak {row['peak_at_recipe_bytes'] / MIB:.0f} -> {row['peak_used_bytes'] / MIB:.0f} MiB"
        where = (
            f" (measured: trial {winner['trial']} vs trial {row['vs_trial']})" if row["basis"] == "measured" else " (estimated)"
        )
        lines.append(f"  {row['setting']} {fmt(row['recipe'])} -> {fmt(row['used'])}: {row['bought']}{peak}{where}")
    return "\n".join(lines)
