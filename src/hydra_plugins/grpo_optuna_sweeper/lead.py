"""The model-led search: what the calibrated speed model says the sweep should run next, when it
has nothing better to run, and whether the space is flat.

After the start points, the search alternates: on the model's turns (neighbours.due) the next point
is the untried point the calibrated speed model ranks fastest among those the memory pre-screen
lets run (next_point); on the others Optuna's sampler asks, and so explores where the model is
unsure. The model is calibrated after every measured trial (fit: the one place that calls the
throughput model's calibration, speed_fit.phase_fit and speed_fit.calibrated, then a
log-linear fit of measured on predicted tokens/s, its slope in [0, 1]), and its own error is
measured too (error: the upside spread of measured over calibrated, on a log scale: only a config
that runs faster than the model says can hide a faster point, so configs it overpredicts, often the
slow ones, do not hold the search open).

The search stops (stop_line) once at least MIN_MEASURED configs have run and no untried point is
predicted, raised by the model's measured error times z (best.INTERVAL_Z, or sqrt(2 ln n) for n
untried points, the size of the largest of n errors: one of many mispredicted points may hide the
best), to beat the best measured median by more than the
measured run noise plus the indifference zone (hydra.sweeper.indifference): no run left could
change the pick by more than the user asked to care about. A model whose error is large keeps the
search going (its predictions, raised by that error, still beat the best); a model that is right
ends it after a few trials.

A flat space (flat): when the forecast predicts at least FLAT_SHARE of the points the pre-screen
lets run within the zone of the fastest, any of them is as good a pick, so the sweep says so before
its first trial and runs only the safest of them (the most predicted memory headroom) to prove it
fits; once it has run to its end the search stops.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from typing import Any

from grpo_sweep.memory import speed_fit
from grpo_sweep.study import best as best_rule
from grpo_sweep.study.attrs import Key

from . import forecast
from .neighbours import point_key, points
from .standings import finalists, is_ok

FLAT_SHARE = 0.5  # "most of the space": this share of the runnable points within the zone of the fastest
MIN_MEASURED = 2  # configs measured before the model may end the search (its error needs two)
SLOPE_RECORDS = 3  # measured configs before the calibration fits a slope, not only a scale
PREDICTED = "predicted_tokens_per_s"


def fit(records: list[dict]) -> Callable[[dict], float | None]:
    """The calibrated speed model from measured records (each: `predicted_tokens_per_s`, the measured
    `tokens_per_s`, and where known the predicted and measured phase seconds): a function from a
    point's record (its predictions) to its calibrated tokens/s, None without a prediction.

    The prediction (calibrated per phase where the records carry phases: speed_fit.phase_fit, a scale
    and a per-step overhead) is mapped by log(measured) = a + b log(predicted), fitted by least
    squares over the measured records with
    b held in [0, 1] (b = 1, a the median log ratio, with fewer than SLOPE_RECORDS): where the model
    ranks the measured points as they ran, b stays near 1; where its differences do not show in the
    runs (a wrong model over a flat space), b falls toward 0 and the predictions toward the measured."""
    phases = speed_fit.phase_fit(records)

    def base(record: dict) -> float | None:
        if phases is not None:
            calibrated = speed_fit.calibrated(record, phases)
            if calibrated is not None:
                return calibrated["tokens_per_s"]
        predicted = record.get(PREDICTED)
        return float(predicted) if predicted else None

    pairs = [(math.log(b), math.log(r["tokens_per_s"])) for r in records if r.get("tokens_per_s") and (b := base(r))]
    slope, offset = 1.0, statistics.median(y - x for x, y in pairs) if pairs else 0.0
    if len(pairs) >= SLOPE_RECORDS:
        mx, my = statistics.fmean(x for x, _ in pairs), statistics.fmean(y for _, y in pairs)
        var = sum((x - mx) ** 2 for x, _ in pairs)
        if var > 0:
            slope = min(1.0, max(0.0, sum((x - mx) * (y - my) for x, y in pairs) / var))
            offset = my - slope * mx

    def speed(record: dict) -> float | None:
        b = base(record)
        return math.exp(offset + slope * math.log(b)) if b else None

    return speed


def error(records: list[dict], speed: Callable[[dict], float | None], sigma: float | None = None) -> float | None:
    """The calibrated model's own error on the measured records: the upside spread of
    log(measured / calibrated) (the configs that ran faster than it said), less what the run noise
    the study measured explains. A config the model overpredicts cannot hide a faster point, so its
    miss does not widen the error that keeps the search going.

    Args:
        records: The measured records.
        speed: speed(record) -> the calibrated model's tokens/s for it, or None.
        sigma: The run noise the study measured; None: none known.

    Returns:
        The error, or None with fewer than MIN_MEASURED records it can price.
    """
    logs = [math.log(r["tokens_per_s"] / s) for r in records if r.get("tokens_per_s") and (s := speed(r))]
    if len(logs) < MIN_MEASURED:
        return None
    # The upside semi-deviation, doubled in variance so that a symmetric error keeps its spread: the
    # squares of the configs above the fit, over all configs less the fit's own degree of freedom.
    spread = math.sqrt(2.0 * sum(max(0.0, r) ** 2 for r in logs) / (len(logs) - 1))
    return math.sqrt(max(0.0, spread**2 - (sigma or 0.0) ** 2))


def untried(
    candidates: Iterable[Any], tried: set, speed: Callable[[dict], float | None], measured: Iterable[float] = ()
) -> list[tuple[float, Any]]:
    """Every candidate the pre-screen lets run and no trial has, fastest first. A candidate whose
    prediction ties a measured config's (forecast.ties: it differs from it only in levers the model
    does not price) is left out: the model has no view on what running it would add, so its turn
    and its stop rule take the measured one for it (Optuna's sampler, on its turns, may still run it).

    Args:
        candidates: The forecasts of the space's points.
        tried: point_key of every point queued, run or pruned.
        speed: speed(record) -> the calibrated model's tokens/s for it, or None.
        measured: The model's predicted tokens/s of every measured config.

    Returns:
        (calibrated tokens/s, forecast) pairs; equal speeds in forecast.departures order.
    """
    measured = list(measured)
    out = []
    for f in candidates:
        if not (f.runs and f.fits and f.tokens_per_s) or point_key(f.params) in tried:
            continue
        if any(forecast.ties(f.tokens_per_s, m) for m in measured):
            continue
        s = speed({PREDICTED: f.tokens_per_s})
        if s is not None:
            out.append((s, f))
    out.sort(key=lambda pair: (-pair[0], pair[1].departures))  # a tie: the point that changes the least
    return out


def next_point(
    candidates: Iterable[Any], tried: set, speed: Callable[[dict], float | None], measured: Iterable[float] = ()
) -> dict | None:
    """The params of the untried point the calibrated model ranks fastest.

    Args:
        candidates: The forecasts of the space's points.
        tried: point_key of every point queued, run or pruned.
        speed: speed(record) -> the calibrated model's tokens/s for it, or None.
        measured: The model's predicted tokens/s of every measured config (untried leaves their ties out).

    Returns:
        The params, or None when none is left.
    """
    ranked = untried(candidates, tried, speed, measured)
    return ranked[0][1].params if ranked else None


def stop_line(
    best: float | None,
    measured: int,
    sigma: float | None,
    model_error: float | None,
    best_untried: float | None,
    zone: float,
    untried_count: int = 1,
) -> str | None:
    """The one line that ends the search, or None while it should go on.

    Args:
        best: the best measured median (tokens/s).
        measured: how many configs have a measured value.
        sigma: the run noise the study measured (None: not yet; best.NOISE_FLOOR then).
        model_error: the calibrated model's error (error); None: not known yet, the search goes on.
        best_untried: the calibrated prediction of the fastest untried runnable point (None: none left).
        zone: the indifference zone (hydra.sweeper.indifference).
        untried_count: how many untried runnable points the model ranks: the largest of that many
            errors is what could hide a faster point, so the raise grows as sqrt(2 ln n).

    Returns:
        The line, or None.
    """
    if best is None or measured < MIN_MEASURED or (model_error is None and best_untried is not None):
        return None
    noise = max(sigma or 0.0, best_rule.NOISE_FLOOR)
    bar = best * (1.0 + noise + zone)
    if best_untried is None:
        return f"Search stopped: every point the pre-screen lets run has been tried (best measured {best:.4g} tokens/s)"
    z = max(best_rule.INTERVAL_Z, math.sqrt(2.0 * math.log(max(untried_count, 1))))  # the largest of n errors
    raise_by = math.exp(z * (model_error or 0.0))
    if best_untried * raise_by > bar:
        return None
    return (
        f"Search stopped: the calibrated model predicts no untried point beats the best measured ({best:.4g} tokens/s) "
        f"by more than the noise ({noise:.1%}) plus the indifference zone ({zone:.0%}): the fastest untried is predicted "
        f"at {best_untried:.4g}, x{raise_by:.2f} for the model's measured error"
    )


def flat(estimated: Iterable[Any], zone: float) -> tuple[Any, int, int] | None:
    """(the safest point within `zone` of the predicted fastest, how many runnable points lie within
    the zone, how many are runnable) when at least FLAT_SHARE of the runnable points do; else None."""
    runnable = [f for f in estimated if f.runs and f.fits and f.tokens_per_s]
    if len(runnable) < 2:
        return None
    fastest = max(f.tokens_per_s for f in runnable)
    within = [f for f in runnable if f.tokens_per_s >= (1.0 - zone) * fastest]
    if len(within) < FLAT_SHARE * len(runnable):
        return None
    safest = min(within, key=lambda f: (f.share if f.share is not None else math.inf, -f.tokens_per_s))
    return safest, len(within), len(runnable)


def flat_line(found: tuple[Any, int, int], zone: float) -> str:
    safest, within, runnable = found
    point = " ".join(f"{k}={v}" for k, v in safest.params.items())
    return (
        f"Flat space: the model predicts {within} of the {runnable} points the pre-screen lets run within {zone:.0%} of "
        f"the fastest, so any of them is as good a pick; the sweep runs the safest of them ({point}) to prove it fits"
    )


def measured_records(study: Any) -> tuple[list[dict], float | None, float | None]:
    """(a record per measured config: its first trial's predictions and the median of its runs as
    `tokens_per_s`; the best median; the run noise the study measured), from the study's ok runs."""
    ranked = finalists(study)
    sigma, _ = best_rule.relative_noise(ranked)
    records = [{**f.item.user_attrs, "tokens_per_s": f.median} for f in ranked]
    return records, (ranked[0].median if ranked else None), sigma


def tried_keys(study: Any, queued: bool = True) -> set:
    """point_key of every point the study holds (running, run or pruned; queued too unless `queued`
    is False: the points still waiting then count as untried)."""
    held = [t for t in study.get_trials(deepcopy=False) if queued or t.state.name != "WAITING"]
    return {point_key(p) for p in points(held)}


def flat_proved(study: Any) -> Any | None:
    """The flat space's safest point, once a trial of it ran ok to its end (None before)."""
    return next((t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(Key.START) == "flat" and is_ok(t)), None)


def study_stop_line(study: Any, candidates: list, zone: float, queued: bool = True) -> str | None:
    """stop_line on the study: its measured configs, noise and best, and the calibrated model's
    best untried candidate; or the flat space's line once its safest point ran ok.

    Args:
        study: The study.
        candidates: The forecasts of the space's points.
        zone: The indifference zone (hydra.sweeper.indifference).
        queued: Whether a queued point counts as tried (the sweeper's reading: it runs every queued
            start point). False: the rule as it would read were the waiting points withdrawn.

    Returns:
        The line that ends the search, or None while it should go on.
    """
    proved = flat_proved(study)
    if proved is not None:
        return (
            f"Search stopped: the space is flat and trial {proved.number} ran its safest point to its end "
            f"({proved.value:.4g}): no other point is predicted more than {zone:.0%} faster"
        )
    records, best, sigma = measured_records(study)
    priced = [r for r in records if r.get(PREDICTED)]
    speed = fit(priced)
    ranked = untried(candidates, tried_keys(study, queued), speed, (r[PREDICTED] for r in priced))
    return stop_line(best, len(priced), sigma, error(priced, speed, sigma), ranked[0][0] if ranked else None, zone, len(ranked))


def study_next_point(study: Any, candidates: list) -> dict | None:
    """next_point on the study: the calibrated model refit to every measured config; None while a
    queued trial waits (a start point runs first, as a neighbour move waits for it)."""
    if any(t.state.name == "WAITING" for t in study.get_trials(deepcopy=False)):
        return None
    records = [r for r in measured_records(study)[0] if r.get(PREDICTED)]
    return next_point(candidates, tried_keys(study), fit(records), (r[PREDICTED] for r in records))
