"""The throughput model calibrated on a sweep's measured trials: per phase, a scale and a per-step overhead.

Pure arithmetic on records (dicts), no config and no torch. `calibrate_untried` is the call that
re-predicts a sweep's untried points from its measured trials (to re-rank them after each trial); the
report re-predicts each config from the other configs' trials (report.trials.model_vs_measured).

A record carries the model's phase seconds at its config (`predicted_generation_s`,
`predicted_training_s`, `predicted_tokens_per_s`: throughput.relative_step_time) and, once measured,
the trial's (`generation_s`, `training_s`: throughput.speed_record). Per phase the measured seconds are
taken as `scale x predicted + overhead_s`:
- the scale absorbs a card (or a machine's load) that runs every config's phase slower or faster alike;
- the overhead absorbs fixed seconds per step that the model mis-counts (weight sync, launches, the
  engine's per-step work), which a scale alone would stretch with the config's predicted seconds.
The fit is Theil-Sen's (the median of the slopes between trials predicted at least MIN_SPREAD apart,
then the median intercept): one noisy trial moves neither. It needs MIN_POINTS trials whose predictions
span MIN_SPREAD. With fewer, or when the line it finds is not physical, the phase keeps the pure scale
(the median of measured over predicted seconds). Not physical: a slope at or below zero, an overhead
above the fastest measured phase, or one so negative that the fastest predicted trial would lose more
than FLOOR of its seconds.
"""

from __future__ import annotations

import statistics

PHASES = ("generation", "training")
# The affine fit needs this many trials whose predicted phase seconds span at least MIN_SPREAD (largest
# over smallest): a narrower span leaves the slope to the run-to-run noise (~20 % here).
MIN_POINTS = 2
MIN_SPREAD = 1.25
# A negative overhead (the model counts fixed seconds this machine does not spend) is kept while the line
# leaves the smallest predicted trial at least FLOOR of its scaled seconds; a calibrated phase never drops
# below FLOOR x scale x predicted, so a point predicted faster than every trial stays positive.
FLOOR = 0.5


def _pairs(records: list[dict], phase: str) -> list[tuple[float, float]]:
    """(predicted, measured) seconds of one phase over the records that carry both, positive."""
    out = []
    for r in records:
        predicted, measured = r.get(f"predicted_{phase}_s"), r.get(f"{phase}_s")
        if predicted and measured and predicted > 0 and measured > 0:
            out.append((float(predicted), float(measured)))
    return out


def _scale_only(points: list[tuple[float, float]]) -> dict:
    return {"scale": statistics.median(m / p for p, m in points), "overhead_s": 0.0, "points": len(points), "kind": "scale"}


def fit_phase(points: list[tuple[float, float]], affine: bool = True) -> dict:
    """One phase's calibration from (predicted, measured) seconds: {scale, overhead_s, points, kind}, kind
    `affine` (Theil-Sen's line) or `scale` (the median ratio: too few distinct points, no physical line,
    or `affine` False)."""
    predicted = [p for p, _ in points]
    if not affine or len(points) < MIN_POINTS or max(predicted) < MIN_SPREAD * min(predicted):
        return _scale_only(points)
    # only pairs MIN_SPREAD apart: two trials the model predicts alike give a slope of pure noise
    slopes = [
        (mj - mi) / (pj - pi)
        for i, (pi, mi) in enumerate(points)
        for pj, mj in points[i + 1 :]
        if max(pi, pj) >= MIN_SPREAD * min(pi, pj)
    ]
    slope = statistics.median(slopes)
    overhead = statistics.median(m - slope * p for p, m in points)
    if slope <= 0 or not -FLOOR * slope * min(predicted) < overhead < min(m for _, m in points):
        return _scale_only(points)
    return {"scale": slope, "overhead_s": overhead, "points": len(points), "kind": "affine"}


def phase_fit(records: list[dict], affine: bool = True) -> dict | None:
    """The model's per-phase calibration from measured records: {generation: fit_phase, training: fit_phase,
    trials: records that measured a phase}; None when no record measured a phase. A phase no record measured
    keeps the model (scale 1, no overhead). `affine` False fits the pure scale alone (the bench's comparator)."""
    fits: dict = {}
    trials = 0
    for phase in PHASES:
        points = _pairs(records, phase)
        trials = max(trials, len(points))
        fits[phase] = fit_phase(points, affine) if points else {"scale": 1.0, "overhead_s": 0.0, "points": 0, "kind": "model"}
    return {**fits, "trials": trials} if trials else None


def calibrated(prediction: dict, fit: dict) -> dict | None:
    """A config's prediction (predicted_generation_s, predicted_training_s, predicted_tokens_per_s) under a
    phase_fit: {generation_s, training_s, step_s, tokens_per_s}; None without the phases or the tokens/s.
    The tokens per step are the model's (tokens/s x step seconds): calibration changes the seconds only."""
    tokens_per_s = prediction.get("predicted_tokens_per_s")
    gen, train = prediction.get("predicted_generation_s"), prediction.get("predicted_training_s")
    if not tokens_per_s or gen is None or train is None or gen + train <= 0:
        return None
    out = {
        f"{phase}_s": max(fit[phase]["scale"] * seconds + fit[phase]["overhead_s"], FLOOR * fit[phase]["scale"] * seconds)
        for phase, seconds in (("generation", gen), ("training", train))
    }
    out["step_s"] = out["generation_s"] + out["training_s"]
    out["tokens_per_s"] = tokens_per_s * (gen + train) / out["step_s"]
    return out


def calibrate_untried(records: list[dict], untried: list[dict]) -> tuple[dict | None, list[dict | None]]:
    """Re-predict the points a sweep has not run from the trials it has.

    Args:
        records: the measured trials' records (predicted_ and measured phase seconds; a record without
            them is skipped).
        untried: each untried point's prediction (predicted_generation_s, predicted_training_s,
            predicted_tokens_per_s).

    Returns:
        (the phase_fit, or None when no record measured a phase; each untried point's `calibrated`
        prediction in the order given, None where it has no phases or there is no fit).
    """
    fit = phase_fit(records)
    if fit is None:
        return None, [None] * len(untried)
    return fit, [calibrated(p, fit) for p in untried]
