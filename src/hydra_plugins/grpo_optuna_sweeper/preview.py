"""`grpo-sweep plan`: a sweep's forecast before any trial (hydra.sweeper.plan_only=true).

What a user tuning one card asks before spending GPU hours: how big is the space, how much of it
does the pre-screen expect to fit, which points the models expect fastest (with their predicted
peak and the headroom left), and, when the full recipe cannot fit, the cheapest concession. Every
number comes from the forecast the sweep's own start reads (forecast.py: the pre-screen's peak and
verdict, the throughput model's tokens/s), so the plan and the sweep never disagree about a point.

The prediction is the raw estimate with the pre-screen's fixed margin: before any trial there is
nothing to calibrate it with. Points are checked for the target card (config.schema.validate, as
`grpo-sweep estimate` does), so a plan for an L4 runs on a laptop.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_sweep.config.model_arch import check_hub_lora_targets
from grpo_sweep.config.schema import validate
from grpo_sweep.memory.estimator import target_device
from grpo_sweep.units import format_size

from . import concessions, forecast, space
from .config import SweepError, SweeperSettingError
from .plan import Composer, SweepPlan
from .prescreen import Prescreen

PLAN_CANDIDATES = 512  # points judged; a larger space is drawn at random down to this many (seeded): ~25 ms each
SHOWN = 10  # the fastest points printed (--json lists every point judged)


def check_for_target(cfg: Any) -> None:
    """The checks a trial's config passes on its target card: `schema.validate` with that card's
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
    try:
        grid = space.grid_choices(plan.distributions, purpose="grpo-sweep plan") if plan.distributions else {}
    except ValueError as err:  # a continuous interval: one line, as any bad sweep setting
        raise SweeperSettingError(str(err)) from None
    size = 1
    for values in grid.values():
        size *= len(values)
    configs = compose.cache()
    prescreen = Prescreen(settings)
    forecasts = forecast.forecast(plan, prescreen, configs, check_for_target, cap=PLAN_CANDIDATES, purpose="grpo-sweep plan")
    judged = [f for f in forecasts if f.error is None]
    ranking = forecast.fastest_first(judged, len(judged), settings.seed)
    data: dict[str, Any] = {
        "sweep": settings.study_name,
        "recipe": plan.recipe,
        "concessions": list(plan.concessions),
        "space": {"size": size, "parameters": grid},
        "judged": len(forecasts),
        "sampled": len(forecasts) < size,
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
        "start": _start(settings, ranking, judged, _room(plan)),
        "cheapest_concession": cheapest_concession(plan, judged, configs),
        "points": [_point(f) for f in forecasts],
    }
    return data


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
    }


def _room(plan: SweepPlan) -> int:
    """The search trials the frontier start has room for (start.enqueue_start): the search phase
    less the `enqueue` points and, with warm_start, the presets, which are queued first."""
    settings = plan.settings
    before = len(settings.get("enqueue") or []) + (len(settings.presets) if settings.warm_start else 0)
    return max(plan.n_search - before, 0)


def _start(settings: Any, ranking: list[forecast.Forecast], judged: list[forecast.Forecast], room: int) -> dict:
    """What the sweep's start would queue first (hydra.sweeper.start, frontier_start), besides the
    presets and `enqueue` points, which take their room first (`room`: what they leave)."""
    mode, count = settings.get("start", "model"), min(settings.frontier_start, room)
    out: dict[str, Any] = {"mode": mode, "count": count, "frontier_start": settings.frontier_start}
    if mode == "model" and count and settings.sampler != "grid":
        out["points"] = [f.params for f in ranking[:count]]
    return out


def cheapest_concession(plan: SweepPlan, judged: list[forecast.Forecast], configs: Any) -> dict:
    """Whether the full recipe fits, and if not the cheapest change that does.

    - A point of the space that takes no concession fits: the recipe fits ({"recipe_fits": true}).
    - Only points that take concessions fit: the one taking the fewest, the fastest of those.
    - Nothing fits: the doctor's smallest change set (memory.doctor.diagnose, knobs first, recipe
      changes only when no knob suffices) for the point predicted nearest to fitting."""
    fitting = [f for f in judged if f.fits]
    if any(not f.taken for f in fitting):
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
    near = [(f.share, f) for f in judged if f.share is not None]
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
    lines = [f"Plan for sweep {data['sweep']}: {size} point{'' if size == 1 else 's'} in the space ({names})"]
    if data["sampled"]:
        lines.append(f"  judged {data['judged']} of them, drawn at random (seeded)")
    if data["not_judged"]["count"]:
        first = data["not_judged"]["first"]
        lines.append(
            f"  {data['not_judged']['count']} could not be composed, checked or estimated (they would fail as trials), "
            f"e.g. {_point_text(first['params'])}: {first['error']}"
        )
    judged = pre["runs"] + pre["pruned"]
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
    cc = data["cheapest_concession"]
    if cc.get("recipe_fits"):
        lines.append("Recipe: the full recipe fits (a point that takes no concession is predicted to fit)")
    elif cc.get("source") == "space":
        lines.append(
            f"Recipe: does not fit in this space; cheapest concession: {' '.join(cc['overrides'])} "
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
    start = data["start"]
    if start.get("points"):
        n = len(start["points"])
        lines.append(
            f"Start (hydra.sweeper.start=model): the first {'search trial' if n == 1 else f'{n} search trials'} after "
            "the presets and enqueue points: the fastest above, in that order"
        )
    else:
        lines.append(f"Start: hydra.sweeper.start={start['mode']}, frontier_start={start.get('frontier_start', start['count'])}")
    return "\n".join(lines)
