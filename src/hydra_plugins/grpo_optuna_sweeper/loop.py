"""The sweep loop: ask Optuna for points, run them as Hydra jobs, tell the study what happened.

One process or many: every worker runs the same loop against the same storage, asks only while the
study holds fewer finished-or-running trials than its phase's target (the search phase's n_search,
then those plus the confirmation runs queued so far), and waits for other workers' trials before
writing the report, so a study finishes with the same counted trials however many workers shared it
and however often it was interrupted and re-run: n_trials less the confirmation runs left unrun, or
more where confirm_budget let confirmation run past the runs n_trials reserved for it (confirm.py);
n_trials when confirmation, undecidable from the start, gave its reserved runs back to the search.

Phases: the search (n_search trials, a neighbour move queued on its turns), then the confirmation
rounds of the finalists while they are within each other's noise (confirm.py; undecidable from
the start, the search runs on to n_trials instead, neighbour moves included), then the winner's
soak (soak.py, hydra.sweeper.soak_steps), then the report. SIGINT/SIGTERM stop it: at once while a job
runs (the trial is killed with it), else at the next safe point; the trials asked and not told are
failed and re-enqueued, and the report is written.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING

from grpo_sweep.study.attrs import Key, Status
from grpo_sweep.study.storage import StorageUnavailable

from . import confirm, handles, lead, neighbours, soak
from .config import indifference_of
from .failures import systematic_failure
from .plan import Composer, SweepPlan
from .prepare import prepare
from .prescreen import Prescreen
from .progress import Progress, counts
from .report import write_report
from .standings import best_trial
from .start import enqueue_neighbour
from .tables import command_line
from .tell import judge_job, state, tell
from .workers import Heartbeat, duplicate_of, fail_dead_workers, fail_stale_trials, retry, this_worker, waiting_line

if TYPE_CHECKING:
    from types import FrameType

    from hydra.plugins.launcher import Launcher
    from optuna import Study
    from optuna.trial import Trial

    from .failures import Stop
    from .outcome import Outcome

log = logging.getLogger(__name__)


class Interrupted(BaseException):
    """SIGINT/SIGTERM. A BaseException, like KeyboardInterrupt: Hydra's run_job turns any Exception
    raised inside a job into a failed JobReturn, and an interruption must stop the sweep instead."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Loop:
    def __init__(
        self,
        study: Study,
        plan: SweepPlan,
        prescreen: Prescreen,
        launcher: Launcher,
        compose: Composer,
        progress: Progress,
        forecasts: list | None = None,
    ) -> None:
        """The sweep loop over one study.

        Args:
            study: The sweep's study.
            plan: The sweep's plan.
            prescreen: The memory prescreen.
            launcher: The Hydra launcher that runs the trials.
            compose: Composes a trial's config.
            progress: The sweep's progress report.
            forecasts: The models' forecast of the space (start.enqueue_start); None: the sampler alone.
        """
        self.study, self.plan, self.prescreen = study, plan, prescreen
        # The models' forecast of the space (start.enqueue_start): the model-led search ranks its untried
        # points (lead.py); none, or an objective other than tokens/s maximised: the sampler alone.
        settings = plan.settings
        speeds = [f for f in forecasts or [] if f.tokens_per_s]
        led = plan.objective == "tokens_per_s" and settings.direction == "maximize" and settings.sampler != "grid"
        self.candidates = speeds if led else []
        self.zone = indifference_of(settings)
        self.launcher, self.compose, self.progress = launcher, compose, progress
        self.moves = compose.configs  # the neighbour moves' compositions: the sweep's cache (Composer.configs)
        self.job_idx = 0  # Hydra's job index of the next launch
        self.stopped: Stop | None = None  # failures.Stop: a systematic failure ended the sweep
        self.stop_signal: int | None = None  # a signal received outside a job: stop at the next safe point
        self.in_job = False  # a job runs now: a signal stops at once

    def run(self) -> dict:
        """The search phase, the confirmation phase, the report (returned). Exits 1 after a systematic
        failure, 128 + the signal's number when interrupted (the report written either way)."""
        plan = self.plan
        previous = {
            signal.SIGTERM: signal.signal(signal.SIGTERM, self._on_signal),
            signal.SIGINT: signal.signal(signal.SIGINT, self._on_signal),
        }
        try:
            self._phase(plan.n_search, search=True)
            if self.stopped is None and plan.confirm_top:  # the search had n_trials - top x repeats (confirm.py)
                self._confirm()
            if self.stopped is None and plan.settings.get("soak_steps"):
                self._soak(plan.settings.soak_steps)
            if self.stopped is not None:  # the summary ends with the failure's words
                self._report()
                raise SystemExit(1)
        except Interrupted as stop:
            log.warning("Sweep interrupted by %s: its running trials are FAIL and re-enqueued", stop)
            self._report(quiet=True)
            raise SystemExit(128 + stop.signum) from None
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self._report()

    def _confirm(self) -> None:
        """The confirmation phases (confirm.phases): the queued runs first (a resumed sweep's, another
        worker's), then the next round, until the leader is separated, the finalists are within the
        indifference zone, or the budget is spent."""
        plan, settings = self.plan, self.plan.settings
        ended = self.study.user_attrs.get(Key.SEARCH_STOPPED)  # the model-led search ended it early
        confirm.phases(
            self.study,
            top=plan.confirm_top,
            n_trials=plan.n_trials,
            searched=ended["trials"] if ended else plan.n_search,
            budget=settings.confirm_budget,
            run_to=self._run_to,
            log=log,
            zone=self.zone,
            search_done=bool(ended),
        )

    def _run_to(self, target: int, search: bool) -> bool:
        """_phase to `target`; False when a systematic failure stopped the sweep."""
        self._phase(target, search=search)
        return self.stopped is None

    def _soak(self, steps: int) -> None:
        """The winner run `steps` more steps, each step's peak measured (soak.py); recorded on the study."""
        from .workers import worker_dead

        study = self.study
        winner = best_trial(study, self.plan.learning_tolerance)  # the winner best.yaml names
        if winner is None:
            log.info("Soak skipped: no feasible config to soak")
            return
        if not soak.due(study, winner, steps, worker_dead):
            return
        record = {
            "trial": winner.number,
            "steps_asked": steps,
            "status": Status.RUNNING,
            "worker": this_worker(),
            "started_unix": time.time(),
        }
        study.set_user_attr(soak.SOAK_ATTR, record)
        point = list(winner.user_attrs.get(confirm.OVERRIDES_ATTR) or [])
        trial_cfg = self.compose(point).trial  # the trials' own timeout, sized for their trial.steps
        timeout = soak.timeout_s(trial_cfg.timeout_s, trial_cfg.steps, steps)
        overrides = soak.overrides(point, self.plan.settings.study_name, steps, timeout)
        log.info(
            "Soak: trial %d's config runs %d steps within %.0f s, each step's peak measured (not a trial of the study)",
            winner.number,
            steps,
            timeout,
        )
        self.in_job = True
        try:
            self._check_stop()
            (ret,) = self.launcher.launch([overrides], initial_job_idx=self.job_idx)
        except Interrupted as stop:
            resume = soak.resume_command(self.compose.config)
            record = soak.interrupted(record, str(stop), self.plan.sweep_dir / soak.SOAK_DIR, resume)
            study.set_user_attr(soak.SOAK_ATTR, record)
            log.warning(soak.words(record))
            raise
        finally:
            self.in_job = False
        self.job_idx += 1
        record = soak.finish(record, ret)
        study.set_user_attr(soak.SOAK_ATTR, record)
        log.info(soak.words(record))

    def _report(self, quiet: bool = False) -> dict:
        return write_report(self.study, self.plan, self.compose, quiet=quiet, stopped=self.stopped)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """Stop now while a job runs (the trial is killed with it); else at the next safe point, so a
        storage write (a journal append under its lock file) is never cut in half."""
        self.stop_signal = signum
        if self.in_job:
            raise Interrupted(signum)

    def _check_stop(self) -> None:
        if self.stop_signal is not None:
            raise Interrupted(self.stop_signal)

    def _phase(self, target: int, search: bool = False) -> None:
        """Run trials until the study counts `target` (the search phase, then its confirmation runs);
        search: the sampler's trials, with their neighbour moves."""
        study, settings = self.study, self.plan.settings
        waited = False
        while True:
            self._check_stop()
            dead = fail_dead_workers(study, settings.max_retry)  # at once: no grace period to wait out
            stale = fail_stale_trials(study, self.plan.grace_period, settings.max_retry)
            if stale:
                log.warning("Trials %s stopped beating (worker gone): FAIL, re-enqueued", stale)
            if dead:
                log.warning("Trials %s belonged to a worker of this host that is gone (its pid): FAIL, re-enqueued", dead)
            counted, running = counts(study)
            self.prescreen.learn(study)  # every trial told so far (other workers' too) calibrates the next verdicts
            if search and not running and self._search_over(counted):
                return
            room = target - counted - len(running)
            if room <= 0:
                if not running:
                    return
                if not waited:
                    log.info("%d/%d trials done; %s", counted, target, waiting_line(study, running))
                    waited = True
                time.sleep(min(5.0, settings.heartbeat_interval))
                continue
            size = min(settings.n_jobs, room)
            turn = counted + len(running)  # the study's count when this batch's first trial is told
            every, startup = settings.neighbour_every, settings.n_startup_trials
            if search and any(neighbours.due(turn + i, startup, every) for i in range(size)):
                self._model_turn()  # never in place of a confirmation run
            batch = [study.ask() for _ in range(size)]
            for trial in batch:  # at once: a kill from here on leaves a RUNNING trial worker_dead recognises
                trial.set_user_attr(Key.WORKER, this_worker())
            self._run_batch(batch, target)
            self.stopped = self._systematic_failure()
            if self.stopped is not None:
                return

    def _search_over(self, counted: int) -> bool:
        """Whether the search phase is over before its n_search trials: the model-led search said so
        (lead.study_stop_line, recorded on the study with the count, said in one line). Never while a
        start point still waits: it would run as a confirmation run."""
        study = self.study
        if study.user_attrs.get(Key.SEARCH_STOPPED):
            return True
        if not self.candidates or not self.plan.settings.get("search_stop", True):
            return False
        if any(t.state.name == "WAITING" for t in study.get_trials(deepcopy=False)):
            return False
        line = lead.study_stop_line(study, self.candidates, self.zone)
        if line is None:
            return False
        log.info(line)
        study.set_user_attr(Key.SEARCH_STOPPED, {"line": line, "trials": counted})
        return True

    def _model_turn(self) -> None:
        """The model's turn (neighbours.due): the untried point the calibrated model ranks fastest
        (lead.study_next_point), queued; without one (or while a start point waits), a neighbour move of
        the best config so far (which waits for queued points too)."""
        params = lead.study_next_point(self.study, self.candidates) if self.candidates else None
        if params is None:
            enqueue_neighbour(self.study, self.plan, self.prescreen, self.moves)
            return
        self.study.enqueue_trial(params, user_attrs={Key.MODEL_LED: True})
        log.info(
            "Model-led: the calibrated speed model's fastest untried point next: %s",
            " ".join(f"{k}={v}" for k, v in params.items()),
        )

    def _systematic_failure(self) -> Stop | None:

        return systematic_failure(self.study, self.progress.started, self.plan.settings.max_failures_in_a_row, command_line)

    def _tell(self, trial: Trial, outcome: Outcome) -> None:
        tell(self.study, trial, outcome, self.plan.objective, self.progress)

    def _run_batch(self, batch: list[Trial], target: int) -> None:
        study = self.study
        pending = list(batch)  # asked but not yet told: failed and re-enqueued if we are interrupted
        try:
            counted, running = counts(study)
            allowed = target - counted
            launch = []
            for trial in batch:
                # Another worker asked at the same moment. (A trial missing from `running`: the storage's
                # view lags behind our own ask; it ranks after every running trial.)
                rank = running.index(trial.number) if trial.number in running else len(running)
                if rank >= allowed:
                    trial.set_user_attr(Key.STATUS, Status.SURPLUS)
                    study.tell(trial, state=state("FAIL"))
                    pending.remove(trial)
                    continue
                copied = duplicate_of(study, trial)
                if copied is not None:  # a start point queued by two workers at once
                    trial.set_user_attr(Key.STATUS, Status.SURPLUS)
                    trial.set_user_attr(Key.ERROR, f"duplicate of trial {copied} (queued by two workers at once): not run")
                    study.tell(trial, state=state("FAIL"))
                    pending.remove(trial)
                    continue
                prepared = prepare(trial, self.plan, self.prescreen, self.compose)
                prepared.apply(trial)
                if prepared.outcome is not None:
                    self._tell(trial, prepared.outcome)
                    pending.remove(trial)
                else:
                    launch.append((trial, prepared.overrides))
            if not launch:
                return
            self._check_stop()
            with Heartbeat(study, [handles.trial_id(t) for t, _ in launch], self.plan.settings.heartbeat_interval):
                self.in_job = True
                try:
                    returns = self.launcher.launch([o for _, o in launch], initial_job_idx=self.job_idx)
                finally:
                    self.in_job = False
            self.job_idx += len(launch)
            for (trial, _), ret in zip(launch, returns):
                self._tell(trial, judge_job(trial, ret, self.plan.settings, self.plan.objective))
                pending.remove(trial)
        except Interrupted:
            self._abandon(pending, Status.INTERRUPTED)
            raise
        except StorageUnavailable:
            # The storage is away: nothing can be told. The next run (or another worker) releases these
            # trials at once: same host, this pid gone (workers.fail_dead_workers).
            log.error("Trials %s left RUNNING: the storage is unavailable", [t.number for t in pending])
            raise
        except BaseException as err:  # any other death: the trials are released before the sweeper exits
            self._abandon(pending, Status.WORKER_ERROR, f"the sweeper failed: {type(err).__name__}: {err}"[:1000])
            raise

    def _abandon(self, trials: list[Trial], why: str, error: str | None = None) -> None:
        """FAIL and re-enqueue the trials this worker asked and did not tell (best effort, where the
        storage still allows it): a re-run or another worker runs them again.

        Args:
            trials: The trials to release.
            why: The status recorded on each.
            error: The error recorded on each (None: none).
        """
        for trial in trials:
            try:
                trial.set_user_attr(Key.STATUS, why)
                if error:
                    trial.set_user_attr(Key.ERROR, error)
                self.study.tell(trial, state=state("FAIL"))
                retry(self.study, handles.frozen_trial(self.study, trial), self.plan.settings.max_retry)
            except Exception as err:  # noqa: BLE001 - best effort while shutting down
                log.warning("Could not release trial %d: %s", trial.number, err)
