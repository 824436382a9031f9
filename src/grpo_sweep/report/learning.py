"""Equal learning, checked from the trials' own numbers: a knob trial that trained something else.

A knob changes speed and memory, never what is learned (levers.KINDS). Trials of one recipe and one
seed therefore start from the same weights, sample the same completions and take the same first
optimiser steps, so the numbers TRL logs for those steps agree up to floating-point reordering. A
trial whose numbers depart further changed the learning, whatever its settings claim: a knob that is
not neutral for this recipe, or an upstream bug (TRL's sleep mode generated from stale weights until
TRL PR #5313).

The fingerprint is read from metrics.json's `history` (TRL's logged metrics per optimiser step):
- `grad_norm` of steps 1 and 2: the first step's gradient, and the second's after one update, so the
  update itself (learning rate, optimiser) is covered too;
- `entropy` of step 1: the mean token entropy of the completions under the policy (TRL 1.16
  `_compute_loss`), a function of the model's distribution on the completions it sampled;
- `reward` of step 1: what the reward functions gave the completions sampled;
- where vLLM generated: step 1's `sampling_logp_diff` and `is_ratio` (TRL's
  `sampling/sampling_logp_difference/mean` and `sampling/importance_sampling_ratio/mean`), the
  trainer/vLLM disagreement the importance-sampling correction reweights by.

The tolerance is relative. Measured on CPU in float32, knob trials of `+sweeps=tiny_cpu` (every
split, checkpointing on and off, eager and sdpa attention) agreed to 1e-6 relative in every key;
FP32_TOLERANCE leaves two orders of magnitude above that. bf16 rounds at 2^-8 (3.9e-3) per
operation, and a different micro-batch reorders the sums: BF16_TOLERANCE is 5 roundings. A sweep
sets its own with hydra.sweeper.learning_tolerance.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping

# (history row, key): the numbers compared, each from the step TRL logged it at (1-based)
FINGERPRINT: tuple[tuple[int, str], ...] = (
    (1, "grad_norm"),
    (2, "grad_norm"),
    (1, "entropy"),
    (1, "reward"),
    (1, "sampling_logp_diff"),
    (1, "is_ratio"),
)
FP32_TOLERANCE = 1e-4
BF16_TOLERANCE = 2e-2
# Below this magnitude a value is compared absolutely (a loss or a logp difference near 0).
FLOOR = 1e-6


def fingerprint(record: Mapping) -> dict[str, float]:
    """The fingerprint keys a trial's record has (`<key>@<step>`), finite values only."""
    rows = record.get("history") or []
    out = {}
    for step, key in FINGERPRINT:
        if len(rows) >= step and rows[step - 1].get(key) is not None:
            value = float(rows[step - 1][key])
            if math.isfinite(value):
                out[f"{key}@{step}"] = value
    return out


def tolerance_for(record: Mapping) -> float:
    """The default relative tolerance for a trial's precision: float32 on CPU, bf16 on a card."""
    dtype = str((record.get("trainer_settings") or {}).get("dtype") or record.get("dtype") or "")
    device = str(record.get("device") or "")
    return BF16_TOLERANCE if ("bf16" in dtype or "bfloat16" in dtype or device == "cuda") else FP32_TOLERANCE


def _group_key(record: Mapping, seed) -> str:
    recipe = record.get("recipe") or {}
    return repr((sorted((k, repr(v)) for k, v in recipe.items()), seed))


def departures(trials: Iterable[tuple[int, Mapping, object]], tolerance: float | None = None) -> dict[int, str]:
    """The trials whose fingerprint departs from the others of their recipe and seed, each with what differed.

    `trials`: (number, metrics record, seed). Only trials that trained (a `history`) are compared.
    The reference is each key's median over the group: of three or more, the one that departs is
    named; of two that disagree, both are. `tolerance` None: tolerance_for each trial."""
    groups: dict[str, list[tuple[int, Mapping, dict]]] = {}
    for number, record, seed in trials:
        fp = fingerprint(record)
        if fp:
            groups.setdefault(_group_key(record, seed), []).append((number, record, fp))
    out: dict[int, str] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        keys = set.intersection(*(set(fp) for _, _, fp in members))
        reference = {k: statistics.median(fp[k] for _, _, fp in members) for k in keys}
        for number, record, fp in members:
            tol = tolerance if tolerance is not None else tolerance_for(record)
            differed = []
            for k in sorted(keys):
                ref, value = reference[k], fp[k]
                if abs(value - ref) > tol * max(abs(ref), FLOOR):
                    differed.append(f"{k} {value:.6g} vs {ref:.6g} ({_rel(value, ref)})")
            if differed:
                out[number] = (
                    f"changed the learning: {'; '.join(differed)} (the median of {len(members)} trials of this recipe "
                    f"and seed; tolerance {tol:g} relative)"
                )
    return out


def _rel(value: float, ref: float) -> str:
    if abs(ref) < FLOOR:
        return f"{value - ref:+.2g} absolute"
    return f"{(value - ref) / abs(ref):+.2%}"
