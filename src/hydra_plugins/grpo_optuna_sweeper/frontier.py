"""Frontier start: the first trials are the points the estimator predicts fill the card best.

Why: the objective is throughput under a memory wall, and work per step (batch x sequence,
LoRA size) buys throughput with memory, so the fastest config usually sits just below the wall.
People search that way by hand (accelerate's `find_executable_batch_size` starts at the largest
batch and halves on OOM). A sampler that starts from random points spends its first trials on
small configs that cannot win; starting on the predicted frontier gives it fast, feasible
trials to learn from at once. The estimator is arithmetic (milliseconds a point), so ranking a
few hundred candidates costs only their config composition.

The picks are spread out: each differs from every earlier pick in at least half of the
parameters, so the start covers several regions of the frontier instead of one corner of it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

MAX_CANDIDATES = 256  # a larger space is sampled at random down to this many points


def candidates(grid: dict[str, list], seed: int | None) -> Iterator[dict[str, Any]]:
    """Every point of a discrete space, or MAX_CANDIDATES of them drawn at random when it is larger."""
    names = list(grid)
    size = 1
    for values in grid.values():
        size *= len(values)
    if size <= MAX_CANDIDATES:
        for values in itertools.product(*grid.values()):
            yield dict(zip(names, values))
        return
    rng = random.Random(seed)
    seen: set[tuple] = set()
    while len(seen) < MAX_CANDIDATES:
        values = tuple(rng.choice(grid[n]) for n in names)
        if values not in seen:
            seen.add(values)
            yield dict(zip(names, values))


def pick(fullness: list[tuple[dict[str, Any], float]], k: int, seed: int | None) -> list[dict[str, Any]]:
    """Up to k points from (params, predicted peak / allowed bytes): those predicted to fit (<= 1),
    fullest first, each differing from every earlier pick in at least half of the parameters.

    A fraction, not bytes: when the card itself is a parameter (`gpu: choice(l4_24g, a100_40g)`),
    each point is measured against its own card."""
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
