"""The sweep's plan: what a sweep decides from its config before the storage opens, frozen.

`build_plan` is the one place that reads hydra.sweeper and the search space: the settings checked,
the space parsed, the recipe held (equal learning, concessions.py), completions_per_step held and
the micro-batches shrunk to its divisors, and the counts (search trials, confirmation finalists).
Everything after it (the study, the start points, each trial, the loop, the report) reads the plan
and never changes it, so no step depends on another having run first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from grpo_sweep.config.schema import SCHEMA_KEYS
from grpo_sweep.levers import recipe_of
from grpo_sweep.study.storage import SWEEP_JOURNAL

from . import concessions, confirm, handles, space
from .compose import ComposeCache
from .config import SweeperSettingError, check_study_name
from .config import check as check_settings
from .launch_config import rerun_overrides

if TYPE_CHECKING:
    from hydra.types import HydraContext

    from .space import Distribution

log = logging.getLogger(__name__)

# The split of the held completions_per_step: the accumulation is derived from it and the micro-batch.
SPLIT = ("per_device_train_batch_size", "gradient_accumulation_steps")


@dataclass(frozen=True)
class SweepPlan:
    settings: DictConfig  # the hydra.sweeper node, read-only (config.GrpoOptunaSweeperConf)
    distributions: dict[str, Distribution]  # search parameter -> Optuna distribution (micro-batches: divisors only)
    fixed: tuple[str, ...]  # the overrides every trial gets (the held completions_per_step among them)
    recipe: dict[str, Any]  # what every trial trains (levers.recipe_of the base config)
    concessions: tuple[str, ...]  # hydra.sweeper.concessions: the recipe settings a trial may change
    concession_params: dict[str, frozenset[str]]  # search parameter -> the recipe settings it changes
    may_change: frozenset[str]  # every recipe setting a trial may change (the concessions and their parameters')
    n_trials: int  # hydra.sweeper.n_trials (a grid: at most its size)
    n_search: int  # of those, the search phase's (n_trials less the runs reserved for confirmation)
    confirm_top: int  # finalists confirmed (0: off; confirm.effective_top)
    objective: str  # the metric optimised (metrics.json key)
    sweep_dir: Path
    storage_url: str
    # hydra.sweeper.learning_tolerance: the relative departure that flags a trial as having changed the
    # learning (grpo_sweep.report.learning); None: per trial precision
    learning_tolerance: float | None = None
    # the command line's Hydra settings a single run of a point needs (hydra.searchpath, ...):
    # launch_config.rerun_overrides; they lead the printed command that reruns a trial
    hydra_overrides: tuple[str, ...] = ()

    @property
    def grace_period(self) -> int:
        """Seconds a running trial may go without a heartbeat before another worker fails it."""
        return self.settings.grace_period or 4 * self.settings.heartbeat_interval

    def refusal(self, recipe: dict) -> str | None:
        """Why the sweeper refuses a point that trains `recipe` (levers.recipe_of its config): the
        recipe settings it changes that hydra.sweeper.concessions does not allow; None when it may run.
        The one copy of the rule: a trial (prepare), the start points and the plan all ask it."""
        undeclared = undeclared_changes(self.recipe, recipe, self.may_change)
        if not undeclared:
            return None
        return f"changes the recipe's {', '.join(undeclared)}, not in hydra.sweeper.concessions"


def undeclared_changes(held: dict, recipe: dict, may_change: Collection[str]) -> list[str]:
    """The recipe settings `recipe` changes from the `held` one that `may_change` does not allow: the
    sweeper's rule for refusing a point.

    Args:
        held: The held recipe.
        recipe: A point's recipe.
        may_change: The concessions and their parameters' settings.

    Returns:
        The settings changed without leave.
    """
    return sorted(set(concessions.diff(held, recipe)) - set(may_change))


def storage_url(settings: DictConfig, sweep_dir: Path) -> str:
    """hydra.sweeper.storage, or the journal file in the sweep directory."""
    return settings.storage or f"journal:{sweep_dir / SWEEP_JOURNAL}"


class Composer:
    """A job's config for a list of overrides, as Hydra composes it for the launcher (without its
    `hydra` node), and the composition cache over it (ComposeCache).

    `configs` is the sweep's one cache: the plan and every trial's check (prepare) read their configs
    from it, so a sweep whose points share their group choices composes once, not once per trial.
    The master config never changes during a sweep, so a composition stays valid for its whole run."""

    def __init__(self, hydra_context: HydraContext, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        runtime = OmegaConf.select(config, "hydra.runtime.choices")
        self.chosen = frozenset(config.hydra.runtime.choices) if runtime else frozenset()
        self._groups: dict[str, bool] = {}  # key -> is_group's answer: the repository is fixed for the sweep
        self.configs = self.cache()

    def __call__(self, overrides: Sequence[str]) -> DictConfig:
        cfg = handles.load_sweep_config(self.hydra_context, self.config, list(overrides))
        with read_write(cfg), open_dict(cfg):
            cfg.pop("hydra", None)
        return cfg

    def is_group(self, key: str) -> bool:
        """Whether `key` is a config group: the sweep's own config chose one there, or Hydra's
        repository has the group. Calling a group a value would be wrong, calling a value a group
        only costs a composition: unknown (no repository) is a group."""
        if key not in self._groups:
            self._groups[key] = key in self.chosen or handles.group_exists(self.hydra_context, key) is not False
        return self._groups[key]

    def cache(self) -> ComposeCache:
        """A new cache: one composition per distinct set of group choices (ComposeCache)."""
        return ComposeCache(self, self.is_group)


def cached(compose: Callable[[list[str]], DictConfig]) -> ComposeCache:
    """The cache to read configs from: a Composer's own (`configs`), or a new one over a plain
    callable; one without `is_group` composes every override (each key taken for a group: exact,
    one composition per distinct list)."""
    configs = getattr(compose, "configs", None)
    if isinstance(configs, ComposeCache):
        return configs
    return ComposeCache(compose, getattr(compose, "is_group", lambda _key: True))


def build_plan(
    settings: DictConfig, config: DictConfig, arguments: Sequence[str], compose: Callable[[list[str]], DictConfig]
) -> SweepPlan:
    """The plan for `python train.py -m <arguments>`. A bad setting, a bad range or a recipe change not
    declared is one line (SweeperSettingError, concessions), before the storage opens and before any model loads.

    Args:
        settings: The hydra.sweeper node.
        config: The sweep's master config.
        arguments: The command line's overrides.
        compose: A job's config for overrides (Composer).

    Returns:
        The SweepPlan.
    """
    check_settings(settings)
    node = OmegaConf.select(config, "hydra.sweeper")
    # the node as written (unresolved); to_container of a DictConfig is a dict
    written = cast(dict, OmegaConf.to_container(node, resolve=False)) if isinstance(node, DictConfig) else {}
    check_study_name(written.get("study_name"))
    params = [f"{k}={v}" for k, v in (settings.get("params") or {}).items()] + list(arguments)

    def is_integer(key: str) -> bool:  # an `interval` over an integer lever samples integers
        value = OmegaConf.select(config, key, default=None, throw_on_missing=False)
        return isinstance(value, int) and not isinstance(value, bool)

    try:
        distributions, fixed = space.parse_space(params, is_integer=is_integer)
        if settings.sampler == "grid":
            space.grid_choices(distributions)  # a continuous interval cannot be a grid
    except ValueError as err:
        raise SweeperSettingError(str(err)) from None
    declared = tuple(str(c) for c in (settings.get("concessions") or []))
    recipe, concession_params, fixed_held, distributions = _hold_recipe(declared, distributions, list(fixed.values()), compose)
    check_enqueue(settings.get("enqueue") or [], distributions)
    n_trials = settings.n_trials
    if settings.sampler == "grid":
        size = 1
        for values in space.grid_choices(distributions).values():
            size *= len(values)
        n_trials = min(n_trials, size)
    top = confirm.effective_top(n_trials, settings.confirm_top, settings.confirm_repeats, settings.sampler)
    if settings.confirm_top and not top:
        log.info(confirm.off_reason(n_trials, settings.confirm_top, settings.confirm_repeats, settings.sampler))
    sweep_dir = Path(config.hydra.sweep.dir).absolute()
    frozen = cast(DictConfig, OmegaConf.create(OmegaConf.to_container(settings, resolve=True)))  # from a dict: a DictConfig
    OmegaConf.set_readonly(frozen, True)
    return SweepPlan(
        settings=frozen,
        distributions=distributions,
        fixed=tuple(fixed_held),
        recipe=recipe,
        concessions=declared,
        concession_params={k: frozenset(v) for k, v in concession_params.items()},
        may_change=frozenset(declared).union(*concession_params.values()),
        n_trials=n_trials,
        n_search=n_trials - top * settings.confirm_repeats,
        confirm_top=top,
        objective=settings.objective or config.get("objective") or "tokens_per_s",
        sweep_dir=sweep_dir,
        storage_url=storage_url(settings, sweep_dir),
        learning_tolerance=settings.get("learning_tolerance"),
        hydra_overrides=tuple(rerun_overrides(config)),
    )


# Searched beside the micro-batch, these decide what a micro-batch does to the recipe (the accumulation
# and the optimiser steps one generation feeds: levers.recipe_of), so no micro-batch is judged alone.
_SPLIT_PARTNERS = (
    "completions_per_step",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "trial.num_processes",
    "loss_type",
)


def _split_keeping_recipe(
    distributions: dict, fixed: list[str], configs: ComposeCache, recipe: dict, may_change: set[str]
) -> dict:
    """Keep only the micro-batches that keep the held recipe, when the micro-batch alone decides it
    (no partner setting or config group searched beside it): with steps_per_generation fixed above
    a micro-batch's accumulation, one generation would feed several optimiser steps, a recipe change
    the sweeper refuses (SweepPlan.refusal's rule), so such a micro-batch is never proposed, as a
    micro-batch that does not divide the held completions_per_step is not (divisors_only).

    Args:
        distributions: The search space.
        fixed: The overrides held fixed.
        configs: The plan's composed configs (cached).
        recipe: The held recipe.
        may_change: The settings the concessions allow to change.

    Returns:
        The space without those micro-batches.
    """
    from optuna.distributions import CategoricalDistribution

    key = SPLIT[0]
    dist = distributions.get(key)
    others = [k for k in distributions if k != key]
    if not isinstance(dist, CategoricalDistribution) or len(dist.choices) < 2:
        return distributions
    if any(k in _SPLIT_PARTNERS or k not in SCHEMA_KEYS for k in others):
        return distributions
    changed = {}
    for value in dist.choices:
        undeclared = undeclared_changes(recipe, recipe_of(configs.config([*fixed, space.to_override(key, value)])), may_change)
        if undeclared:
            changed[value] = undeclared
    if not changed:
        return distributions
    keep = [v for v in dist.choices if v not in changed]
    settings = sorted({s for names in changed.values() for s in names})
    if not keep:
        raise SweeperSettingError(
            f"hydra.sweeper.params.{key}={list(dist.choices)}: every value changes the recipe's {', '.join(settings)}, "
            f"not in hydra.sweeper.concessions; fix the setting that makes it so, or list it in hydra.sweeper.concessions"
        )
    log.info(
        "Recipe held: %s %s dropped (they change the recipe's %s, not in hydra.sweeper.concessions; never proposed)",
        key,
        list(changed),
        ", ".join(settings),
    )
    return {**distributions, key: CategoricalDistribution(keep)}


def check_enqueue(points: Sequence[Any], distributions: dict) -> None:
    """Every key of every `enqueue` point is a parameter the sweep searches: a trial sets only the
    searched ones, so any other value would be dropped without a word. One line otherwise."""
    for i, point in enumerate(points):
        for key in point:
            if key not in distributions:
                raise SweeperSettingError(
                    f"hydra.sweeper.enqueue[{i}].{key}={point[key]}: not a parameter this sweep searches "
                    f"(search space: {', '.join(distributions) or 'empty'}); search it in hydra.sweeper.params, "
                    "or set it for every trial as a plain override"
                )


def _hold_recipe(declared: tuple[str, ...], distributions: dict, fixed: list[str], compose: Callable) -> tuple:
    """Equal learning (concessions.py): the recipe is the sweep's base config (every trial trains it),
    completions_per_step is held (the split batch x accumulation is the knob), and a search parameter
    that changes a recipe setting must be listed in hydra.sweeper.concessions.

    Args:
        declared: The hydra.sweeper.concessions entries.
        distributions: The search space.
        fixed: The overrides held fixed.
        compose: A job's config for overrides.

    Returns:
        (recipe, concession_params, fixed, distributions).
    """
    configs = cached(compose)  # the base config composed once, for the recipe, the groups and the split
    recipe = recipe_of(configs.config(fixed))
    concessions.check_list(
        list(declared), {k for k in distributions if k not in SCHEMA_KEYS and "." not in k}, recipe, set(distributions)
    )

    def changes(key: str) -> set[str]:
        if key in SCHEMA_KEYS or "." in key:  # a setting (a config group is a top-level name)
            changed = concessions.setting_changes(key, recipe)
            if key in SPLIT:
                changed.add(concessions.CPS)
            return changed
        out: set[str] = set()  # a config group: what each of its choices changes
        for value in space.grid_choices({key: distributions[key]})[key]:
            cfg = configs.config([*fixed, space.to_override(key, value)])
            out.update(concessions.diff(recipe, recipe_of(cfg)))
        return out

    concession_params = concessions.check_space(distributions, list(declared), changes, recipe)
    cps = recipe[concessions.CPS]
    if concessions.CPS not in declared:
        held = {concessions.CPS: cps, "gradient_accumulation_steps": None}  # the accumulation is derived
        fixed = [o for o in fixed if o.split("=", 1)[0].lstrip("+~") not in held]
        fixed += [space.to_override(k, v) for k, v in held.items()]
        totals = [cps]
    else:
        dist = distributions.get(concessions.CPS)
        totals = list(space.grid_choices({concessions.CPS: dist})[concessions.CPS]) if dist is not None else []
    if totals:
        distributions = concessions.divisors_only(distributions, totals, log)
    may_change = set(declared).union(*concession_params.values())
    distributions = _split_keeping_recipe(distributions, fixed, configs, recipe, may_change)
    log.info(
        "Recipe held: %s%s",
        " ".join(f"{k}={concessions.fmt(v)}" for k, v in recipe.items() if v is not None),
        f"; concessions allowed: {', '.join(declared)}" if declared else " (knobs only)",
    )
    return recipe, concession_params, fixed, distributions
