"""`grpo-sweep plan`: a sweep's forecast before any trial (hydra.sweeper.plan_only=true).

What a user tuning one card asks before spending GPU hours: how big is the space, how much of it
does the pre-screen expect to fit, which points the models expect fastest (with their predicted
peak and the headroom left), and, when the full recipe cannot fit, the cheapest concession. Every
number comes from the forecast the sweep's own start reads (forecast.py: the pre-screen's peak and
verdict, the throughput model's tokens/s), so the plan and the sweep never disagree about a point.

The prediction is the raw estimate with the pre-screen's fixed margin: before any trial there is
nothing to calibrate it with. Points are checked for the target card (config.validate.validate, as
`grpo-sweep estimate` does), so a plan for an L4 runs on a laptop.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from grpo_sweep.config.model_arch import check_hub_lora_targets
from grpo_sweep.config.validate import validate
from grpo_sweep.memory.shapes import target_device
from grpo_sweep.units import format_size

from . import concessions, forecast, lead, neighbours, space, start
from .config import SweepError, SweeperSettingError, indifference_of, start_points_of
from .plan import Composer, SweepPlan
from .prescreen import Prescreen

PLAN_CANDIDATES = 512  # points judged; a larger space is drawn at random down to this many (seeded): ~25 ms each
PRICED = 64  # the points that run whose trial time the sweep's cost averages (the judged order: seeded, random)
SHOWN = 10  # the fastest points printed (--json lists every point judged)


def check_for_target(cfg: Any) -> None:
    """The checks a trial's config passes on its target card: `validate.validate` with that card's
    CUDA rules, the hub model's LoRA targets (no local package check: the plan may run elsewhere)."""
    validate(cfg, cuda=target_device(cfg) == "cuda")
    check_hub_lora_targets(cfg)


def run(plan: SweepPlan, compose: Composer) -> dict:
    """Print the plan (and write it as JSON to hydra.sweeper.plan_json when set); returns it. A
    plan_json whose folder is missing is refused before the plan is built; a write that fails (a
    full disk) is one line."""
    path = plan.settings.get("plan_json")
    if path and not Path(path).parent.is_dir():
        raise SweeperSettingError(
            f"hydra.sweeper.plan_json={path}: its folder {Path(path).parent} does not exist; create it, or name a file "
            "in an existing folder"
        )
    data = build(plan, compose)
    print(format_text(data))
    if path:
        try:
            Path(path).write_text(json.dumps(data, indent=1, default=str))
        except OSError as err:
            raise SweepError(f"hydra.sweeper.plan_json={path}: cannot write it ({err.strerror or err})") from None
    return data


def build(plan: SweepPlan, compose: Composer) -> dict:
    """The plan as data (`grpo-sweep plan --json`)."""
    settings = plan.settings
    size = space.size(plan.distributions)  # None: a continuous interval, sampled as a large space is
    grid = {key: space.values(dist) or space.describe(dist) for key, dist in plan.distributions.items()}
    configs = compose.configs  # the plan's cache: its base config is composed already
    prescreen = Prescreen(settings)
    forecasts = forecast.forecast(plan, prescreen, configs, check_for_target, cap=PLAN_CANDIDATES)
    judged = [f for f in forecasts if f.error is None]
    ranking = forecast.fastest_first(judged, len(judged), settings.seed)
    sampled = size is None or len(forecasts) < size
    at_recipe = _at_recipe(plan, prescreen, configs, whole=not sampled and any(not f.taken for f in judged))
    data: dict[str, Any] = {
        "sweep": settings.study_name,
        "recipe": plan.recipe,
        "concessions": list(plan.concessions),
        "space": {"size": size, "parameters": grid},
        "judged": len(forecasts),
        "sampled": sampled,
        "recipe_point": _point(at_recipe[0]),
        "recipe_knob_points": len(at_recipe) - 1,
        "not_judged": _errors(forecasts),
        "prescreen": {
            "on": bool(settings.prescreen),
            "margin": settings.prescreen_margin,
            "runs": sum(f.runs for f in judged),
            "pruned": sum(not f.runs for f in judged),
        },
        "fit": sum(f.fits for f in judged),
        "headroom": settings.headroom,
        "fastest": [_row(f, i + 1) for i, f in enumerate(ranking[:SHOWN])],
        "start": _start(plan, forecasts),
        "cheapest_concession": cheapest_concession(plan, judged, configs, at_recipe),
        "cost": sweep_cost_of(plan, configs, judged, ranking),
        "points": [_point(f) for f in forecasts],
    }
    return data


def _at_recipe(plan: SweepPlan, prescreen: Prescreen, configs: Any, whole: bool) -> list[forecast.Forecast]:
    """The held recipe's own point (the base config, its knobs as the sweep's config sets them),
    judged always; then, unless the judged points hold the whole knob sub-space already, a sample of
    that sub-space (the knobs searched, every concession parameter left at the recipe's value): a
    sample of the whole space may hold no point that takes no concession, nor may a space whose
    concession parameters leave out the recipe's values.

    Args:
        plan: The sweep's plan.
        prescreen: The pre-screen that judges each point.
        configs: The configs composed so far, by point.
        whole: Whether the space was enumerated and holds points that take no concession.

    Returns:
        The forecasts of those points.
    """
    own = forecast.one({}, plan, prescreen, configs, check_for_target)
    knobs = {k: d for k, d in plan.distributions.items() if k not in plan.concession_params}
    if whole or not knobs or len(knobs) == len(plan.distributions):
        return [own]
    knob_plan = replace(plan, distributions=knobs)
    return [own, *forecast.forecast(knob_plan, prescreen, configs, check_for_target, cap=PLAN_CANDIDATES // 4)]


def sweep_cost_of(
    plan: SweepPlan, configs: Any, judged: list[forecast.Forecast], ranking: list[forecast.Forecast]
) -> dict | None:
    """The sweep's forecast cost in GPU-minutes (memory.throughput.sweep_cost). Each search trial is a
    draw from the space: a point the pre-screen prunes loads no model and costs nothing, one that runs
    costs the mean predicted time (start + trial.steps worst-case steps, trial.num_processes cards) of the
    points that run (PRICED of them, in the judged order). The confirmation runs reserved in n_trials cost
    the predicted fastest point's trial each.

    Args:
        plan: The sweep's plan.
        configs: The configs composed so far, by point.
        judged: The forecasts of the points judged.
        ranking: The forecasts that run, fastest first.

    Returns:
        The cost, or None when the card has no datasheet speeds or no point runs.
    """
    from grpo_sweep.memory.throughput import relative_step_time, sweep_cost, trial_forecast

    def gpu_s(f: forecast.Forecast) -> float:
        cfg = configs.config([*plan.fixed, *(space.to_override(k, v) for k, v in f.params.items())])
        return trial_forecast(cfg, relative_step_time(cfg)["step_s"])["gpu_s"]

    runs = [f for f in judged if f.runs]
    priceable = [f for f in runs if f.tokens_per_s is not None]  # a card without datasheet speeds has none
    if not priceable:
        return None
    priced = [gpu_s(f) for f in priceable[:PRICED]]
    share = len(runs) / len(judged)
    confirm = plan.n_trials - plan.n_search
    finalist = gpu_s(ranking[0]) if ranking and confirm else 0.0
    assumption = (
        f"{plan.n_search} search trials, {share:.0%} of them running (the rest pruned before any model loads) at the "
        f"mean predicted trial of the points that run (start + trial.steps worst-case steps), and {confirm} "
        "confirmation runs at the predicted fastest point's"
    )
    return sweep_cost(plan.n_search * share, sum(priced) / len(priced), confirm, finalist, assumption)


def _errors(forecasts: list[forecast.Forecast]) -> dict:
    failed = [f for f in forecasts if f.error is not None]
    return {"count": len(failed), "first": {"params": failed[0].params, "error": failed[0].error} if failed else None}


def _row(f: forecast.Forecast, rank: int) -> dict:
    return {
        "rank": rank,
        "params": f.params,
        "predicted_tokens_per_s": f.tokens_per_s,
        "predicted_peak_bytes": f.predicted_bytes,
        "limit_bytes": f.limit_bytes,
        "headroom_bytes": f.headroom_bytes,
        "concessions_taken": f.taken,
    }


def _point(f: forecast.Forecast) -> dict:
    if f.error is not None:
        return {"params": f.params, "error": f.error}
    return {
        "params": f.params,
        "prescreen": "run" if f.runs else "pruned",
        "fits": f.fits,
        "predicted_peak_bytes": f.predicted_bytes,
        "limit_bytes": f.limit_bytes,
        "predicted_tokens_per_s": f.tokens_per_s,
        "generation_waves": f.waves,
        "concessions_taken": f.taken,
        "departures": f.departures,
    }


def _room(plan: SweepPlan) -> int:
    """The search trials the frontier start has room for (start.enqueue_start): the search phase
    less the `enqueue` points and, with warm_start, the presets, which are queued first."""
    settings = plan.settings
    before = len(settings.get("enqueue") or []) + (len(settings.presets) if settings.warm_start else 0)
    return max(plan.n_search - before, 0)


def _start(plan: SweepPlan, forecasts: list[forecast.Forecast]) -> dict:
    """What the sweep's start would queue first (hydra.sweeper.start, start_points), besides the
    presets and `enqueue` points, which take their room first (`_room`: what they leave):
    start.choose over the points the start itself judges (space.space_candidates' first
    space.MAX_CANDIDATES, which the plan's own sample holds), none of them a point the sweeper refuses."""
    settings = plan.settings
    mode, count = settings.get("start", "model"), min(start_points_of(settings), _room(plan))
    out: dict[str, Any] = {"mode": mode, "count": count, "start_points": start_points_of(settings)}
    if mode == "model" and count and settings.sampler != "grid" and plan.distributions:
        by_point = {neighbours.point_key(f.params): f for f in forecasts}
        points = space.space_candidates(plan.distributions, settings.seed, space.MAX_CANDIDATES)
        theirs = [f for p in points if (f := by_point.get(neighbours.point_key(p))) is not None and f.error is None]
        zone = indifference_of(settings)
        ran, out["points"], _ = start.choose(mode, theirs, count, settings.seed, zone)
        found = lead.flat(theirs, zone) if ran == "flat" else None
        if found is not None:
            out["flat"] = lead.flat_line(found, zone)
    return out


def cheapest_concession(
    plan: SweepPlan, judged: list[forecast.Forecast], configs: Any, at_recipe: list[forecast.Forecast]
) -> dict:
    """Whether the full recipe fits, and if not the cheapest change that does.

    - The recipe's own point (`at_recipe`) or a point of the space that takes no concession fits: the
      recipe fits ({"recipe_fits": true}).
    - Only points that take concessions fit: the one taking the fewest, the fastest of those.
    - Nothing fits: the doctor's smallest change set (memory.doctor.diagnose, knobs first, recipe
      changes only when no knob suffices) for the point predicted nearest to fitting.

    Args:
        plan: The sweep's plan.
        judged: The forecasts of the points judged.
        configs: The configs composed so far, by point.
        at_recipe: The recipe's own point and its knob points (_at_recipe).

    Returns:
        The answer as data.
    """
    fitting = [f for f in judged if f.fits]
    if any(f.fits for f in at_recipe) or any(not f.taken for f in fitting):
        return {"recipe_fits": True}
    if fitting:
        best = min(fitting, key=lambda f: (len(f.taken), -(f.tokens_per_s or 0.0)))
        return {
            "recipe_fits": False,
            "source": "space",
            "overrides": [space.to_override(k, v) for k, v in best.taken.items()],
            "params": best.params,
            "predicted_tokens_per_s": best.tokens_per_s,
            "predicted_peak_bytes": best.predicted_bytes,
            "limit_bytes": best.limit_bytes,
        }
    near = [(f.share, f) for f in [*at_recipe, *judged] if f.share is not None]
    if not near:
        return {"recipe_fits": False, "source": None, "why": "no point of the space could be estimated against a memory budget"}
    nearest = min(near, key=lambda pair: pair[0])[1]
    from grpo_sweep.levers import RECIPE, kind_of
    from grpo_sweep.memory.doctor import diagnose

    cfg = configs.config([*plan.fixed, *(space.to_override(k, v) for k, v in nearest.params.items())])
    diagnosis = diagnose(cfg, {})
    recipe_changes = [o for o in diagnosis.overrides if kind_of(o.split("=", 1)[0]) == RECIPE]
    return {
        "recipe_fits": False,
        "source": "doctor",
        "params": nearest.params,
        "predicted_peak_bytes": nearest.predicted_bytes,
        "limit_bytes": nearest.limit_bytes,
        "overrides": diagnosis.overrides,
        "recipe_changes": recipe_changes,
        "fits_after": diagnosis.fits_after,
    }


def _point_text(params: dict) -> str:
    return " ".join(f"{k}={concessions.fmt(v)}" for k, v in params.items()) or "(the base config)"


def _size(n: float | None) -> str:
    return "-" if n is None else format_size(n)


def format_text(data: dict) -> str:
    """The plan as the terminal shows it."""
    sp, pre = data["space"], data["prescreen"]
    names = ", ".join(sp["parameters"]) or "no parameters"
    size = sp["size"]
    size_text = "a continuous space" if size is None else f"{size} point{'' if size == 1 else 's'} in the space"
    lines = [f"Plan for sweep {data['sweep']}: {size_text} ({names})"]
    if data["sampled"]:
        lines.append(f"  judged {data['judged']} of them, drawn at random (seeded)")
    if data["not_judged"]["count"]:
        first = data["not_judged"]["first"]
        lines.append(
            f"  {data['not_judged']['count']} points the sweeper would refuse as trials (not composed, checked or "
            "estimated, or a recipe change hydra.sweeper.concessions does not allow: never a start point, though the "
            "sampler may draw one, a failed trial), "
            f"e.g. {_point_text(first['params'])}: {first['error']}"
        )
    judged = pre["runs"] + pre["pruned"]
    own = data["recipe_point"]
    if "error" in own:
        lines.append(f"Recipe's own point (the base config): refused: {own['error']}")
    else:
        lines.append(
            f"Recipe's own point (the base config): peak {_size(own['predicted_peak_bytes'])} of "
            f"{_size(own['limit_bytes'])} allowed: {'fits' if own['fits'] else 'does not fit'}"
        )
    if pre["on"]:
        lines.append(
            f"Pre-screen: {pre['runs']} of {judged} would run, {pre['pruned']} pruned (predicted over the allowed memory "
            f"by more than its margin, {100 * pre['margin']:.0f} %)"
        )
    else:
        lines.append(f"Pre-screen: off (hydra.sweeper.prescreen=false): all {judged} would run")
    lines.append(f"Predicted to fit: {data['fit']} of {judged}" + (f" (headroom {data['headroom']})" if data["headroom"] else ""))
    if data["fastest"]:
        lines.append("Predicted fastest (one point per distinct prediction; tokens/s ranks configs, it is not a promise):")
        lines.append(f"  {'rank':>4}  {'tok/s':>9}  {'peak':>10}  {'allowed':>10}  {'headroom':>10}  point")
        for r in data["fastest"]:
            lines.append(
                f"  {r['rank']:>4}  {r['predicted_tokens_per_s']:>9.4g}  {_size(r['predicted_peak_bytes']):>10}  "
                f"{_size(r['limit_bytes']):>10}  {_size(r['headroom_bytes']):>10}  {_point_text(r['params'])}"
            )
    elif data["fit"]:
        lines.append("Predicted fastest: none ranked (the card has no datasheet speeds: conf/gpu tflops_bf16, bandwidth_gbs)")
    cost = data.get("cost")
    if cost:
        lines.append(f"Forecast cost: {cost['gpu_minutes']:.3g} GPU-minutes ({cost['assumption']})")
    lines += _recipe_lines(data)
    lines += _start_lines(data)
    return "\n".join(lines)


def _recipe_lines(data: dict) -> list[str]:
    """The plan's line on the full recipe: it fits, or its cheapest concession."""
    lines: list[str] = []
    cc = data["cheapest_concession"]
    if cc.get("recipe_fits"):
        lines.append("Recipe: the full recipe fits (its own point, or a point that takes no concession, is predicted to fit)")
    elif cc.get("source") == "space":
        knob = data["recipe_knob_points"]
        where = f" nor at the {knob} knob settings judged" if knob else " nor at any knob setting of the space"
        lines.append(
            f"Recipe: does not fit at its own point{where}; cheapest concession: {' '.join(cc['overrides'])} "
            f"(at {_point_text(cc['params'])}: peak {_size(cc['predicted_peak_bytes'])} of {_size(cc['limit_bytes'])})"
        )
    elif cc.get("source") == "doctor":
        fix = " ".join(cc["overrides"]) if cc["fits_after"] else "none found (a larger card, or fewer tokens per step)"
        changes = f"; recipe changes among them: {' '.join(cc['recipe_changes'])}" if cc["recipe_changes"] else ""
        lines.append(
            f"Recipe: no point of the space is predicted to fit; nearest {_point_text(cc['params'])} "
            f"(peak {_size(cc['predicted_peak_bytes'])} of {_size(cc['limit_bytes'])}); the doctor's smallest fix: {fix}{changes}"
        )
    else:
        lines.append(f"Recipe: {cc.get('why')}")
    return lines


def _start_lines(data: dict) -> list[str]:
    """The plan's lines on the start: the first search trials the model picks."""
    lines: list[str] = []
    start = data["start"]
    if start.get("flat"):
        lines.append(start["flat"])
    n = len(start.get("points") or [])
    trials = "search trial" if n == 1 else f"{n} search trials"
    if start.get("points") and start["points"] == [r["params"] for r in data["fastest"][:n]]:
        lines.append(
            f"Start (hydra.sweeper.start=model): the first {trials} after the presets and enqueue points: "
            "the fastest above, in that order"
        )
    elif start.get("points"):
        lines.append(
            f"Start (hydra.sweeper.start=model): the first {trials} after the presets and enqueue points: "
            "the fastest predicted fits among the points the start judges, in this order"
        )
        lines += [f"  {_point_text(p)}" for p in start["points"]]
    else:
        lines.append(f"Start: hydra.sweeper.start={start['mode']}, start_points={start.get('start_points', start['count'])}")
    return lines
