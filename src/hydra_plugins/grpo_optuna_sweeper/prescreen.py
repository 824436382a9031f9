"""The pre-screen: a point the memory model predicts over budget is not run (PRUNED, told at once).

Its prediction is the estimator's, corrected by what this study measured (calibration.py: the raw
prediction and the fixed margin until enough trials are measured, then the calibrated prediction
and its own allowance). One object per sweep holds what it learned from the study's finished
trials and the neighbour moves it judged under that calibration (a new calibration re-judges them).

`Prescreen.verdict` owns the verdict and writes nothing: it returns a frozen `Verdict` (the Outcome
or None, and the prediction's attributes), and the caller records those (prepare.py on the trial).
Speed is not its business: forecast.predicted_tokens_per_s is the throughput model's.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from grpo_sweep.memory.estimator import estimate
from grpo_sweep.study.attrs import Key

from . import calibration
from .outcome import Outcome, for_sampler, prescreen_verdict

if TYPE_CHECKING:
    from optuna import Study

    from grpo_sweep.memory.estimator import Estimate


@dataclass(frozen=True)
class Verdict:
    """The pre-screen's answer on one point.

    `outcome`: what to tell instead of running it (PRUNED; COMPLETE at the worst value for GP:
    outcome.for_sampler); None: run it. `attrs`: the prediction for the caller to record (the report's
    predicted columns; empty with the pre-screen off). `calibrated`: the prediction it judged by
    (None when it judged nothing: the pre-screen off, or no estimate)."""

    outcome: Outcome | None = None
    attrs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    calibrated: calibration.Calibrated | None = None

    @property
    def runs(self) -> bool:
        return self.outcome is None


class Prescreen:
    def __init__(self, settings: DictConfig) -> None:
        self.settings = settings  # the hydra.sweeper node: prescreen, prescreen_margin, prescreen_calibrate
        self.observations: list[calibration.Observation] = []  # the measured trials it learns from
        self.move_verdicts: dict[tuple, bool] = {}  # a neighbour move's point -> whether it may run

    @property
    def min_trials(self) -> int:
        """Measured trials before the calibration replaces the fixed margin (0: never)."""
        return self.settings.get("prescreen_calibrate", 0)

    def learn(self, study: "Study") -> None:
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

    def calibrated(self, est: "Estimate") -> calibration.Calibrated:
        """The estimate corrected by what this study measured (the prior: raw, with the fixed margin)."""
        margin = self.settings.prescreen_margin
        if not self.min_trials:
            return calibration.calibrate(est.phases, est.assumptions["backend"], [], margin)
        return calibration.calibrate(est.phases, est.assumptions["backend"], self.observations, margin, self.min_trials)

    def verdict(self, cfg: DictConfig, budget: float | None, est: "Estimate | None" = None) -> Verdict:
        """The Verdict on cfg. A failed estimate lets the point run: the error is its one attribute.

        Args:
            cfg: The point's composed config.
            budget: The bytes the point may use where the estimate names none.
            est: cfg's estimate when the caller has it already (forecast.py).

        Returns:
            The Verdict.
        """
        if not self.settings.prescreen:
            return Verdict()
        try:
            est = est if est is not None else estimate(cfg)
        except Exception as err:  # noqa: BLE001 - a failed estimate only means: run it and see
            return Verdict(attrs=MappingProxyType({Key.PREDICTED_ERROR: str(err)[:300]}))
        cal = self.calibrated(est)
        attrs = {
            **cal.attrs(),
            Key.PREDICTED_PHASES: {p: int(v) for p, v in est.phases.items()},
            Key.GENERATION_WAVES: est.assumptions.get("generation_waves"),
        }
        limit = est.budget_bytes if est.budget_bytes is not None else budget
        pruned = prescreen_verdict(cal.calibrated_bytes, limit, cal.allowance, raw_bytes=cal.raw_bytes, trials=cal.trials)
        outcome = for_sampler(pruned, self.settings.sampler, self.settings.direction)
        return Verdict(outcome, MappingProxyType(attrs), cal)
