"""The study a sweep runs in: its storage opened (grpo_sweep.study.storage, the one opener), its
sampler, and its identity recorded on creation and compared on join/resume (identity.py)."""

from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import TYPE_CHECKING

from grpo_sweep.config.user_task import task_identity
from grpo_sweep.credentials import mask_url as mask
from grpo_sweep.study.attrs import Key, Status
from grpo_sweep.study.storage import open_storage, study_names

from . import identity, space
from .config import check_setting
from .plan import SweepPlan
from .progress import counts
from .workers import retry

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from optuna import Study
    from optuna.samplers import BaseSampler

log = logging.getLogger(__name__)


def open_study(plan: SweepPlan, task: DictConfig) -> Study:
    """Open (or create) the plan's study; `task` the config's task node (its identity: data, rewards).
    A study that is another search raises identity.StudyMismatch before any trial."""
    import optuna

    settings = plan.settings
    storage = open_storage(
        plan.storage_url,
        heartbeat_interval=settings.heartbeat_interval,
        grace_period=plan.grace_period,
        stale_trial_callback=functools.partial(retry, max_retry=settings.max_retry),
        retry_s=settings.storage_retry_s,
        may_create_dir=plan.sweep_dir,
    )
    existed = settings.study_name in study_names(storage)
    # Workers sharing a study must not draw the same "random" start-up points: mix in the pid.
    seed = None if settings.seed is None else (int(settings.seed) + os.getpid()) % 2**31
    study = optuna.create_study(
        study_name=settings.study_name,
        storage=storage,
        sampler=build_sampler(settings.sampler, seed, plan.distributions, settings.n_startup_trials),
        direction=settings.direction,
        load_if_exists=True,
    )
    fields = {
        "search_space": identity.space_of(plan.distributions),
        "direction": settings.direction,
        "objective": plan.objective,
        "recipe": plan.recipe,  # equal learning: every trial of a study trains one recipe
        "concessions": sorted(plan.concessions),
        "task": task_identity(task),  # the data (its content too), columns, rewards, weights
    }
    identity.enforce(study, fields, storage=mask(plan.storage_url))
    study.set_user_attr(Key.RECIPE, plan.recipe)  # plain names for the report and readers of the study
    study.set_user_attr(Key.CONCESSIONS, list(plan.concessions))
    if existed:
        log.info(resume_line(study))
    else:
        log.info("New study %r", study.study_name)
    return study


def resume_line(study: Study) -> str:
    """What a resumed study holds: the trials done (those that count toward n_trials,
    progress.counts), then the queued and running ones, each named apart."""
    counted, running = counts(study)
    queued = sum(t.state.name == "WAITING" for t in study.get_trials(deepcopy=False))
    extra = "".join(f", {n} {what}" for n, what in ((queued, "queued"), (len(running), Status.RUNNING)) if n)
    return f"Resuming study {study.study_name!r} with {counted} trial{'' if counted == 1 else 's'} done{extra}"


def build_sampler(name: str, seed: int | None, distributions: dict, n_startup_trials: int = 10) -> BaseSampler:
    """The Optuna sampler for `hydra.sweeper.sampler` (also used by bench/search_efficiency.py).

    Args:
        name: The sampler's name (config.SAMPLERS).
        seed: The sampler's seed, or None.
        distributions: The search space (the grid sampler's choices).
        n_startup_trials: TPE's random trials before it models the study (`hydra.sweeper.n_startup_trials`).

    Returns:
        The sampler.
    """
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
