"""The models' forecast for each point of a space, before any trial: the pre-screen's predicted
peak and verdict, and the throughput model's tokens/s.

One pass over the space (a seeded sample when it is large or holds a continuous interval) that the
start points (start.py: the model-first and the memory-first start) and `grpo-sweep plan`
(preview.py) both read, so the start, the plan and the pre-screen judge every point by the same
numbers, and neither proposes a point the sweeper refuses: a point's peak and verdict are
`Prescreen.verdict`'s (calibrated by what the study measured, raw with the fixed margin before
that; one calibration per point), and its speed is `predicted_tokens_per_s` (the throughput
model, generation waves charged), which prepare.py records on each trial too.

No `from __future__ import annotations`: Hydra's plugin scan loads this module outside
sys.modules, where a dataclass's string annotations cannot be looked up (config.py says the same).
"""

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from grpo_sweep.config.backends import VLLM_ENGINE_DEFAULTS
from grpo_sweep.levers import recipe_of
from grpo_sweep.memory.estimator import estimate
from grpo_sweep.units import budget_bytes

from . import concessions, space
from .compose import ComposeCache
from .outcome import allowed_bytes
from .plan import SweepPlan
from .prescreen import Prescreen

# Predictions within this share of each other: the throughput model cannot tell the points apart (they
# differ only in levers it does not price), so a trial of one speaks for the other as far as it knows.
TIE = 0.001


def ties(speed: float, other: float) -> bool:
    """Whether two predicted tokens/s are one prediction to the model (within TIE of the larger)."""
    return min(speed, other) >= (1.0 - TIE) * max(speed, other)


@dataclass(frozen=True)
class Forecast:
    """One point as the models see it. `error`: why it could not be composed, checked or estimated
    (then every prediction is None: it is refused as it would be when run)."""

    params: dict[str, Any]
    predicted_bytes: float | None = None  # the pre-screen's prediction (calibrated once it can be)
    limit_bytes: float | None = None  # what the point may use: its budget x hydra.sweeper.headroom
    runs: bool = False  # the pre-screen lets it run (its verdict is None)
    tokens_per_s: float | None = None  # the throughput model's (None: a card without datasheet speeds)
    waves: int = 1  # vLLM's generation waves (its KV cache holds fewer sequences than the batch)
    vllm_starts: bool = True  # vLLM (if any) can start: its KV cache holds one sequence, its share is free
    taken: dict[str, Any] = field(default_factory=dict)  # the recipe settings this point changes (concessions)
    departures: int = 0  # how many of its swept settings differ from the user's config (departures)
    error: str | None = None

    @property
    def share(self) -> float | None:
        """Predicted peak / allowed bytes (a fraction: with `gpu` a parameter each point has its own card)."""
        if self.predicted_bytes is None or not self.limit_bytes:
            return None
        return self.predicted_bytes / self.limit_bytes

    @property
    def fits(self) -> bool:
        """Predicted to fit the allowed memory (no margin: the pre-screen's `runs` adds its allowance)
        and, with vLLM, predicted to start (the estimator's `fits` rule)."""
        share = self.share
        return share is not None and share <= 1.0 and self.vllm_starts

    @property
    def headroom_bytes(self) -> float | None:
        if self.predicted_bytes is None or self.limit_bytes is None:
            return None
        return self.limit_bytes - self.predicted_bytes


def forecast(
    plan: SweepPlan,
    prescreen: Prescreen,
    configs: ComposeCache,
    check: Callable[[Any], object],
    cap: int = space.MAX_CANDIDATES,
) -> list[Forecast]:
    """The forecast of every point of the plan's space.

    Args:
        plan: The sweep's plan.
        prescreen: The memory prescreen.
        configs: The composed configs, cached.
        check: check(cfg) raises for a point that must not run: the sweep checks with this machine's
            facts (validate_here, as each trial is checked), `grpo-sweep plan` with the target card's
            (it may plan for an L4 on a laptop).
        cap: How many points to draw at random, with the plan's seed, when the space is larger or
            holds a continuous interval (space.space_candidates).

    Returns:
        One forecast per point.
    """
    points = space.space_candidates(plan.distributions, plan.settings.seed, cap)
    try:
        base = configs.config(list(plan.fixed))
    except Exception:  # noqa: BLE001 - no base to compare with: every point departs from it equally
        base = None
    return [one(params, plan, prescreen, configs, check, base) for params in points]


def departures(params: dict, base: Any) -> int:
    """How many of a point's settings differ from the user's config. A setting the config leaves null
    is compared with what vLLM does then (config.backends.VLLM_ENGINE_DEFAULTS), or departs from nothing
    when that is not known. Among points the throughput model cannot tell apart, the start runs the one
    that changes the least (fastest_first): a change the model cannot price is not one to make.

    Args:
        params: The point.
        base: The config composed with the sweep's fixed overrides alone (None: not composed).

    Returns:
        The number of settings that differ.
    """
    if base is None:
        return 0
    count = 0
    for key, value in params.items():
        held = OmegaConf.select(base, key, default=None)
        if held is None and key.startswith("backend."):
            held = VLLM_ENGINE_DEFAULTS.get(key.removeprefix("backend."))
        count += held is not None and held != value
    return count


def one(
    params: dict, plan: SweepPlan, prescreen: Prescreen, configs: ComposeCache, check: Callable, base: Any = None
) -> Forecast:
    """The forecast of one point.

    Args:
        params: The point (`{}`: the held recipe at the base config's own knobs).
        plan: The sweep's plan.
        prescreen: The memory prescreen.
        configs: The composed configs, cached.
        check: check(cfg) raises for a point that must not run.
        base: The config with the sweep's fixed overrides alone, for `departures`.

    Returns:
        The point's forecast. A point the sweeper refuses (it cannot be composed, checked or estimated,
        or it changes a recipe setting the concessions do not allow: SweepPlan.refusal) has its `error`.
    """
    try:
        cfg = configs.config([*plan.fixed, *(space.to_override(k, v) for k, v in params.items())])
        check(cfg)
        recipe = recipe_of(cfg)
        refused = plan.refusal(recipe)
        if refused:
            raise ValueError(refused)
        est = estimate(cfg)
    except Exception as err:  # noqa: BLE001 - a point that cannot be composed, checked or estimated: said, never raised
        return Forecast(params, error=(str(err).splitlines() or [type(err).__name__])[0][:300])
    budget = est.budget_bytes if est.budget_bytes is not None else budget_bytes(cfg)
    verdict = prescreen.verdict(cfg, budget, est=est)
    predicted = verdict.calibrated.calibrated_bytes if verdict.calibrated is not None else est.total_bytes
    return Forecast(
        params,
        predicted_bytes=float(predicted),
        limit_bytes=allowed_bytes(budget, plan.settings.headroom),
        runs=verdict.runs,
        tokens_per_s=predicted_tokens_per_s(cfg),
        waves=est.assumptions.get("generation_waves") or 1,
        vllm_starts=est.kv_cache_ok is not False and est.assumptions.get("vllm_startup_ok", True) is not False,
        taken=concessions.diff(plan.recipe, recipe),
        departures=departures(params, base),
    )


def predicted_tokens_per_s(cfg: Any) -> float | None:
    """grpo_sweep.memory.throughput's tokens/s for cfg (generation waves charged); None for a card without
    datasheet speeds. A coarse model: it ranks configs, it does not promise a number."""
    from grpo_sweep.memory.throughput import relative_step_time

    try:
        return float(relative_step_time(cfg)["tokens_per_s"])
    except Exception:  # noqa: BLE001 - no speeds for this card (or a config the model cannot price)
        return None


def fastest_first(forecasts: list[Forecast], k: int, seed: int | None) -> list[Forecast]:
    """The points predicted to fit, fastest predicted first, one per distinct prediction.

    Points the throughput model cannot tell apart (the same predicted tokens/s to 0.1 %: they differ
    only in levers it does not price, e.g. prefix caching or the optimiser's kernel) are one pick:
    a second would spend a start trial on a difference the model has no view on. The pick is the one
    that departs least from the user's config (`departures`), then the seed's.

    Args:
        forecasts: The space's forecasts.
        k: The most points to pick.
        seed: Picks which of the points the model cannot tell apart runs, not the grid's order.

    Returns:
        Up to k forecasts.
    """
    fitting = [(f.tokens_per_s, f) for f in forecasts if f.fits and f.tokens_per_s is not None]
    random.Random(seed).shuffle(fitting)
    fitting.sort(key=lambda pair: -pair[0])
    groups: list[list[Forecast]] = []  # points within 0.1 % of their group's fastest
    head = 0.0
    for speed, f in fitting:
        if groups and ties(speed, head):
            groups[-1].append(f)
            continue
        if len(groups) == k:
            break
        groups.append([f])
        head = speed
    # min keeps the first of equals: the seeded order among points that change as little
    return [min(group, key=lambda f: f.departures) for group in groups]
