"""A finished job told to the study: its metrics.json judged (outcome.py) and told to Optuna, with
the trial's result line (`Trial k: COMPLETE ok (tokens_per_s=...) | trial k/N | best ... | ~t left`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_sweep.metrics import MetricsError, read_metrics
from grpo_sweep.study.attrs import Key, Status

from . import handles
from .outcome import Outcome, for_sampler, judge, tell_constraint, timed_steps
from .progress import Progress, counts
from .standings import best_finalist

if TYPE_CHECKING:
    from hydra.core.utils import JobReturn
    from omegaconf import DictConfig
    from optuna import Study
    from optuna.trial import Trial, TrialState

log = logging.getLogger(__name__)


def judge_job(trial: Trial, ret: JobReturn, settings: DictConfig, objective: str) -> Outcome:
    """What to tell for `ret`: its run directory's metrics.json judged, the objective per timed step
    reported as Optuna's intermediate values.

    Args:
        trial: The trial that ran.
        ret: Hydra's JobReturn.
        settings: The hydra.sweeper node.
        objective: The metric the study optimises.

    Returns:
        The Outcome.
    """
    out_dir = None
    if ret.hydra_cfg is not None:
        out_dir = ret.hydra_cfg.hydra.runtime.output_dir
    try:
        record = read_metrics(Path(out_dir)) if out_dir else None
    except MetricsError as err:  # however it is broken: this trial FAILs with the reason, the sweep goes on
        outcome = Outcome("FAIL", attrs={Key.STATUS: Status.FAILED, Key.ERROR: str(err)[:1000], Key.RUN_DIR: str(out_dir)})
        log.warning("Trial %d: %s", trial.number, err)
        return outcome
    outcome = judge(
        record,
        objective=objective,
        direction=settings.direction,
        budget_bytes=trial.user_attrs.get(Key.BUDGET_BYTES),
        headroom=settings.headroom,
    )
    for step, value in timed_steps(record, objective):  # Optuna's intermediate values
        trial.report(value, step)
    outcome = for_sampler(outcome, settings.sampler, settings.direction)
    if record is None and getattr(ret, "status", None) is not None and ret.status.name == "FAILED":
        outcome.attrs[Key.ERROR] = f"job raised: {handles.job_error(ret)!r}"[:1000]
    if out_dir:
        outcome.attrs.setdefault(Key.RUN_DIR, str(out_dir))
    return outcome


def tell(study: Study, trial: Trial, outcome: Outcome, objective: str, progress: Progress) -> None:
    """Record the outcome's attributes and constraint on the trial, tell the study, log the line.

    Args:
        study: The study.
        trial: The trial to tell.
        outcome: Its Outcome.
        objective: The metric the study optimises.
        progress: The progress line's state.
    """
    for key, value in outcome.attrs.items():
        trial.set_user_attr(key, value)
    if outcome.constraint is not None:
        tell_constraint(trial, outcome.constraint)
    values = None if outcome.state != "COMPLETE" else outcome.value
    try:
        study.tell(trial, values, state=state(outcome.state))
    except RuntimeError as err:  # GridSampler calls study.stop() once the grid is exhausted
        if "Study.stop" not in str(err):
            raise
    shown = f"{outcome.value:.1f}" if outcome.value is not None and outcome.state == "COMPLETE" else "-"
    feasible = outcome.constraint is None or outcome.constraint <= 0
    log.info(
        "Trial %d: %s %s (%s=%s%s) | %s",
        trial.number,
        outcome.state,
        outcome.attrs.get(Key.STATUS),
        objective,
        shown,
        "" if feasible else ", infeasible",
        progress_line(study, objective, progress),
    )


def progress_line(study: Study, objective: str, progress: Progress) -> str:
    """`trial k/N | best ... | ~t left` (progress.py); never fails the sweep.

    Args:
        study: The study.
        objective: The metric the study optimises.
        progress: The progress line's state.

    Returns:
        The line.
    """

    try:
        return progress.line(counts(study)[0], best_finalist(study), objective)
    except Exception as err:  # noqa: BLE001 - a progress line is not worth a trial
        return f"progress unavailable ({type(err).__name__})"


def state(name: str) -> TrialState:
    """Optuna's TrialState of that name."""
    from optuna.trial import TrialState

    return TrialState[name]
