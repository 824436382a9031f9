"""The pre-screen: a point the memory model predicts over budget is not run (PRUNED, told at once).

Its prediction is the estimator's, corrected by what this study measured (calibration.py: the raw
prediction and the fixed margin until enough trials are measured, then the calibrated prediction
and its own allowance). One object per sweep holds what it learned from the study's finished
trials and the neighbour moves it judged under that calibration (a new calibration re-judges them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from grpo_sweep.memory.estimator import estimate
from grpo_sweep.study.attrs import Key

from . import calibration
from .outcome import Outcome, for_sampler, prescreen_verdict

if TYPE_CHECKING:
    from optuna import Study

    from grpo_sweep.memory.estimator import Estimate


class Prescreen:
    def __init__(self, settings: DictConfig) -> None:
        self.settings = settings  # the hydra.sweeper node: prescreen, prescreen_margin, prescreen_calibrate
        self.observations: list[calibration.Observation] = []  # the measured trials it learns from
        self.move_verdicts: dict[tuple, bool] = {}  # a neighbour move's point -> whether it may run

    @property
    def min_trials(self) -> int:
        """Measured trials before the calibration replaces the fixed margin (0: never)."""
        return self.settings.get("prescreen_calibrate", 0)

    def learn(self, study: Study) -> None:
        """Refresh the observations from the study's finished trials (other workers' too)."""
        if not self.settings.prescreen or not self.min_trials:
            self.observations.clear()
            return
        finished = ("COMPLETE", "PRUNED")
        trials = study.get_trials(deepcopy=False)
        learned = calibration.observations(t.user_attrs for t in trials if t.state.name in finished)
        if len(learned) != len(self.observations):
            self.move_verdicts.clear()  # a neighbour move refused before may pass the new calibration
        self.observations[:] = learned

    def calibrated(self, est: Estimate) -> calibration.Calibrated:
        """The estimate corrected by what this study measured (the prior: raw, with the fixed margin)."""
        margin = self.settings.prescreen_margin
        if not self.min_trials:
            return calibration.calibrate(est.phases, est.assumptions["backend"], [], margin)
        return calibration.calibrate(est.phases, est.assumptions["backend"], self.observations, margin, self.min_trials)

    def verdict(self, cfg: DictConfig, budget: float | None, attrs: dict | None = None, est: Any = None) -> Outcome | None:
        """The Outcome of a point that must not run (PRUNED; COMPLETE at the worst value for GP:
        outcome.for_sampler), None for one that may. `budget`: the bytes the point may use where the
        estimate names none. `attrs`: the trial's user attributes to record the prediction in (the
        report's predicted columns; the throughput model's tokens/s is recorded with the pre-screen
        off too: the report ranks the trials by it); None to ask only (a neighbour move's candidate).
        `est`: cfg's estimate when the caller has it already (forecast.py)."""
        if attrs is not None:
            speed = predicted_tokens_per_s(cfg)
            if speed is not None:  # the throughput model (waves charged): the report shows it beside the measured
                attrs[Key.PREDICTED_TOKENS_PER_S] = speed
        if not self.settings.prescreen:
            return None
        try:
            est = est if est is not None else estimate(cfg)
        except Exception as err:  # noqa: BLE001 - a failed estimate only means: run it and see
            if attrs is not None:
                attrs[Key.PREDICTED_ERROR] = str(err)[:300]
            return None
        cal = self.calibrated(est)
        if attrs is not None:
            attrs.update(cal.attrs())
            attrs[Key.PREDICTED_PHASES] = {p: int(v) for p, v in est.phases.items()}
            attrs[Key.GENERATION_WAVES] = est.assumptions.get("generation_waves")
        limit = est.budget_bytes if est.budget_bytes is not None else budget
        verdict = prescreen_verdict(cal.calibrated_bytes, limit, cal.allowance, raw_bytes=cal.raw_bytes, trials=cal.trials)
        return for_sampler(verdict, self.settings.sampler, self.settings.direction)


def predicted_tokens_per_s(cfg: DictConfig) -> float | None:
    """grpo_sweep.memory.throughput's tokens/s for cfg (generation waves charged); None for a card without
    datasheet speeds. A coarse model: it ranks configs, it does not promise a number."""
    from grpo_sweep.memory.throughput import relative_step_time

    try:
        return float(relative_step_time(cfg)["tokens_per_s"])
    except Exception:  # noqa: BLE001 - no speeds for this card (or a config the model cannot price)
        return None
