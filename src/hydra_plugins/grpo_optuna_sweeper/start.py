"""What the sweep queues besides the sampler's points: the start points (the presets, the `enqueue`
points, then the model-first or memory-first start from the models' forecast, hydra.sweeper.start)
and, every few search trials, a neighbour move of the best config so far.

Every function reads the frozen plan; `configs` is a ComposeCache (plan.Composer.configs: the
sweep's one cache): one Hydra composition per distinct set of group choices, however many points
are ranked.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any, cast

from omegaconf import OmegaConf

from grpo_sweep.config.local import validate_here
from grpo_sweep.levers import recipe_of
from grpo_sweep.study.attrs import Key
from grpo_sweep.units import budget_bytes

from . import forecast, lead, neighbours, space
from .compose import ComposeCache
from .config import indifference_of, start_points_of
from .plan import Composer, SweepPlan
from .prescreen import Prescreen
from .progress import room

if TYPE_CHECKING:
    from optuna import Study

log = logging.getLogger(__name__)


def enqueue_start(study: Study, plan: SweepPlan, prescreen: Prescreen, compose: Composer) -> list[forecast.Forecast]:
    """Queue the start points: the presets (warm_start), the `enqueue` points, then the frontier.
    A point the sweeper would refuse as a trial (outside the space, not composed or checked, or a
    recipe change the concessions do not allow) is dropped with its reason: it never takes a trial.

    Never more than the search phase has room for (n_search less what the study already counts,
    runs or queues): a queued point the search never reaches would stay WAITING, and the
    confirmation phase would then run it in place of a confirmation run. The points left out are
    named in a warning (raise hydra.sweeper.n_trials to run them).

    Args:
        study: the study to queue the points in.
        plan: the sweep's plan (space, presets, points, start).
        prescreen: the pre-screen that prunes points.
        compose: composes a config from overrides.

    Returns:
        The models' forecast of the space (enqueue_frontier; empty when no start ranks it): the
        model-led search reads it.
    """
    settings = plan.settings
    if settings.warm_start:
        _enqueue_presets(study, plan, compose)
    left_out = []
    configs = compose.configs  # the plan's cache: its base config is composed already
    for i, point in enumerate(settings.enqueue):
        params = cast(dict, OmegaConf.to_container(point))  # an `enqueue` entry is a mapping (config.check)
        outside = outside_space(plan, params) or refused(plan, configs, params)
        if outside:  # the held recipe (or the space) leaves no room for it: dropped, never a failed trial
            log.info("Start point enqueue[%d]=%s dropped: %s", i, params, outside)
            continue
        if room(study, plan.n_search) <= 0 and not _in_study(study, params):
            left_out.append(f"enqueue[{i}]={params}")
            continue
        study.enqueue_trial(params, skip_if_exists=True)
    if left_out:
        log.warning(
            "Start points not queued: the search phase has %d trials (n_trials=%d less %d confirmation runs) "
            "and no room left for %s; raise hydra.sweeper.n_trials to run them",
            plan.n_search,
            plan.n_trials,
            plan.n_trials - plan.n_search,
            ", ".join(left_out),
        )
    frontier_count = min(start_points_of(settings), room(study, plan.n_search))
    return enqueue_frontier(study, plan, prescreen, configs, frontier_count)


def outside_space(plan: SweepPlan, params: dict) -> str | None:
    """Why a start point cannot be asked in this search space (a value the held recipe's divisors
    or the space's range leave out), or None when every one of its values is in it."""
    for key, value in params.items():
        dist = plan.distributions.get(key)
        if dist is not None and not space.representable(dist, value):
            return f"{key}={value} is not in the space this sweep searches ({space.describe(dist)})"
    return None


def refused(plan: SweepPlan, configs: ComposeCache, params: dict) -> str | None:
    """Why the sweeper would refuse a point as a trial (prepare's checks: it composes, passes
    validate_here, and changes no recipe setting the concessions do not allow).

    Args:
        plan: the sweep's plan (fixed overrides, refusal).
        configs: the cache that composes configs.
        params: the point.

    Returns:
        The reason, or None when the sweeper would run it.
    """
    try:
        cfg = configs.config([*plan.fixed, *(space.to_override(k, v) for k, v in params.items())])
        validate_here(cfg)
    except Exception as err:  # noqa: BLE001 - a point that cannot be composed or checked: said, never raised
        return (str(err).splitlines() or [type(err).__name__])[0][:300]
    return plan.refusal(recipe_of(cfg))


def _in_study(study: Study, params: dict) -> bool:
    """Whether a trial of the study already has `params` (queued, running or run: enqueue_trial's
    skip_if_exists skips it, so it needs no room)."""
    return params in neighbours.points(study.get_trials(deepcopy=False))


def _enqueue_presets(study: Study, plan: SweepPlan, compose: Composer) -> None:
    """Queue each seed preset once per study, with its levers as parameters where they fit the space
    (while the search phase has room: see enqueue_start).

    Args:
        study: the study to queue the presets in.
        plan: the sweep's plan (its presets and space).
        compose: composes a config from overrides.
    """
    queued = {t.user_attrs.get(Key.PRESET) for t in study.get_trials(deepcopy=False)}
    for preset in plan.settings.presets:
        if preset in queued:
            continue
        if room(study, plan.n_search) <= 0:
            log.warning(
                "Warm start: preset=%s not queued: the search phase's %d trials are already taken; "
                "raise hydra.sweeper.n_trials to run it",
                preset,
                plan.n_search,
            )
            continue
        cfg = compose.configs.config([*plan.fixed, f"preset={preset}"])  # the preset's trial then reuses it
        refused = plan.refusal(recipe_of(cfg))
        if refused:
            log.warning("Warm start: preset=%s not queued: it %s", preset, refused)
            continue
        try:
            validate_here(cfg)  # e.g. its micro-batch does not divide the held completions_per_step
        except Exception as err:  # noqa: BLE001 - a preset the held recipe cannot run is not queued
            log.info("Warm start: preset=%s not queued: %s", preset, str(err).splitlines()[0])
            continue
        params = {}
        for key, dist in plan.distributions.items():
            value = OmegaConf.select(cfg, key, default=None)
            if value is not None and space.representable(dist, value):
                params[key] = value
        study.enqueue_trial(params, user_attrs={Key.PRESET: preset})
        log.info("Warm start: enqueued preset=%s", preset)


def enqueue_frontier(
    study: Study, plan: SweepPlan, prescreen: Prescreen, configs: ComposeCache, count: int
) -> list[forecast.Forecast]:
    """Queue (once per study) start points from the models' forecast (forecast.py), as
    hydra.sweeper.start says: `model`, the points predicted fastest among those predicted to fit;
    `memory`, those predicted to fill the allowed memory best (start.pick); `none`, no start.
    The model's ranking is recorded on the study (MODEL_RANKING_ATTR) whichever start runs, so the
    report can set the measured order beside it. A flat space (lead.flat) is said before the first
    trial, and its safest point is the one start point.

    Args:
        study: the study to queue the points in.
        plan: the sweep's plan (space and start mode).
        prescreen: the pre-screen that prunes points.
        configs: the cache that composes configs.
        count: how many start points to queue.

    Returns:
        The forecast (empty: none made).
    """
    settings = plan.settings
    mode = settings.get("start", "model")
    if mode == "none" or not start_points_of(settings) or settings.sampler == "grid" or not plan.distributions:
        return []  # no start asked (nor a model-led search); the grid runs every point; nothing to search
    forecasts = forecast.forecast(plan, prescreen, configs, validate_here)
    if count <= 0 or any(t.user_attrs.get(Key.START_POINT) for t in study.get_trials(deepcopy=False)):
        return forecasts  # started before (a resumed sweep): the model-led search still reads the forecast
    estimated = [f for f in forecasts if f.error is None]
    if not estimated:
        log.info(
            "Frontier start skipped: none of the space's points could be composed, checked and estimated "
            "(each is refused as it would be when run: see the first trials' errors)"
        )
        return forecasts
    if all(f.limit_bytes is None for f in estimated):
        log.info("Frontier start skipped: the config has no memory budget (gpu.memory_gib)")
        return forecasts
    zone = indifference_of(settings)
    mode, picks, ranking = choose(mode, estimated, count, settings.seed, zone)
    study.set_user_attr(MODEL_RANKING_ATTR, ranking_attr(ranking, len(forecasts), sum(f.fits for f in estimated)))
    words = {"model": "fastest predicted fit first", "flat": "the safest of the flat space"}.get(
        mode, "fullest predicted fit first"
    )
    if mode == "flat":
        found = lead.flat(estimated, zone)
        assert found is not None  # choose said flat
        log.info(lead.flat_line(found, zone))
    if not picks:
        log.info(
            "Frontier start: none of the %d candidates is predicted to fit the allowed memory; "
            "the search starts from sampled points",
            len(estimated),
        )
        return forecasts
    for params in picks:
        study.enqueue_trial(params, user_attrs={Key.START_POINT: True, Key.START: mode}, skip_if_exists=True)
    log.info(
        "Frontier start (%s): enqueued %d of %d candidates, %s: %s",
        mode,
        len(picks),
        len(estimated),
        words,
        "; ".join(" ".join(f"{k}={v}" for k, v in p.items()) for p in picks),
    )
    return forecasts


def choose(
    mode: str, estimated: list[forecast.Forecast], count: int, seed: int | None, zone: float | None = None
) -> tuple[str, list[dict], list[forecast.Forecast]]:
    """The start's picks from the estimated points. The search replay (bench/search_seconds.py)
    calls it on a landscape's forecast, so the bench starts where the sweeper starts.

    Args:
        mode: `model`: the predicted fastest fits (forecast.fastest_first); `memory`: the fullest
            predicted fits (start.pick).
        estimated: the model's forecast of each point.
        count: the most points to pick.
        seed: the seed for start.pick.
        zone: with mode `model`, when most of the space is predicted within it of the fastest
            (lead.flat), the mode is `flat`: the safest of those, alone.

    Returns:
        (the mode that ran, up to `count` points' params, the model's whole predicted order).
    """
    ranking = forecast.fastest_first(estimated, len(estimated), seed)
    if mode == "model" and zone is not None and (found := lead.flat(estimated, zone)) is not None:
        return "flat", [found[0].params], ranking
    if mode == "model" and not ranking and any(f.fits for f in estimated):
        # a card without datasheet speeds: the memory start is the next best guess
        log.info(
            "Model start: no point predicted to fit has a predicted speed (conf/gpu has no tflops_bf16/bandwidth_gbs); "
            "the memory-first start runs instead"
        )
        mode = "memory"
    if mode == "model":
        return mode, [f.params for f in ranking[:count]], ranking
    # A fit whose generation runs in N waves (vLLM's KV cache holds fewer sequences than the batch) is
    # slower in proportion: it counts 1/N as full, so the fullest *fast* fits start the search.
    # (The memory start as it always ranked: by the peak alone, vLLM's start-up not asked.)
    fullness = [(f.params, f.share / f.waves if f.share <= 1 else f.share) for f in estimated if f.share is not None]
    return mode, pick(fullness, count, seed), ranking


MODEL_RANKING_ATTR = Key.MODEL_RANKING  # study user attr: the model's predicted order (ranking_attr)
RANKING_KEPT = 20  # points of the predicted order kept on the study (the start's picks are among the first)


def ranking_attr(ranking: list[forecast.Forecast], candidates: int, fit: int) -> dict:
    """The model's predicted order as the study records it.

    Args:
        ranking: the model's order (forecast.fastest_first: one point per distinct prediction).
        candidates: how many points it judged.
        fit: how many it predicted to fit.

    Returns:
        The counts and the first RANKING_KEPT of the order, with their predicted tokens/s, peak and
        allowed bytes.
    """
    return {
        "candidates": candidates,
        "fit": fit,
        "top": [
            {
                "params": f.params,
                "predicted_tokens_per_s": f.tokens_per_s,
                "predicted_peak_bytes": f.predicted_bytes,
                "limit_bytes": f.limit_bytes,
            }
            for f in ranking[:RANKING_KEPT]
        ],
    }


def enqueue_neighbour(study: Study, plan: SweepPlan, prescreen: Prescreen, configs: ComposeCache) -> None:
    """Queue one neighbour move of the best config so far (neighbours.py), when there is one: a
    point that composes, passes validate_here, changes no recipe setting outside the concessions
    (SweepPlan.refusal) and is not pruned by the pre-screen.

    Args:
        study: the study to queue the move in.
        plan: the sweep's plan (space, seed, refusal).
        prescreen: the pre-screen that prunes points.
        configs: the cache that composes configs.
    """
    if plan.settings.sampler == "grid" or not plan.distributions:
        return
    try:
        choices = space.grid_choices(plan.distributions)
    except ValueError:
        return  # a continuous space: no steps to take
    verdicts = prescreen.move_verdicts

    def runs(point: dict) -> bool:  # what prepare would launch: it composes, passes the checks, is not pruned
        key = neighbours.point_key(point)
        if key not in verdicts:
            try:
                cfg = configs.config([*plan.fixed, *(space.to_override(k, v) for k, v in point.items())])
                validate_here(cfg)
                allowed = plan.refusal(recipe_of(cfg)) is None
                verdicts[key] = allowed and prescreen.verdict(cfg, budget_bytes(cfg)).runs
            except Exception:  # noqa: BLE001 - a point that cannot be composed or checked is not a move
                verdicts[key] = False
        return verdicts[key]

    move = neighbours.enqueue(study, choices, runs, plan.settings.seed)
    if move is not None:
        moved = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in move["moved"].items())
        repair = " (a repair: one of the two alone would not pass the pre-screen)" if len(move["moved"]) > 1 else ""
        log.info("Neighbour move: trial %d's config (the best so far with a move left) with %s%s", move["from"], moved, repair)


# ----------------------------------------------------------------------------- the memory-first pick
# hydra.sweeper.start=memory: the first trials are the points the estimator predicts fill the card
# best. The objective is throughput under a memory wall, and work per step (batch x sequence, LoRA
# size) buys throughput with memory, so the fastest config usually sits just below the wall; people
# search that way by hand (accelerate's `find_executable_batch_size`). The picks are spread out: each
# differs from every earlier pick in at least half of the parameters, so the start covers several
# regions of the frontier instead of one corner of it.


def pick(fullness: list[tuple[dict[str, Any], float]], k: int, seed: int | None) -> list[dict[str, Any]]:
    """Points predicted to fit, fullest first, each differing from every earlier pick in at least
    half of the parameters.

    Args:
        fullness: (params, predicted peak / allowed bytes) per point. A fraction, not bytes: when the
            card itself is a parameter (`gpu: choice(l4_24g, a100_40g)`), each point is measured
            against its own card; <= 1 fits.
        k: the most points to pick.
        seed: the seed for the draw.

    Returns:
        The picked points' params.
    """
    fitting = [(params, share) for params, share in fullness if share <= 1.0]
    random.Random(seed).shuffle(fitting)  # equal predictions: the order is the seed's, not the grid's
    fitting.sort(key=lambda item: -item[1])
    chosen: list[dict[str, Any]] = []
    for params, _ in fitting:
        if len(chosen) == k:
            break
        if all(_differences(params, other) * 2 >= len(params) for other in chosen):
            chosen.append(params)
    return chosen


def _differences(a: dict[str, Any], b: dict[str, Any]) -> int:
    return sum(a[name] != b.get(name) for name in a)
