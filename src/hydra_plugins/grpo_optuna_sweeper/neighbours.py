"""Neighbour moves: some search trials try one lever of the best config so far, moved one step.

Why: the throughput landscape is made of a few levers with a direction (a larger batch, more
gradient accumulation, no checkpointing when it fits), and the winner is usually one or two lever
moves from a good config the search has already run. TPE sees a numeric `choice(2, 4, 8, 16)` as
unordered categories and, with run-to-run noise, often stops one move short. A neighbour move is
what a person tuning by hand does next: keep the best config, change one lever; and when that
change does not fit, change a second lever to make room for it.

The rule (`hydra.sweeper.neighbour_every=N`, 0: off): once the study counts `n_startup_trials`
trials, every N-th search trial is a neighbour of the best config so far (the best median of its
runs, grpo_sweep.study.best; once all of its moves are tried, the next best). A step changes one
lever: a numeric lever to the next value up or down in sorted order, any other lever (a config
group, a bool, a string) to another of its values. A repair move first: a step the pre-screen
refuses (the estimator says it would not fit, or it fails the checks), taken together with a
move of another lever that makes it pass (batch 8 -> 16 with lora all_linear -> qv); then a
plain step. Only a point no trial of the study has (queued, run or pruned) and, with the
pre-screen on, one the estimator does not prune; among those one is drawn at random (the sweep's
seed). When no config has such a move, or none is feasible yet, the sampler asks as usual.
Neighbours are queued trials (user attr `neighbour_of` = the config's first trial), so every
worker of a study runs them and they count in n_trials like any search trial; never in the
confirmation phase.

What they change, measured with and without on both landscapes (300 paired seeds, and the Gemma
model at several noise levels): docs/performance.md, bench/search_efficiency.py `neighbour_effect`
and `gemma_pick_by_noise`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from grpo_sweep.study.attrs import Key

from .standings import finalists

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

NEIGHBOUR_ATTR = Key.NEIGHBOUR_OF  # trial user attr: the first trial of the config it moved from


def due(counted: int, n_startup_trials: int, every: int) -> bool:
    """Whether the next search trial is a neighbour move.

    Args:
        counted: the trials the study counts.
        n_startup_trials: the trials before the first neighbour move.
        every: one neighbour move in this many search trials (0 or less: none).

    Returns:
        True when the next search trial is a neighbour move.
    """
    if every <= 0 or counted < n_startup_trials:
        return False
    return (counted - n_startup_trials) % every == 0


def moves(params: dict[str, Any], choices: dict[str, list]) -> list[dict[str, Any]]:
    """Every point one lever away from `params` in the discrete space `choices`: a numeric lever to
    its next value up or down (sorted order), another lever to each of its other values."""
    out = []
    for name, values in choices.items():
        if name not in params:
            continue
        current = params[name]
        if _numeric(values):
            order = sorted(values)
            if current not in order:
                continue
            i = order.index(current)
            options = [order[j] for j in (i - 1, i + 1) if 0 <= j < len(order)]
        else:
            options = [v for v in values if v != current]
        out += [{**params, name: value} for value in options]
    return out


def repairs(params: dict[str, Any], choices: dict[str, list], blocked: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Repair moves: each blocked step taken together with one move of another lever (`moves` of
    the step that leaves the stepped lever where the step put it).

    Args:
        params: the point the steps start from.
        choices: the discrete space, each lever with its values.
        blocked: the steps the pre-screen refuses (they would not fit, or do not pass the checks).

    Returns:
        The repaired points, each once, in order.
    """
    out, seen = [], set()
    for step in blocked:
        stepped = _moved(params, step)
        for point in moves(step, choices):
            if _moved(step, point) != stepped and (k := point_key(point)) not in seen:
                seen.add(k)
                out.append(point)
    return out


def pick(
    params: dict[str, Any],
    choices: dict[str, list],
    tried: Iterable[dict[str, Any]],
    runs: Callable[[dict[str, Any]], bool],
    rng: random.Random,
) -> dict[str, Any] | None:
    """One move of `params` that no trial has and that the pre-screen would let run.

    A repair move goes first: a step the pre-screen refuses, made to fit by one more lever
    (`repairs`). A step towards speed that does not fit is what the search cannot take one lever
    at a time (a larger batch that only fits with fewer LoRA targets), and what a person tuning by
    hand tries next; then the plain steps.

    Args:
        params: the point to move from.
        choices: the discrete space, each lever with its values.
        tried: every trial's parameters.
        runs: whether the pre-screen would let a point run.
        rng: draws among the moves.

    Returns:
        The move, or None when there is none.
    """
    seen = {point_key(p) for p in tried}
    steps = moves(params, choices)
    rng.shuffle(steps)
    fits: list[dict[str, Any]] = []
    blocked: list[dict[str, Any]] = []
    for step in steps:  # each step asks `runs` once
        (fits if runs(step) else blocked).append(step)
    repaired = [point for point in repairs(params, choices, blocked) if point_key(point) not in seen]
    rng.shuffle(repaired)
    plain = (step for step in fits if point_key(step) not in seen)
    return next((point for point in repaired if runs(point)), None) or next(plain, None)


def enqueue(study: Study, choices: dict[str, list], runs: Callable[[dict[str, Any]], bool], seed: int | None) -> dict | None:
    """Queue one neighbour move of the best config so far (not a preset's: a preset sets levers outside
    the space), or of the next best when every move of the best has been tried.

    Args:
        study: the study to queue the move in.
        choices: the discrete space, each lever with its values.
        runs: whether the pre-screen would let a point run.
        seed: the sweep's seed, for the draw among moves.

    Returns:
        {"from": its first trial, "params": ..., "moved": {lever: (old, new)}}; None when a trial
        already waits (start points and retries go first), nothing is feasible yet, or no config has
        a move that is fresh and allowed by `runs`.
    """
    from grpo_sweep.study import best as best_rule

    trials = study.get_trials(deepcopy=False)
    if any(t.state.name == "WAITING" for t in trials):
        return None
    tried = points(trials)
    rng = random.Random(f"{seed}:{len(trials)}")
    for best in (f for f in finalists(study) if not f.item.user_attrs.get(Key.PRESET)):
        params = dict(best.item.params)
        point = pick(params, choices, tried, runs, rng)
        if point is not None:
            break
    else:
        return None
    first = best_rule.config_group(best.item.user_attrs, best.item.number)
    study.enqueue_trial(point, user_attrs={NEIGHBOUR_ATTR: first}, skip_if_exists=True)
    return {"from": first, "params": point, "moved": {k: (params[k], v) for k, v in point.items() if params[k] != v}}


def points(trials: Iterable[FrozenTrial]) -> list[dict[str, Any]]:
    """Each trial's point: the parameters it was queued with (a WAITING trial has no others yet) or ran."""
    return [t.system_attrs.get(Key.FIXED_PARAMS, t.params) for t in trials]


def _moved(params: dict[str, Any], point: dict[str, Any]) -> str | None:
    """The first lever whose value differs between `params` and `point` (None: the same point)."""
    return next((k for k in point if params.get(k) != point[k]), None)


def _numeric(values: list) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def point_key(params: dict[str, Any]) -> tuple:
    """A hashable key of a point (its parameters, order-free)."""
    return tuple(sorted((k, repr(v)) for k, v in params.items()))
