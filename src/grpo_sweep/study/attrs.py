"""The study's schema: every attribute key and status the sweeper, confirmation, summary and report
share through the Optuna study, and the confirmation state.

Keys and statuses are StrEnums. A member equals its string, and storages keep the string, so a study
written with plain strings loads, resumes and reports as before. This module imports nothing of the
project: metrics.py (the bottom layer) takes its statuses from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    """A trial's outcome: metrics.json's `status` and the trial user attr `status`."""

    # what a trial process records (TRIAL_STATUSES, metrics.STATUSES)
    OK = "ok"
    OOM = "oom"
    FAILED = "failed"
    TIMEOUT = "timeout"
    SLOW = "slow"  # stopped early by trial.stop_below: its peak and partial throughput are real
    # what the sweeper records for a trial that did not run to its end
    INVALID = "invalid"  # rejected before it ran: a missing package or a bad setting
    SURPLUS = "surplus"  # not run: a start point outside the space, or a duplicate of a queued trial
    PRUNED = "pruned"  # not run: the pre-screen predicts it over the allowed memory
    INTERRUPTED = "interrupted"  # the sweep was interrupted while it ran (also the soak's)
    WORKER_DIED = "worker_died"  # the worker running it died
    WORKER_ERROR = "worker_error"  # the sweeper failed while it ran
    # a trial or soak still running, and a queued trial (the report's reading of the study's states)
    RUNNING = "running"
    WAITING = "waiting"


TRIAL_STATUSES = (Status.OK, Status.OOM, Status.FAILED, Status.TIMEOUT, Status.SLOW)
# Statuses of trials that never ran as asked: the failure rule (failures.py) leaves them out.
NOT_RUN = (Status.SURPLUS, Status.INTERRUPTED, Status.PRUNED)


class Key(StrEnum):
    """Every trial and study attribute key (user attrs unless the comment says system attr)."""

    # --- trial user attrs: the outcome (workers.OUTCOME_ATTRS) and the point
    STATUS = "status"
    ERROR = "error"
    RUN_DIR = "run_dir"
    WORKER = "worker"  # the worker that runs the trial (host, pid)
    OVERRIDES = "overrides"  # the point as `python train.py` overrides
    HYDRA_OVERRIDES = "hydra_overrides"
    PRESET = "preset"  # a start point's name
    START_POINT = "frontier_start"  # queued by the memory-first start
    BUDGET_BYTES = "budget_bytes"
    PREDICTED_PEAK_BYTES = "predicted_peak_bytes"
    PEAK_MEMORY_BYTES = "peak_memory_bytes"
    DEFICIT_BYTES = "deficit_bytes"
    DEFICIT_SOURCE = "deficit_source"
    WORLD_SIZE = "world_size"
    STEP_TIME_S = "step_time_s"
    REWARD_MEAN = "reward_mean"
    REWARD_SECONDS_PER_STEP = "reward_seconds_per_step"
    CONFIRMS = "confirms"  # a confirmation run: the config's first trial
    REPEATS = "repeats"  # a search trial the sampler asked for again: the config's first trial
    NEIGHBOUR_OF = "neighbour_of"  # the first trial of the config it moved from
    CONCESSIONS_TAKEN = "concessions_taken"  # {recipe setting: the value this trial used}
    START = "start"  # the start mode that queued it
    MODEL_LED = "model_led"  # queued by the model-led search (lead.py): the calibrated model's next point
    LEVERS = "levers"  # the levers as requested
    STOP_BELOW = "stop_below"  # the early-stop threshold it ran under
    PREDICTED_TOKENS_PER_S = "predicted_tokens_per_s"  # the throughput model's, at the pre-screen
    PREDICTED_ERROR = "predicted_error"  # why the pre-screen has no prediction
    PREDICTED_PHASES = "predicted_phases"  # {phase: predicted peak bytes}
    GENERATION_WAVES = "generation_waves"
    # metrics.json values the trial's outcome copies (outcome.RECORD_ATTRS holds the full list)
    BACKEND = "backend"
    MEMORY_SOURCE = "memory_source"
    PEAK_PHASE = "peak_phase"
    REWARD_CHANGE = "reward_change"
    RANK_PEAK_MEMORY_BYTES = "rank_peak_memory_bytes"
    # --- trial system attrs
    HEARTBEAT = "grpo_sweep:heartbeat"
    CONSTRAINTS = "constraints"  # [bytes over the memory budget], the form optuna-dashboard reads
    FIXED_PARAMS = "fixed_params"  # Optuna's: an enqueued trial's parameters
    RETRY_HISTORY = "retry_history"  # Optuna's: the trials a retried trial repeats
    # --- study user attrs
    OBJECTIVE = "objective"
    RECIPE = "recipe"
    CONCESSIONS = "concessions"
    PRICE_TAGS = "price_tags"
    LEARNING_TOLERANCE = "learning_tolerance"
    MODEL_RANKING = "model_ranking"  # the model's predicted order
    SEARCH_STOPPED = "search_stopped"  # {line, trials}: the model-led search ended the search phase early
    SOAK = "soak"  # what the soak found (trend, verdict, per-step peaks)
    CONFIRMATION = "confirmation"  # ConfirmationState.to_dict()


@dataclass
class ConfirmationState:
    """What the confirmation phase chose, queued and spent, and why it stopped (study attr
    Key.CONFIRMATION). The sweep fields are None before the first round is judged."""

    finalists: list = field(default_factory=list)  # the configs (first trials) that compete
    runs: list[dict] = field(default_factory=list)  # every run queued: confirms, params, preset
    rounds: int = 0
    spent_s: float = 0.0  # the confirmation runs' seconds
    sweep_s: float | None = None  # the sweep's seconds, confirmation runs among them
    budget: float | None = None  # confirm_budget
    sigma: float | None = None  # the measured noise
    leader: Any = None  # the leading config's first trial
    stopped: str | None = None  # why it stopped, in a word
    why: str | None = None  # ... and in a sentence
    chosen: list | None = None  # the finalists it had, once it gave its runs back
    given_back: bool = False  # it ran nothing, and every config competes by its median
    zone: float | None = None  # the indifference zone it judged by (hydra.sweeper.indifference)
    agreed: list | None = None  # the configs whose runs and forecast agreed within the zone: the safest wins

    def to_dict(self) -> dict[str, Any]:
        """The stored form: the keys a round has set, in the order confirmation sets them."""
        out: dict[str, Any] = {"finalists": self.finalists, "runs": self.runs, "rounds": self.rounds, "spent_s": self.spent_s}
        if self.sweep_s is not None:
            out.update(sweep_s=self.sweep_s, budget=self.budget, sigma=self.sigma, leader=self.leader)
        if self.given_back:
            out.update(chosen=self.chosen, given_back=True)
        if self.zone is not None:
            out.update(zone=self.zone)
        if self.agreed:
            out.update(agreed=self.agreed)
        if self.stopped is not None:
            out.update(stopped=self.stopped, why=self.why)
        return out

    @classmethod
    def from_dict(cls, stored: dict | None) -> ConfirmationState | None:
        """The state a study holds (None: confirmation has not chosen yet)."""
        if not stored:
            return None
        names = cls.__dataclass_fields__
        state = cls(**{k: v for k, v in stored.items() if k in names and v is not None})
        state.runs = list(state.runs or [])
        return state
