"""The sweeper's parts as a sweep sets them up, without launching anything: its plan (always through
plan.build_plan), its composer, its pre-screen and its progress, and the sweeper's own way of
telling a study what happened."""

from __future__ import annotations

import contextlib
import copy
import datetime
from pathlib import Path
from types import SimpleNamespace

SWEEP = "+sweeps=tiny_cpu"


@contextlib.contextmanager
def _master(sweep: str, sweep_dir: Path | None):
    """(the sweep's master config, its Composer) for `python train.py -m <sweep>`, inside Hydra's
    initialised config directory."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext

    from grpo_sweep.config.compose import CONF_DIR
    from grpo_sweep.config.schema import register
    from hydra_plugins.grpo_optuna_sweeper.plan import Composer

    register()
    overrides = [sweep] + ([f"hydra.sweep.dir={sweep_dir}"] if sweep_dir is not None else [])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        master = compose("train", overrides=overrides, return_hydra_config=True)
        yield master, Composer(HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=None), master)


@contextlib.contextmanager
def tiny_sweeper(*params: str, sweep: str = SWEEP, **settings):
    """The sweep of `python train.py -m +sweeps=tiny_cpu [params]` (or another `sweep`) as the sweeper
    sets it up, without launching anything: its plan (plan.build_plan on the master config, with
    `settings` in place of those hydra.sweeper values), its composer (Hydra's config loader) and a
    fresh pre-screen. A plan the sweeper refuses raises here, as the sweep would."""
    from omegaconf import OmegaConf

    from hydra_plugins.grpo_optuna_sweeper.plan import build_plan
    from hydra_plugins.grpo_optuna_sweeper.prescreen import Prescreen

    with _master(sweep, None) as (master, composer):
        conf = OmegaConf.to_container(master.hydra.sweeper, resolve=True)
        conf.pop("_target_")
        conf.update(settings)
        plan = build_plan(OmegaConf.create(conf), master, [sweep, *params], composer)
        yield SimpleNamespace(plan=plan, compose=composer, prescreen=Prescreen(plan.settings))


_PLUGIN_BASE: list = []  # (master config, composer) of plugin_sweeper's sweep, composed once per process


def _plugin_base(sweep_dir: Path):
    """(master config, composer) of `python train.py -m +sweeps=tiny_cpu hydra.sweep.dir=<sweep_dir>`.

    Composed once per test process, then copied with the sweep directory set: plugin_sweeper's plans
    differ only in their settings and directory, and Hydra re-reads every YAML file on each compose
    (two compositions a plan, ~1 s on 2 busy cores). The composer keeps what it composed, by overrides."""
    from omegaconf import OmegaConf, open_dict, read_write

    if not _PLUGIN_BASE:
        with _master(SWEEP, None) as (master, composer):
            composed: dict = {}

            def once(overrides):
                key = tuple(overrides)
                if key not in composed:
                    composed[key] = composer(list(overrides))
                return copy.deepcopy(composed[key])

            once([SWEEP])  # the recipe's composition, while Hydra is initialised
            _PLUGIN_BASE.append((master, once))
    master, once = _PLUGIN_BASE[0]
    master = copy.deepcopy(master)
    with read_write(master), open_dict(master):
        OmegaConf.update(master, "hydra.sweep.dir", str(sweep_dir))
    return master, once


def plugin_sweeper(sweep_dir: Path, *, direction: str = "maximize", objective: str = "tokens_per_s", **settings):
    """The sweeper's parts as sweep() sets them up for `+sweeps=tiny_cpu` in `sweep_dir`, on the
    plugin's default settings (config.GrpoOptunaSweeperConf: not the sweep file's) with these in
    their place: no search space, nothing enqueued, 8 trials, no confirmation, the study `promises`.
    Its plan (plan.build_plan), its pre-screen and its progress, without Hydra's launcher.

    Args:
        sweep_dir: the sweep directory (the plan's journal storage lies in it).
        direction: hydra.sweeper.direction.
        objective: hydra.sweeper.objective.
        **settings: other hydra.sweeper values.
    """
    from omegaconf import OmegaConf

    from hydra_plugins.grpo_optuna_sweeper.config import GrpoOptunaSweeperConf
    from hydra_plugins.grpo_optuna_sweeper.plan import build_plan
    from hydra_plugins.grpo_optuna_sweeper.prescreen import Prescreen
    from hydra_plugins.grpo_optuna_sweeper.progress import Progress

    conf = OmegaConf.to_container(OmegaConf.structured(GrpoOptunaSweeperConf))
    conf.update(params=None, enqueue=[], n_trials=8, confirm_top=0, study_name="promises")
    conf.update(direction=direction, objective=objective, **settings)
    master, compose = _plugin_base(sweep_dir)
    plan = build_plan(OmegaConf.create(conf), master, [SWEEP], compose)
    return SimpleNamespace(
        plan=plan, prescreen=Prescreen(plan.settings), progress=Progress(plan.n_trials, datetime.datetime.now())
    )


def tell_outcome(sweeper, study, trial, outcome) -> None:
    """The loop's tell: the outcome recorded on the trial and told to the study."""
    from hydra_plugins.grpo_optuna_sweeper.tell import tell

    tell(study, trial, outcome, sweeper.plan.objective, sweeper.progress)


def prescreen_point(sweeper, trial, cfg, budget):
    """The pre-screen's verdict on a point, its predictions recorded on the trial as prepare's are:
    the outcome (None: the point may run)."""
    from hydra_plugins.grpo_optuna_sweeper.prepare import Prepared

    verdict = sweeper.prescreen.verdict(cfg, budget)
    Prepared([], dict(verdict.attrs), verdict.outcome).apply(trial)
    return verdict.outcome
