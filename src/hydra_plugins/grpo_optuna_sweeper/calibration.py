"""The pre-screen learns from every trial it measures: a correction of the estimator's raw prediction.

Pure functions over what the study already holds (each finished trial's user attributes), so every
worker of a study computes the same correction, and a resumed study picks up where it left off.

- An observation is one measured trial: its measured peak over the estimator's raw prediction for the
  phase that peaked (`peak_phase`: generation, or forward/backward/optimiser = training), per
  backend. An OOM trial gives a lower bound: it needed at least budget + deficit; it is used as if it
  were the peak (conservative only in the sense that the true ratio is at least that).
- `correct` fits, for one (backend, phase), the mean and spread of log(measured / predicted) over the
  trials of that backend and phase; with fewer than `min_trials` of them, over that backend's trials
  in any phase; with fewer still, the prior: factor 1 and the fixed `prescreen_margin` as the
  allowance. Calibrated, the allowance is a one-sided prediction interval for the next trial's
  ratio: z x sd x sqrt(1 + 1/n), at least `FLOOR` (0.5 %): wide when the trials disagree, narrow
  when they agree, whatever the fixed margin was.
- `calibrate` applies the corrections to each predicted phase and takes the larger phase: the
  calibrated peak. The pre-screen prunes when calibrated > limit x (1 + allowance)
  (outcome.prescreen_verdict).

No `from __future__ import annotations` here: Hydra's plugin scan executes this module outside
sys.modules, where dataclasses cannot resolve string annotations.
"""

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TypeGuard

from grpo_sweep.metrics import PRESCREEN_KEYS
from grpo_sweep.study.attrs import Key, Status

MIN_TRIALS = 3  # trials of a backend (and phase) before its correction replaces the prior
Z = 1.645  # one-sided 95 % of a normal: the allowance covers the next trial's ratio 19 times in 20
FLOOR = 0.005  # the smallest allowance: the estimator's CPU median error (0.2 %) with room
TRAINING_PHASES = ("forward", "backward", "optimiser", "other", "training")


@dataclass(frozen=True)
class Observation:
    backend: str
    phase: str  # training | generation (the estimator's phases)
    predicted: float  # the raw prediction for that phase (bytes)
    measured: float  # the measured peak (an OOM: at least budget + deficit)
    lower_bound: bool = False

    @property
    def log_ratio(self) -> float:
        return math.log(self.measured / self.predicted)


@dataclass(frozen=True)
class Correction:
    factor: float  # multiply the raw prediction by this
    allowance: float  # prune only above limit x (1 + allowance)
    trials: int  # observations it rests on (0: the prior)
    scope: str  # "backend/phase", "backend" or "prior"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Calibrated:
    raw_bytes: int
    calibrated_bytes: int
    factor: float  # calibrated / raw
    allowance: float
    trials: int
    scope: str
    phase: str  # the phase that sets the calibrated peak

    @staticmethod
    def attr_keys() -> tuple[str, ...]:
        return ("predicted_peak_bytes", *PRESCREEN_KEYS)

    def attrs(self) -> dict:
        """The user attributes (and trials.csv columns / metrics.json keys) a prediction leaves."""
        return {
            "predicted_peak_bytes": self.raw_bytes,
            "predicted_calibrated_bytes": self.calibrated_bytes,
            "prescreen_correction": round(self.factor, 6),
            "prescreen_allowance": round(self.allowance, 6),
            "prescreen_calibration_trials": self.trials,
            "prescreen_calibration_scope": self.scope,
        }


def estimator_phase(measured_phase: str | None) -> str | None:
    """The estimator's phase for a measured peak_phase (trial/measure/memory_meter.py's names)."""
    if measured_phase == "generation":
        return "generation"
    if measured_phase in TRAINING_PHASES:
        return "training"
    return None


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def observation(attrs: dict) -> Observation | None:
    """One finished trial's observation from its user attributes (the sweeper's attrs: predicted_phases,
    budget_bytes; the record's backend, status, peak_memory_bytes, memory_source, peak_phase,
    deficit_bytes). None when the trial measured nothing the estimator's prediction compares with:
    no prediction, a failure, or a peak that is process RSS rather than device memory."""
    phases = attrs.get(Key.PREDICTED_PHASES)
    backend = attrs.get(Key.BACKEND)
    status = attrs.get(Key.STATUS)
    if not isinstance(phases, dict) or not backend or status not in (Status.OK, Status.SLOW, Status.OOM):
        return None
    if str(attrs.get(Key.MEMORY_SOURCE) or "").startswith("cpu-rss"):
        return None
    phase = estimator_phase(attrs.get(Key.PEAK_PHASE)) or max(phases, key=lambda p: phases[p])
    predicted = phases.get(phase)
    if not _number(predicted):
        return None
    if status == Status.OOM:
        budget, deficit = attrs.get(Key.BUDGET_BYTES), attrs.get(Key.DEFICIT_BYTES)
        if not (_number(budget) and _number(deficit)):
            return None
        return Observation(str(backend), phase, float(predicted), float(budget + deficit), lower_bound=True)
    peak = attrs.get(Key.PEAK_MEMORY_BYTES)
    if not _number(peak):
        return None
    return Observation(str(backend), phase, float(predicted), float(peak))


def observations(all_attrs: Iterable[dict]) -> list[Observation]:
    return [o for o in (observation(a) for a in all_attrs) if o is not None]


def _fit(obs: list[Observation], scope: str) -> Correction:
    """The correction the log ratios of `obs` give: their mean, and a margin of Z standard deviations.

    Args:
        obs: The observations to fit, at least one.
        scope: What the observations cover, recorded on the correction.

    Returns:
        The fitted Correction.
    """
    logs = [o.log_ratio for o in obs]
    n = len(logs)
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1)) if n > 1 else 0.0
    return Correction(math.exp(mean), max(Z * sd * math.sqrt(1 + 1 / n), FLOOR), n, scope)


def correct(obs: list[Observation], backend: str, phase: str, margin: float, min_trials: int = MIN_TRIALS) -> Correction:
    """The correction for `backend`'s `phase`: from that phase's trials, else the backend's, else the prior.

    Args:
        obs: The measured trials' observations.
        backend: The generation backend whose trials count.
        phase: The phase whose peak is corrected.
        margin: The prior's margin, used until enough trials back a fit.
        min_trials: The trials a fit needs.

    Returns:
        The Correction, its scope naming what backs it.
    """
    same = [o for o in obs if o.backend == backend and o.phase == phase]
    if len(same) >= min_trials:
        return _fit(same, "backend/phase")
    backend_obs = [o for o in obs if o.backend == backend]
    if len(backend_obs) >= min_trials:
        return _fit(backend_obs, "backend")
    return Correction(1.0, margin, 0, "prior")


def calibrate(phases: dict, backend: str, obs: list[Observation], margin: float, min_trials: int = MIN_TRIALS) -> Calibrated:
    """The calibrated peak for a prediction.

    Args:
        phases: The estimator's bytes per phase.
        backend: The generation backend the point runs.
        obs: The measured trials' observations.
        margin: The prior's margin, used until enough trials back a fit.
        min_trials: The trials a fit needs.

    Returns:
        The Calibrated prediction: the highest corrected phase, its allowance and what backs it.
    """
    raw = max(phases.values())
    judged = []
    for phase, predicted in phases.items():
        corr = correct(obs, backend, phase, margin, min_trials)
        judged.append((predicted * corr.factor, corr, phase))
    value, corr, phase = max(judged, key=lambda j: j[0])  # of equal peaks, the first phase
    return Calibrated(
        raw_bytes=int(raw),
        calibrated_bytes=int(round(value)),
        factor=value / raw if raw else 1.0,
        allowance=corr.allowance,
        trials=corr.trials,
        scope=corr.scope,
        phase=phase,
    )
