"""Every private Optuna and Hydra name the sweeper uses, each behind one function that says why.

Neither library offers these through a public API. Keeping them here means an upgrade that renames
one breaks one function, and tests/test_handles.py calls each against a real in-memory study and a
real config loader, so such an upgrade fails a fast test instead of a sweep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_sweep.study.attrs import Key

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override, ParsedElementType
    from hydra.core.utils import JobReturn
    from hydra.types import HydraContext
    from omegaconf import DictConfig
    from optuna import Study
    from optuna.distributions import BaseDistribution
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial, Trial

# ---------------------------------------------------------------- Optuna


def suggest(trial: Trial, key: str, dist: BaseDistribution) -> Any:
    """`trial._suggest(key, dist)`: the space holds Optuna distributions already (space.parse_space);
    the public suggest_* methods would rebuild each one from its bounds and lose nothing but time,
    and there is no public suggest for an arbitrary distribution.

    Args:
        trial: The trial to suggest for.
        key: The parameter's name.
        dist: Its distribution.

    Returns:
        The suggested value.
    """
    return trial._suggest(key, dist)


def fixed_params(trial: Trial) -> dict:
    """The values a trial was enqueued with (enqueue_trial keeps them in the system attribute
    `fixed_params` of the trial's cached frozen copy; a live Trial has no public view of it)."""
    return dict(trial._cached_frozen_trial.system_attrs.get(Key.FIXED_PARAMS) or {})


def cached_frozen(trial: Trial | FrozenTrial) -> FrozenTrial:
    """A live Trial's cached frozen copy (`trial._cached_frozen_trial`), a FrozenTrial as it is: the
    system attributes (fixed_params, failed_trial) a live Trial has no public view of, without a
    storage read."""
    from optuna.trial import FrozenTrial

    return trial if isinstance(trial, FrozenTrial) else trial._cached_frozen_trial


def trial_id(trial: Trial | FrozenTrial) -> int:
    """The storage's id of a trial (`_trial_id`): storage calls (heartbeats, failing another
    worker's trial, system attributes) take the id, and Trial and FrozenTrial keep it private."""
    return trial._trial_id


def storage_of(study: Study) -> BaseStorage:
    """The study's storage (`study._storage`): failing and re-enqueueing a trial this worker did not
    ask (a dead worker's), heartbeats and system attributes are storage calls."""
    return study._storage


def frozen_trial(study: Study, trial: Trial | FrozenTrial) -> FrozenTrial:
    """The trial as the storage holds it now (`study._storage.get_trial`); study.trials copies every
    trial of the study for one."""
    return storage_of(study).get_trial(trial_id(trial))


def contains(dist: BaseDistribution, value: Any) -> bool:
    """Whether `value` lies in `dist` (`dist._contains` on its internal form): the one check Optuna's
    distributions make themselves, steps and log scales included."""
    return bool(dist._contains(dist.to_internal_repr(value)))


# ---------------------------------------------------------------- Hydra


def load_sweep_config(hydra_context: HydraContext, config: DictConfig, overrides: list[str]) -> DictConfig:
    """A job's config for `overrides`, composed as Hydra's launchers compose it
    (`config_loader.load_sweep_config`): the sweep checks a point before it launches it.

    Args:
        hydra_context: Hydra's context, holding the config loader.
        config: The sweep's master config.
        overrides: The job's overrides.

    Returns:
        The job's config.
    """
    return hydra_context.config_loader.load_sweep_config(config, list(overrides))


def group_exists(hydra_context: HydraContext, key: str) -> bool | None:
    """Whether Hydra reads `key` as a config group (`config_loader.repository.group_exists`); None
    where the loader has no repository (then the caller must assume a group: compose.ComposeCache)."""
    repository = getattr(hydra_context.config_loader, "repository", None)
    return None if repository is None else bool(repository.group_exists(key))


def apply_overrides(overrides: list[Override], cfg: DictConfig) -> None:
    """Apply parsed value overrides to a composed config in place
    (`ConfigLoaderImpl._apply_overrides_to_config`): the very function composition uses, so a cached
    composition gives the same config and the same errors (compose.ComposeCache)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


def override_value(value: ParsedElementType) -> str:
    """A value in Hydra's override grammar (`Override._get_value_element_as_str`): quoting and
    escaping as Hydra itself writes a value back."""
    from hydra.core.override_parser.types import Override

    return Override._get_value_element_as_str(value)


def job_error(ret: JobReturn) -> Any:
    """What a failed job raised (`JobReturn._return_value`): the public `return_value` re-raises it."""
    return ret._return_value
