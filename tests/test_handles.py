"""The private Optuna and Hydra names the sweeper relies on (hydra_plugins/grpo_optuna_sweeper/handles.py),
each called on a real in-memory study or a real Hydra config loader: an upgrade that renames one
fails here, in seconds, not in a sweep."""

from __future__ import annotations

import pytest

from hydra_plugins.grpo_optuna_sweeper import handles


def test_optuna_handles_on_a_real_study():
    import optuna
    from optuna.distributions import CategoricalDistribution, IntDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"b": 4})
    trial = study.ask()
    assert handles.fixed_params(trial) == {"b": 4}
    cached = handles.cached_frozen(trial)
    assert cached.number == trial.number and cached.system_attrs["fixed_params"] == {"b": 4}
    first = study.trials[0]
    assert handles.cached_frozen(first) is first  # a FrozenTrial as it is
    assert handles.suggest(trial, "b", CategoricalDistribution([2, 4])) == 4  # the enqueued value
    assert handles.suggest(trial, "r", IntDistribution(8, 8)) == 8
    assert trial.params == {"b": 4, "r": 8}
    tid = handles.trial_id(trial)
    assert isinstance(tid, int) and handles.trial_id(study.trials[0]) == tid  # a FrozenTrial's too
    assert handles.storage_of(study) is study._storage
    handles.storage_of(study).set_trial_user_attr(tid, "k", "v")
    frozen = handles.frozen_trial(study, trial)
    assert frozen.number == trial.number and frozen.user_attrs == {"k": "v"} and frozen.state.name == "RUNNING"
    assert handles.fixed_params(study.ask()) == {}  # a trial not enqueued
    dist = IntDistribution(2, 8, step=2)
    assert [handles.contains(dist, v) for v in (2, 3, 8, 10)] == [True, False, True, False]
    assert handles.contains(CategoricalDistribution(["qv", "all"]), "qv") is True


def test_hydra_handles_on_a_real_config_loader():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import HydraContext
    from omegaconf import OmegaConf

    from grpo_sweep.config.compose import CONF_DIR
    from grpo_sweep.config.schema import register

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        master = compose("train", overrides=["+sweeps=tiny_cpu"], return_hydra_config=True)
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=None)
        cfg = handles.load_sweep_config(context, master, ["+sweeps=tiny_cpu", "lora_rank=32"])
        assert cfg.lora_rank == 32 and cfg.hydra.sweeper.study_name == "tiny_cpu"
        assert handles.group_exists(context, "lora") is True and handles.group_exists(context, "lora_rank") is False
    applied = OverridesParser.create().parse_overrides(["lora_rank=64", "+trial.note=abc"])
    handles.apply_overrides(applied, cfg)
    assert cfg.lora_rank == 64 and cfg.trial.note == "abc"
    with pytest.raises(Exception, match="no_such"):
        handles.apply_overrides(OverridesParser.create().parse_overrides(["no_such=1"]), cfg)
    assert handles.override_value("a b") == "a\\ b" and handles.override_value([1, "x"]) == "[1,x]"
    assert OmegaConf.is_config(cfg)


def test_a_failed_jobs_exception_through_job_error():
    from hydra.core.utils import JobReturn, JobStatus

    err = RuntimeError("boom")
    ret = JobReturn(status=JobStatus.FAILED, _return_value=err)
    assert handles.job_error(ret) is err
    with pytest.raises(RuntimeError, match="boom"):
        ret.return_value  # noqa: B018 - the public property re-raises, hence the handle
