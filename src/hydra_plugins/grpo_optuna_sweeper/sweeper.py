"""The sweep loop: ask Optuna for points, run them as Hydra jobs, tell the study what happened.

One process or many: every worker runs the same loop against the same storage, asks only while the
study holds fewer than `n_trials` finished-or-running trials, and waits for other workers' trials
before writing the report, so a study finishes with exactly `n_trials` counted trials however many
workers shared it and however often it was interrupted and re-run.
"""

from __future__ import annotations

import datetime
import errno
import logging
import os
import signal
import socket
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from grpo_sweep.config.local import validate_here
from grpo_sweep.config.schema import SCHEMA_KEYS
from grpo_sweep.config.user_task import task_identity
from grpo_sweep.credentials import mask_url as mask
from grpo_sweep.levers import recipe_of, requested_levers
from grpo_sweep.memory.estimator import estimate
from grpo_sweep.metrics import MetricsError, read_metrics
from grpo_sweep.study.storage import SWEEP_JOURNAL, StorageError, StorageUnavailable, open_storage, study_names
from grpo_sweep.units import budget_bytes

from . import calibration, concessions, confirm, frontier, handles, identity, neighbours, space
from .config import SweepError, SweeperSettingError, check_setting
from .config import check as check_settings
from .failures import systematic_failure
from .outcome import (
    Outcome,
    allowed_bytes,
    for_sampler,
    judge,
    prescreen_verdict,
    stop_threshold,
    tell_constraint,
    timed_steps,
)
from .progress import Progress
from .workers import Heartbeat, duplicate_of, fail_dead_workers, fail_stale_trials, retry, waiting_line

log = logging.getLogger(__name__)


# Where writing is refused (a read-only file system, permissions) or room is gone: said in one line.
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


class _Interrupted(BaseException):
    """SIGINT/SIGTERM. A BaseException, like KeyboardInterrupt: Hydra's run_job turns any Exception
    raised inside a job into a failed JobReturn, and an interruption must stop the sweep instead."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class GrpoOptunaSweeper(Sweeper):
    def __init__(self, **conf: Any) -> None:
        self.conf = OmegaConf.create(conf)
        self.params = conf.get("params") or {}
        self.concessions = [str(c) for c in (conf.get("concessions") or [])]
        self.recipe: dict = {}  # the recipe every trial trains (_hold_recipe)
        self.concession_params: dict[str, set] = {}  # search parameter -> the recipe settings it changes
        self.may_change: set[str] = set()
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher = None
        self.job_idx = 0
        self._neighbour_configs: frontier.ComposeCache | None = None  # made on the first neighbour move
        # a move's point -> whether it may run (kept until the pre-screen's calibration changes: _learn)
        self._move_verdicts: dict[tuple, bool] = {}
        self._observations: list[calibration.Observation] = []  # the measured trials the pre-screen learns from

    # ---------------------------------------------------------------- Hydra's Sweeper interface
    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.sweep_dir = Path(config.hydra.sweep.dir).absolute()
        self.storage_url = self.conf.storage or f"journal:{self.sweep_dir / SWEEP_JOURNAL}"
        _mask_storage_in(config, self.storage_url)
        slurm_resources(config)
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        try:
            return self._sweep(arguments)
        except StorageUnavailable as err:  # retried for storage_retry_s already: one line, no traceback
            raise SweepError(f"Sweep stopped: {err}") from None
        except OSError as err:  # the sweep directory or its journal cannot be written: one line
            if err.errno not in UNWRITABLE:
                raise
            where = err.filename or self.sweep_dir
            raise SweepError(
                f"Sweep stopped: {where} cannot be written ({err.strerror}); give hydra.sweep.dir (and a journal "
                "storage's file) a place this user can write. What the study holds is kept; the same command resumes it"
            ) from None

    def _sweep(self, arguments: list[str]) -> Any:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # Optuna's study.ask warns on every trial of an RDB storage with a heartbeat that the heartbeat is
        # meant for Study.optimize. We ask/tell ourselves and beat ourselves (workers.Heartbeat): silenced
        # here, once, for that one message.
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        conf = self.conf
        check_settings(conf)  # before the storage opens: a bad value is one line, no traceback
        params_conf = [f"{k}={v}" for k, v in self.params.items()] + list(arguments)
        try:
            self.distributions, fixed = space.parse_space(params_conf, is_integer=self._integer_lever)
            if conf.sampler == "grid":
                space.grid_choices(self.distributions)  # a continuous interval cannot be a grid
        except ValueError as err:  # a bad range: one line naming the parameter, before the storage opens
            raise SweeperSettingError(str(err)) from None
        self.fixed = list(fixed.values())
        self.objective = conf.objective or self.config.get("objective") or "tokens_per_s"
        self._hold_recipe()  # before the storage opens: a recipe change not declared stops here
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, self.sweep_dir / "multirun.yaml")
        try:
            study = self._open_study()
        except StorageUnavailable:
            raise
        except (StorageError, identity.StudyMismatch) as err:  # cannot connect, a missing folder, another search: one line
            raise SweepError(str(err)) from None
        n_trials = conf.n_trials
        if conf.sampler == "grid":
            size = 1
            for values in space.grid_choices(self.distributions).values():
                size *= len(values)
            n_trials = min(n_trials, size)
        self.n_trials = n_trials
        self.confirm_top = confirm.effective_top(n_trials, conf.confirm_top, conf.confirm_repeats, conf.sampler)
        self.n_search = n_trials - self.confirm_top * conf.confirm_repeats
        if conf.confirm_top and not self.confirm_top:
            log.info(confirm.off_reason(n_trials, conf.confirm_top, conf.confirm_repeats, conf.sampler))
        self.progress = Progress(n_trials, datetime.datetime.now())
        self.progress.start(self._progress(study)[0])
        self.stopped = None  # failures.Stop: a systematic failure ended the sweep
        log.info(
            "Study %r in %s: %s %s, %d trials, sampler %s, search space %s",
            study.study_name,
            mask(self.storage_url),
            conf.direction,
            self.objective,
            n_trials,
            conf.sampler,
            ", ".join(self.distributions) or "(empty)",
        )
        self._learn(study)  # a resumed study's measured trials calibrate the pre-screen from the start
        self._enqueue_start(study)
        self._stop_signal, self._in_job = None, False
        previous = {
            signal.SIGTERM: signal.signal(signal.SIGTERM, self._on_signal),
            signal.SIGINT: signal.signal(signal.SIGINT, self._on_signal),
        }
        try:
            self._loop(study, self.n_search)
            if self.stopped is None and self.confirm_top:  # counted in n_trials: the search had n_trials - top x repeats
                plan = confirm.plan(study, self.confirm_top, self.conf.confirm_repeats, log)
                self._loop(study, self.n_search + len(plan))
            if self.stopped is not None:  # the summary ends with the failure's words
                self._write_report(study)
                raise SystemExit(1)
        except _Interrupted as stop:
            log.warning("Sweep interrupted by %s: its running trials are FAIL and re-enqueued", stop)
            self._write_report(study, quiet=True)
            raise SystemExit(128 + stop.signum) from None
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return self._write_report(study)

    def _hold_recipe(self) -> None:
        """Equal learning (concessions.py): the recipe is the sweep's base config (every trial trains it),
        completions_per_step is held (the split batch x accumulation is the knob), and a search parameter
        that changes a recipe setting must be listed in hydra.sweeper.concessions."""
        self.recipe = recipe_of(self._compose(self.fixed))
        concessions.check_list(self.concessions, {k for k in self.distributions if k not in SCHEMA_KEYS}, self.recipe)

        def changes(key: str) -> set[str]:
            if key in SCHEMA_KEYS:
                changed = concessions.setting_changes(key, self.recipe)
                if key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
                    changed.add(concessions.CPS)
                return changed
            out: set[str] = set()  # a config group: what each of its choices changes
            for value in space.grid_choices({key: self.distributions[key]})[key]:
                cfg = self._compose([*self.fixed, space.to_override(key, value)])
                out.update(concessions.diff(self.recipe, recipe_of(cfg)))
            return out

        self.concession_params = concessions.check_space(self.distributions, self.concessions, changes, self.recipe)
        self.may_change = set(self.concessions).union(*self.concession_params.values())
        cps = self.recipe[concessions.CPS]
        if concessions.CPS not in self.concessions:
            held = {concessions.CPS: cps, "gradient_accumulation_steps": None}  # the accumulation is derived
            self.fixed = [o for o in self.fixed if o.split("=", 1)[0].lstrip("+~") not in held]
            self.fixed += [space.to_override(k, v) for k, v in held.items()]
            totals = [cps]
        else:
            dist = self.distributions.get(concessions.CPS)
            totals = list(space.grid_choices({concessions.CPS: dist})[concessions.CPS]) if dist is not None else []
        if totals:
            self.distributions = concessions.divisors_only(self.distributions, totals, log)
        log.info(
            "Recipe held: %s%s",
            " ".join(f"{k}={concessions.fmt(v)}" for k, v in self.recipe.items() if v is not None),
            f"; concessions allowed: {', '.join(self.concessions)}" if self.concessions else " (knobs only)",
        )

    def _on_signal(self, signum, _frame):
        """Stop now while a job runs (the trial is killed with it); else at the next safe point, so a
        storage write (a journal append under its lock file) is never cut in half."""
        self._stop_signal = signum
        if self._in_job:
            raise _Interrupted(signum)

    def _check_stop(self) -> None:
        if self._stop_signal is not None:
            raise _Interrupted(self._stop_signal)

    # ---------------------------------------------------------------- study
    def _open_study(self) -> Any:
        import functools

        import optuna

        conf = self.conf
        grace = conf.grace_period or 4 * conf.heartbeat_interval
        self.grace_period = grace
        storage = open_storage(
            self.storage_url,
            heartbeat_interval=conf.heartbeat_interval,
            grace_period=grace,
            stale_trial_callback=functools.partial(retry, max_retry=conf.max_retry),
            retry_s=conf.storage_retry_s,
            may_create_dir=self.sweep_dir,
        )
        existed = conf.study_name in study_names(storage)
        study = optuna.create_study(
            study_name=conf.study_name,
            storage=storage,
            sampler=self._sampler(),
            direction=conf.direction,
            load_if_exists=True,
        )
        # What this search is (identity.py): recorded on creation, compared on join/resume, before any trial.
        fields = {
            "search_space": identity.space_of(self.distributions),
            "direction": conf.direction,
            "objective": self.objective,
            "recipe": self.recipe,  # equal learning: every trial of a study trains one recipe
            "concessions": sorted(self.concessions),
            "task": task_identity(self.config.task),  # the data (its content too), columns, rewards, weights
        }
        identity.enforce(study, fields, storage=mask(self.storage_url))
        study.set_user_attr("recipe", self.recipe)  # plain names for the report and readers of the study
        study.set_user_attr("concessions", list(self.concessions))
        if existed:
            log.info("Resuming study %r with %d trials", study.study_name, len(study.get_trials(deepcopy=False)))
        else:
            log.info("New study %r", study.study_name)
        return study

    def _integer_lever(self, key: str) -> bool:
        """Whether the config's value at `key` is an integer (an `interval` over it samples integers)."""
        value = OmegaConf.select(self.config, key, default=None, throw_on_missing=False)
        return isinstance(value, int) and not isinstance(value, bool)

    def _sampler(self) -> Any:
        # Workers sharing a study must not draw the same "random" start-up points: mix in the pid.
        seed = None if self.conf.seed is None else (int(self.conf.seed) + os.getpid()) % 2**31
        return build_sampler(self.conf.sampler, seed, self.distributions, self.conf.n_startup_trials)

    def _enqueue_start(self, study: Any) -> None:
        """Queue the start points: the presets (warm_start), the `enqueue` points, then the frontier.

        Never more than the search phase has room for (n_search less what the study already counts,
        runs or queues): a queued point the search never reaches would stay WAITING, and the
        confirmation phase would then run it in place of a confirmation run. The points left out are
        named in a warning (raise hydra.sweeper.n_trials to run them)."""
        conf = self.conf
        if conf.warm_start:
            self._enqueue_presets(study)
        left_out = []
        for i, point in enumerate(conf.enqueue):
            params = OmegaConf.to_container(point)
            outside = self._outside_space(params)
            if outside:  # the held recipe (or the space) leaves no room for it: dropped, never a failed trial
                log.info("Start point enqueue[%d]=%s dropped: %s", i, params, outside)
                continue
            if self._room(study, self.n_search) <= 0 and not _in_study(study, params):
                left_out.append(f"enqueue[{i}]={params}")
                continue
            study.enqueue_trial(params, skip_if_exists=True)
        if left_out:
            log.warning(
                "Start points not queued: the search phase has %d trials (n_trials=%d less %d confirmation runs) "
                "and no room left for %s; raise hydra.sweeper.n_trials to run them",
                self.n_search,
                self.n_trials,
                self.n_trials - self.n_search,
                ", ".join(left_out),
            )
        frontier_count = min(conf.frontier_start, self._room(study, self.n_search))
        if frontier_count > 0:
            self._enqueue_frontier(study, frontier_count)

    def _outside_space(self, params: dict) -> str | None:
        """Why a start point cannot be asked in this search space (a value the held recipe's divisors
        or the space's range leave out), or None when every one of its values is in it."""
        for key, value in params.items():
            dist = self.distributions.get(key)
            if dist is not None and not space.representable(dist, value):
                return f"{key}={value} is not in the space this sweep searches ({space.describe(dist)})"
        return None

    def _enqueue_presets(self, study: Any) -> None:
        """Queue each seed preset once per study, with its levers as parameters where they fit the space
        (while the search phase has room: see _enqueue_start)."""
        queued = {t.user_attrs.get("preset") for t in study.get_trials(deepcopy=False)}
        for preset in self.conf.presets:
            if preset in queued:
                continue
            if self._room(study, self.n_search) <= 0:
                log.warning(
                    "Warm start: preset=%s not queued: the search phase's %d trials are already taken; "
                    "raise hydra.sweeper.n_trials to run it",
                    preset,
                    self.n_search,
                )
                continue
            cfg = self._compose([*self.fixed, f"preset={preset}"])
            undeclared = sorted(set(concessions.diff(self.recipe, recipe_of(cfg))) - self.may_change)
            if undeclared:
                log.warning(
                    "Warm start: preset=%s not queued: it changes the recipe's %s, not in hydra.sweeper.concessions",
                    preset,
                    ", ".join(undeclared),
                )
                continue
            try:
                validate_here(cfg)  # e.g. its micro-batch does not divide the held completions_per_step
            except Exception as err:  # noqa: BLE001 - a preset the held recipe cannot run is not queued
                log.info("Warm start: preset=%s not queued: %s", preset, str(err).splitlines()[0])
                continue
            params = {}
            for key, dist in self.distributions.items():
                value = OmegaConf.select(cfg, key, default=None)
                if value is not None and space.representable(dist, value):
                    params[key] = value
            study.enqueue_trial(params, user_attrs={"preset": preset})
            log.info("Warm start: enqueued preset=%s", preset)

    def _enqueue_frontier(self, study: Any, count: int) -> None:
        """Queue (once per study) the `count` points predicted to fill the allowed memory best (frontier.py)."""
        if any(t.user_attrs.get("frontier_start") for t in study.get_trials(deepcopy=False)):
            return
        if self.conf.sampler == "grid" or not self.distributions:
            return  # the grid sampler runs every point anyway; nothing to search: nothing to start from
        try:
            choices = space.grid_choices(self.distributions, purpose="the frontier start")
        except ValueError as why:  # on by default: a continuous space is not an error
            log.info("Frontier start skipped: %s", why)
            return
        fullness = []
        configs = self._compose_cache()  # one composition per distinct group choice, not one per candidate
        for params in frontier.candidates(choices, self.conf.seed):
            try:
                cfg = configs.config([*self.fixed, *(space.to_override(k, v) for k, v in params.items())])
                validate_here(cfg)
                est = estimate(cfg)
            except Exception:  # noqa: BLE001 - a point that cannot be composed or estimated is not a pick
                continue
            budget = est.budget_bytes if est.budget_bytes is not None else budget_bytes(cfg)
            limit = allowed_bytes(budget, self.conf.headroom)
            if limit is None:
                log.info("Frontier start skipped: the config has no memory budget (gpu.memory_gib)")
                return
            # The calibrated prediction (raw until the study has measured trials: a resumed study's count).
            predicted = self._calibrated(est).calibrated_bytes if self.conf.prescreen else est.total_bytes
            full = predicted / limit
            # A fit whose generation runs in N waves (vLLM's KV cache holds fewer sequences than the batch) is
            # slower in proportion: it counts 1/N as full, so the fullest *fast* fits start the search.
            waves = est.assumptions.get("generation_waves") or 1
            fullness.append((params, full / waves if full <= 1 else full))
        if not fullness:
            log.info(
                "Frontier start skipped: none of the space's points could be composed, checked and estimated "
                "(each is refused as it would be when run: see the first trials' errors)"
            )
            return
        picks = frontier.pick(fullness, count, self.conf.seed)
        if not picks:
            log.info(
                "Frontier start: none of the %d candidates is predicted to fit the allowed memory; "
                "the search starts from sampled points",
                len(fullness),
            )
            return
        for params in picks:
            study.enqueue_trial(params, user_attrs={"frontier_start": True}, skip_if_exists=True)
        log.info(
            "Frontier start: enqueued %d of %d candidates, fullest predicted fit first: %s",
            len(picks),
            len(fullness),
            "; ".join(" ".join(f"{k}={v}" for k, v in p.items()) for p in picks),
        )

    def _enqueue_neighbour(self, study: Any) -> None:
        """Queue one neighbour move of the best config so far (neighbours.py), when there is one: a
        point that composes, passes validate_here and is not pruned by the pre-screen (_prescreen)."""
        if self.conf.sampler == "grid" or not self.distributions:
            return
        try:
            choices = space.grid_choices(self.distributions)
        except ValueError:
            return  # a continuous space: no steps to take
        if self._neighbour_configs is None:
            self._neighbour_configs = self._compose_cache()
        configs, verdicts = self._neighbour_configs, self._move_verdicts

        def runs(point: dict) -> bool:  # what _prepare would launch: it composes, passes the checks, is not pruned
            key = neighbours.point_key(point)
            if key not in verdicts:
                try:
                    cfg = configs.config([*self.fixed, *(space.to_override(k, v) for k, v in point.items())])
                    validate_here(cfg)
                    verdicts[key] = self._prescreen(None, cfg, budget_bytes(cfg)) is None
                except Exception:  # noqa: BLE001 - a point that cannot be composed or checked is not a move
                    verdicts[key] = False
            return verdicts[key]

        move = neighbours.enqueue(study, choices, runs, self.conf.seed)
        if move is not None:
            moved = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in move["moved"].items())
            repair = " (a repair: one of the two alone would not pass the pre-screen)" if len(move["moved"]) > 1 else ""
            log.info(
                "Neighbour move: trial %d's config (the best so far with a move left) with %s%s", move["from"], moved, repair
            )

    def _compose_cache(self) -> frontier.ComposeCache:
        """A frontier.ComposeCache over `_compose`. A key is a config group as Hydra decides it (its
        repository has the group) or where the sweep's own config chose one (hydra.runtime.choices);
        calling a group a value would be wrong, calling a value a group only costs a composition."""
        chosen = set(self.config.hydra.runtime.choices) if OmegaConf.select(self.config, "hydra.runtime.choices") else set()

        def is_group(key: str) -> bool:
            return key in chosen or handles.group_exists(self.hydra_context, key) is not False

        return frontier.ComposeCache(self._compose, is_group)

    def _room(self, study: Any, target: int) -> int:
        """Trials still to start before the study counts `target`: not counted, running or queued yet."""
        counted, running = self._progress(study)
        waiting = sum(t.state.name == "WAITING" for t in study.get_trials(deepcopy=False))
        return target - counted - len(running) - waiting

    def _progress(self, study: Any) -> tuple[int, list[int]]:
        """(trials that count toward n_trials, numbers of RUNNING trials).

        Counted: COMPLETE, PRUNED, and FAIL unless the failure was retried (a killed worker's or an
        interrupted trial: its re-run counts instead) or the trial was a surplus never run.
        """
        from optuna.trial import TrialState

        trials = study.get_trials(deepcopy=False)
        retried = {n for t in trials for n in (t.system_attrs.get("retry_history") or [])}
        counted = 0
        for t in trials:
            finished = t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            failed_for_good = t.state == TrialState.FAIL and t.number not in retried and t.user_attrs.get("status") != "surplus"
            if finished or failed_for_good:
                counted += 1
        running = sorted(t.number for t in trials if t.state == TrialState.RUNNING)
        return counted, running

    # ---------------------------------------------------------------- the loop
    def _loop(self, study: Any, target: int) -> None:
        """Run trials until the study counts `target` (the search phase, then its confirmation runs)."""
        waited = False
        while True:
            self._check_stop()
            dead = fail_dead_workers(study, self.conf.max_retry)  # at once: no grace period to wait out
            stale = fail_stale_trials(study, self.grace_period, self.conf.max_retry)
            if stale:
                log.warning("Trials %s stopped beating (worker gone): FAIL, re-enqueued", stale)
            if dead:
                log.warning("Trials %s belonged to a worker of this host that is gone (its pid): FAIL, re-enqueued", dead)
            counted, running = self._progress(study)
            self._learn(study)  # every trial told so far (other workers' too) calibrates the next verdicts
            room = target - counted - len(running)
            if room <= 0:
                if not running:
                    return
                if not waited:
                    log.info("%d/%d trials done; %s", counted, target, waiting_line(study, running))
                    waited = True
                time.sleep(min(5.0, self.conf.heartbeat_interval))
                continue
            size = min(self.conf.n_jobs, room)
            turn = counted + len(running)  # the study's count when this batch's first trial is told
            every, startup = self.conf.neighbour_every, self.conf.n_startup_trials
            if target == self.n_search and any(neighbours.due(turn + i, startup, every) for i in range(size)):
                self._enqueue_neighbour(study)  # search phase only: never in place of a confirmation run
            batch = [study.ask() for _ in range(size)]
            self._run_batch(study, batch, target)
            self.stopped = self._systematic_failure(study)
            if self.stopped is not None:
                return

    def _systematic_failure(self, study: Any) -> Any:
        from .summary import command_line

        return systematic_failure(study, self.progress.started, self.conf.max_failures_in_a_row, command_line)

    def _run_batch(self, study: Any, batch: list, target: int | None = None) -> None:
        pending = list(batch)  # asked but not yet told: failed and re-enqueued if we are interrupted
        try:
            counted, running = self._progress(study)
            allowed = (self.n_trials if target is None else target) - counted
            launch = []
            for trial in batch:
                # Another worker asked at the same moment. (A trial missing from `running`: the storage's
                # view lags behind our own ask; it ranks after every running trial.)
                rank = running.index(trial.number) if trial.number in running else len(running)
                if rank >= allowed:
                    trial.set_user_attr("status", "surplus")
                    study.tell(trial, state=_state("FAIL"))
                    pending.remove(trial)
                    continue
                copied = duplicate_of(study, trial)
                if copied is not None:  # a start point queued by two workers at once
                    trial.set_user_attr("status", "surplus")
                    trial.set_user_attr("error", f"duplicate of trial {copied} (queued by two workers at once): not run")
                    study.tell(trial, state=_state("FAIL"))
                    pending.remove(trial)
                    continue
                overrides, outcome = self._prepare(trial)
                if outcome is not None:
                    self._tell(study, trial, outcome)
                    pending.remove(trial)
                else:
                    launch.append((trial, overrides))
            if not launch:
                return
            self._check_stop()
            with Heartbeat(study, [handles.trial_id(t) for t, _ in launch], self.conf.heartbeat_interval):
                self._in_job = True
                try:
                    returns = self.launcher.launch([o for _, o in launch], initial_job_idx=self.job_idx)
                finally:
                    self._in_job = False
            self.job_idx += len(launch)
            for (trial, _), ret in zip(launch, returns):
                self._tell(study, trial, self._judge(trial, ret))
                pending.remove(trial)
        except _Interrupted:
            self._abandon(study, pending, "interrupted")
            raise
        except StorageUnavailable:
            # The storage is away: nothing can be told. The next run (or another worker) releases these
            # trials at once: same host, this pid gone (workers.fail_dead_workers).
            log.error("Trials %s left RUNNING: the storage is unavailable", [t.number for t in pending])
            raise
        except BaseException as err:  # any other death: the trials are released before the sweeper exits
            self._abandon(study, pending, "worker_error", f"the sweeper failed: {type(err).__name__}: {err}"[:1000])
            raise

    def _abandon(self, study: Any, trials: list, why: str, error: str | None = None) -> None:
        """FAIL and re-enqueue the trials this worker asked and did not tell (best effort, where the
        storage still allows it): a re-run or another worker runs them again."""
        for trial in trials:
            try:
                trial.set_user_attr("status", why)
                if error:
                    trial.set_user_attr("error", error)
                study.tell(trial, state=_state("FAIL"))
                retry(study, handles.frozen_trial(study, trial), self.conf.max_retry)
            except Exception as err:  # noqa: BLE001 - best effort while shutting down
                log.warning("Could not release trial %d: %s", trial.number, err)

    # ---------------------------------------------------------------- one trial
    def _prepare(self, trial: Any) -> tuple[list[str], Outcome | None]:
        """Suggest the point, compose and check it; an Outcome when it must not run (invalid, pruned)."""
        preset = trial.user_attrs.get("preset")
        outside = None if preset else self._outside_space(_fixed_params(trial))
        if outside:  # queued by an earlier run of this study under another held recipe: not a point of this search
            return [], Outcome("FAIL", attrs={"status": "surplus", "error": f"start point dropped: {outside}"})
        params = {}
        for key, dist in self.distributions.items():
            if preset and not _fixed_in(trial, key):
                continue  # a preset trial runs the preset's own value for levers outside the space
            params[key] = handles.suggest(trial, key, dist)
        point = list(self.fixed)  # what `python train.py ...` needs to run this point again
        if preset:
            point.append(f"preset={preset}")
        point += [space.to_override(k, v) for k, v in params.items()]
        overrides = point + [
            space.to_override("trial.study", self.conf.study_name),
            f"trial.number={trial.number}",
            f"hydra.sweep.subdir=trial_{trial.number:04d}",
        ]
        overrides += self._stop_override(trial)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        trial.set_user_attr("overrides", point)
        if trial.user_attrs.get(confirm.CONFIRMS_ATTR) is None:
            confirm.mark_repeat(trial.study, trial, point)  # the same point again: its runs pool with the first's
        cfg = None
        try:
            cfg = self._compose(overrides)
            validate_here(cfg)  # resolves the split (gradient_accumulation_steps from completions_per_step)
        except Exception as err:  # noqa: BLE001 - an invalid point is a FAIL, not a dead sweep
            if cfg is not None:
                trial.set_user_attr("levers", requested_levers(cfg))
            return overrides, Outcome("FAIL", attrs={"status": "invalid", "error": str(err)[:1000]})
        trial.set_user_attr("levers", requested_levers(cfg))
        recipe = recipe_of(cfg)
        taken = concessions.diff(self.recipe, recipe)
        trial.set_user_attr(concessions.TAKEN_ATTR, taken)
        trial.set_user_attr(concessions.CPS, recipe[concessions.CPS])
        undeclared = sorted(set(taken) - self.may_change)
        if undeclared:
            error = f"changes the recipe's {', '.join(undeclared)}, not in hydra.sweeper.concessions: not run"
            return overrides, Outcome("FAIL", attrs={"status": "invalid", "error": error})
        budget = budget_bytes(cfg)
        if budget is not None:
            trial.set_user_attr("budget_bytes", budget)
        outcome = self._prescreen(trial, cfg, budget)
        attrs = trial.user_attrs
        if outcome is None and "predicted_calibrated_bytes" in attrs:  # metrics.json records what the pre-screen used
            keys = calibration.Calibrated.attr_keys()
            overrides.append("++" + space.to_override("trial.prescreen", {k: attrs[k] for k in keys if k in attrs}))
        return overrides, outcome

    def _stop_override(self, trial: Any) -> list[str]:
        """`trial.stop_below=<tokens/s>` (stop_below x the best feasible so far) for a search trial;
        never for a confirmation run (it must run to its end) or before any trial is feasible."""
        if trial.user_attrs.get("confirms") is not None:
            return []
        from .summary import best_finalist

        best = best_finalist(trial.study) if self.conf.stop_below else None
        threshold = stop_threshold(best.median if best else None, self.conf.stop_below, self.objective, self.conf.direction)
        if threshold is None:
            return []
        trial.set_user_attr("stop_below", threshold)
        return [f"trial.stop_below={threshold:.6g}"]

    def _learn(self, study: Any) -> None:
        """Refresh the pre-screen's observations from the study's finished trials (calibration.py)."""
        if not self.conf.prescreen or not self.conf.get("prescreen_calibrate", 0):
            self._observations = []
            return
        finished = ("COMPLETE", "PRUNED")
        trials = study.get_trials(deepcopy=False)
        learned = calibration.observations(t.user_attrs for t in trials if t.state.name in finished)
        if len(learned) != len(self._observations):
            self._move_verdicts.clear()  # a neighbour move refused before may pass the new calibration
        self._observations = learned

    def _calibrated(self, est: Any) -> calibration.Calibrated:
        """The estimate corrected by what this study measured (the prior: raw, with the fixed margin)."""
        margin = self.conf.prescreen_margin
        min_trials = self.conf.get("prescreen_calibrate", 0)
        if not min_trials:
            return calibration.calibrate(est.phases, est.assumptions["backend"], [], margin)
        return calibration.calibrate(est.phases, est.assumptions["backend"], self._observations, margin, min_trials)

    def _prescreen(self, trial: Any | None, cfg: DictConfig, budget: float | None) -> Outcome | None:
        """PRUNE a point the estimator predicts over budget by more than the allowance (never run it):
        the raw prediction and the fixed margin until the study has measured enough trials, then the
        calibrated prediction and its own allowance (calibration.py).
        trial: where the prediction is recorded; None to ask only (a neighbour move's candidate)."""
        if not self.conf.prescreen:
            return None
        try:
            est = estimate(cfg)
        except Exception as err:  # noqa: BLE001 - a failed estimate only means: run it and see
            if trial is not None:
                trial.set_user_attr("predicted_error", str(err)[:300])
            return None
        cal = self._calibrated(est)
        if trial is not None:
            for key, value in cal.attrs().items():
                trial.set_user_attr(key, value)
            trial.set_user_attr("predicted_phases", {p: int(v) for p, v in est.phases.items()})
            trial.set_user_attr("generation_waves", est.assumptions.get("generation_waves"))
            speed = _predicted_tokens_per_s(cfg)
            if speed is not None:  # the throughput model (waves charged): the report shows it beside the measured
                trial.set_user_attr("predicted_tokens_per_s", speed)
        limit = est.budget_bytes if est.budget_bytes is not None else budget
        verdict = prescreen_verdict(cal.calibrated_bytes, limit, cal.allowance, raw_bytes=cal.raw_bytes, trials=cal.trials)
        return for_sampler(verdict, self.conf.sampler, self.conf.direction)

    def _judge(self, trial: Any, ret: Any) -> Outcome:
        out_dir = None
        if getattr(ret, "hydra_cfg", None) is not None:
            out_dir = ret.hydra_cfg.hydra.runtime.output_dir
        try:
            record = read_metrics(Path(out_dir)) if out_dir else None
        except MetricsError as err:  # however it is broken: this trial FAILs with the reason, the sweep goes on
            outcome = Outcome("FAIL", attrs={"status": "failed", "error": str(err)[:1000], "run_dir": str(out_dir)})
            log.warning("Trial %d: %s", trial.number, err)
            return outcome
        outcome = judge(
            record,
            objective=self.objective,
            direction=self.conf.direction,
            budget_bytes=trial.user_attrs.get("budget_bytes"),
            headroom=self.conf.headroom,
        )
        for step, value in timed_steps(record, self.objective):  # Optuna's intermediate values
            trial.report(value, step)
        outcome = for_sampler(outcome, self.conf.sampler, self.conf.direction)
        if record is None and getattr(ret, "status", None) is not None and ret.status.name == "FAILED":
            outcome.attrs["error"] = f"job raised: {handles.job_error(ret)!r}"[:1000]
        if out_dir:
            outcome.attrs.setdefault("run_dir", str(out_dir))
        return outcome

    def _tell(self, study: Any, trial: Any, outcome: Outcome) -> None:
        for key, value in outcome.attrs.items():
            trial.set_user_attr(key, value)
        if outcome.constraint is not None:
            tell_constraint(trial, outcome.constraint)
        values = None if outcome.state != "COMPLETE" else outcome.value
        try:
            study.tell(trial, values, state=_state(outcome.state))
        except RuntimeError as err:  # GridSampler calls study.stop() once the grid is exhausted
            if "Study.stop" not in str(err):
                raise
        shown = f"{outcome.value:.1f}" if outcome.value is not None and outcome.state == "COMPLETE" else "-"
        feasible = outcome.constraint is None or outcome.constraint <= 0
        log.info(
            "Trial %d: %s %s (%s=%s%s) | %s",
            trial.number,
            outcome.state,
            outcome.attrs.get("status"),
            self.objective,
            shown,
            "" if feasible else ", infeasible",
            self._progress_line(study),
        )

    def _progress_line(self, study: Any) -> str:
        """`trial k/N | best ... | ~t left` (progress.py); never fails the sweep."""
        from .summary import best_finalist

        try:
            return self.progress.line(self._progress(study)[0], best_finalist(study), self.objective)
        except Exception as err:  # noqa: BLE001 - a progress line is not worth a trial
            return f"progress unavailable ({type(err).__name__})"

    # ---------------------------------------------------------------- helpers
    def _compose(self, overrides: Sequence[str]) -> DictConfig:
        cfg = handles.load_sweep_config(self.hydra_context, self.config, overrides)
        with read_write(cfg), open_dict(cfg):
            cfg.pop("hydra", None)
        return cfg

    def _write_report(self, study: Any, quiet: bool = False) -> Any:
        from .summary import write_summary

        tags = self._price_tags(study) if self.concessions or self._any_taken(study) else None
        return write_summary(
            study,
            self.sweep_dir,
            recipe=self.recipe,
            price_tags=tags,
            storage_url=self.storage_url,
            objective=identity.objective_of(study, self.objective),  # the one the study was created with
            fixed=self.fixed,
            top_k=self.conf.top_k,
            headroom=self.conf.headroom,
            quiet=quiet,
            stopped=getattr(self, "stopped", None),
        )

    def _any_taken(self, study: Any) -> bool:
        return any(t.user_attrs.get(concessions.TAKEN_ATTR) for t in study.get_trials(deepcopy=False))

    def _price_tags(self, study: Any) -> dict | None:
        """concessions.price_tags for this study: what the winner gave up and what it bought. Never fails
        the sweep (the trials and best.yaml matter more): on an error it says why instead."""
        from grpo_sweep.memory.throughput import relative_step_time

        from .summary import _is_ok, finalists

        def predict(overrides: list[str]) -> tuple[Any, Any]:
            cfg = self._compose(overrides)
            validate_here(cfg)
            return cfg, estimate(cfg)

        def estimate_recipe() -> dict | None:
            try:
                cfg, est = predict(self.fixed)
            except Exception:  # noqa: BLE001 - no estimate: the reason says so
                return None
            return {"peak_bytes": est.total_bytes, "budget_bytes": est.budget_bytes or budget_bytes(cfg)}

        def estimate_without(trial: Any, setting: str) -> dict | None:
            point = list(trial.user_attrs.get("overrides") or [])
            try:
                cfg_used, used = predict(point)
                cfg_back, back = predict([*point, space.to_override(setting, self.recipe[setting])])
            except Exception:  # noqa: BLE001 - unpriced: said in the row
                return None
            out = {"peak_bytes": back.total_bytes, "fits": bool(back.fits)}
            try:
                out["tokens_per_s_ratio"] = (
                    relative_step_time(cfg_used)["tokens_per_s"] / relative_step_time(cfg_back)["tokens_per_s"]
                )
            except Exception:  # noqa: BLE001 - a card without speeds: memory only
                pass
            return out

        try:
            ranked = finalists(study)
            winner = ranked[0] if ranked else None
            median = {m.number: float(f.median) for f in ranked for m in f.members}  # a trial counts by its config
            tags = concessions.price_tags(
                study.get_trials(deepcopy=False),
                self.recipe,
                set(self.concession_params),
                is_ok=_is_ok,
                maximize=self.conf.direction == "maximize",
                best=winner.item if winner else None,
                best_value=float(winner.median) if winner else None,
                estimate_without=estimate_without,
                estimate_recipe=estimate_recipe,
                value_of=lambda t: median.get(t.number, t.value),
            )
        except Exception as err:  # noqa: BLE001 - see the docstring
            return {"error": f"{type(err).__name__}: {err}"}
        study.set_user_attr("price_tags", tags)  # the report's Concessions section
        return tags


def slurm_resources(config: DictConfig) -> int | None:
    """hydra/launcher=submitit_slurm asks SLURM for what a trial of N processes needs: one task per trial
    (torchrun inside the job starts the ranks) and, unless the user set hydra.launcher.gpus_per_node, as
    many GPUs as the largest trial.num_processes the sweep can run (the fixed value or its choices), plus
    backend.vllm_mode=server's own devices. submitit reads its resources once per sweep, hence the largest.
    Returns the GPUs asked for (None: not a SLURM launcher, or the user's own value stands)."""
    launcher = OmegaConf.select(config, "hydra.launcher")
    if launcher is None or not str(launcher.get("_target_", "")).endswith("SlurmLauncher"):
        return None
    if launcher.get("gpus_per_node") is not None:
        return None
    key = "trial.num_processes"
    counts = [int(OmegaConf.select(config, key, default=1) or 1)]
    entries = [f"{k}={v}" for k, v in (OmegaConf.select(config, "hydra.sweeper.params") or {}).items() if k == key]
    entries += [o for o in (OmegaConf.select(config, "hydra.overrides.task") or []) if o.split("=", 1)[0] == key]
    for entry in entries:
        dists, fixed = space.parse_space([entry])
        counts += [int(v) for d in dists.values() for v in space.grid_choices({key: d})[key]]
        counts += [int(f.split("=", 1)[1]) for f in fixed.values()]
    gpus = max(counts)
    if OmegaConf.select(config, "backend.vllm_mode", default="colocate") == "server":
        gpus += len(OmegaConf.select(config, "trial.vllm_devices", default=None) or [])
    with read_write(config), open_dict(config):
        config.hydra.launcher.gpus_per_node = gpus
        config.hydra.launcher.tasks_per_node = 1
    log.info(
        "SLURM: %d GPU(s) per trial job (the largest trial.num_processes%s)",
        gpus,
        " + the vLLM server's" if gpus > max(counts) else "",
    )
    return gpus


def _predicted_tokens_per_s(cfg: DictConfig) -> float | None:
    """grpo_sweep.memory.throughput's tokens/s for cfg (generation waves charged); None for a card without
    datasheet speeds. A coarse model: it ranks configs, it does not promise a number."""
    from grpo_sweep.memory.throughput import relative_step_time

    try:
        return float(relative_step_time(cfg)["tokens_per_s"])
    except Exception:  # noqa: BLE001 - no speeds for this card (or a config the model cannot price)
        return None


def build_sampler(name: str, seed: int | None, distributions: dict, n_startup_trials: int = 10) -> Any:
    """The Optuna sampler for `hydra.sweeper.sampler` (also used by bench/search_efficiency.py).

    n_startup_trials: TPE's random trials before it models the study (`hydra.sweeper.n_startup_trials`)."""
    import optuna

    check_setting("n_startup_trials", n_startup_trials)
    check_setting("sampler", name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=n_startup_trials)
        if name == "gp":
            return optuna.samplers.GPSampler(seed=seed)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "grid":
            return optuna.samplers.GridSampler(space.grid_choices(distributions), seed=seed)
    raise AssertionError(name)  # config.SAMPLERS names one more than this function builds


def _state(name: str) -> Any:
    from optuna.trial import TrialState

    return TrialState[name]


def _in_study(study: Any, params: dict) -> bool:
    """Whether a trial of the study already has `params` (queued, running or run: enqueue_trial's
    skip_if_exists skips it, so it needs no room)."""
    return params in neighbours.points(study.get_trials(deepcopy=False))


def _fixed_params(trial: Any) -> dict:
    """The values the trial was enqueued with (Optuna keeps them in `fixed_params`)."""
    return handles.fixed_params(trial)


def _fixed_in(trial: Any, key: str) -> bool:
    """Whether the trial was enqueued with a value for `key`."""
    return key in _fixed_params(trial)


def _mask_storage_in(config: DictConfig, url: str) -> None:
    """Keep a storage password out of every config Hydra writes (job .hydra/hydra.yaml, multirun.yaml).

    Jobs never open the storage (only this sweeper does), so they can carry the masked URL.
    """
    masked = mask(url)
    if masked == url:
        return
    with read_write(config), open_dict(config):
        raw = OmegaConf.to_container(config.hydra.sweeper, resolve=False).get("storage")
        if raw is not None and "${" not in str(raw):
            config.hydra.sweeper.storage = masked
        config.hydra.overrides.hydra = [
            mask(o) if o.split("=", 1)[0].lstrip("+~") == "hydra.sweeper.storage" else o for o in config.hydra.overrides.hydra
        ]
