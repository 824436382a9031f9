"""The frontier start's composition cache (compose.ComposeCache) gives the config a fresh Hydra
composition gives, one composition per group choice, with the sweep's own plan and real Hydra."""

from __future__ import annotations

import itertools
import logging
import random
from dataclasses import replace

import pytest
from helpers.sweeper import SWEEP, tiny_sweeper
from omegaconf import OmegaConf

from hydra_plugins.grpo_optuna_sweeper import space
from hydra_plugins.grpo_optuna_sweeper.compose import ComposeCache
from hydra_plugins.grpo_optuna_sweeper.start import enqueue_frontier


def _overrides(tiny, params: dict) -> list[str]:
    return [*tiny.plan.fixed, *(space.to_override(k, v) for k, v in params.items())]


def _same(cached_compose, fresh_compose, overrides: list[str]):
    """Both give the same config (unresolved) or both raise the same exception type and message."""
    try:
        fresh = fresh_compose(overrides)
    except Exception as err:  # noqa: BLE001
        with pytest.raises(type(err)) as raised:
            cached_compose(overrides)
        assert str(raised.value) == str(err)
        return None
    cached = cached_compose(overrides)
    assert OmegaConf.to_container(cached, resolve=False) == OmegaConf.to_container(fresh, resolve=False)
    assert OmegaConf.is_struct(cached) == OmegaConf.is_struct(fresh)
    assert OmegaConf.get_type(cached) is OmegaConf.get_type(fresh)  # the structured schema kept
    return cached, fresh


def test_cached_config_equals_a_fresh_compose_over_the_tiny_space():
    from grpo_sweep.memory.estimator import estimate

    with tiny_sweeper(sweep="+sweeps=tiny_cpu_concessions") as tiny:  # a space with a group (lora) in it
        grid = space.grid_choices(tiny.plan.distributions)
        assert set(grid["lora"]) == {"qv", "all_linear"}  # the group lever, both choices below
        every = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
        sample = random.Random(0).sample(every, 14)
        for lora in grid["lora"]:  # the corners of the value levers under each group choice
            sample += [p for p in every if p["lora"] == lora and p["lora_rank"] in (8, 32) and p["max_seq_length"] != 128][:4]
        cache = tiny.compose.cache()
        for params in sample:
            cached, fresh = _same(cache.config, tiny.compose, _overrides(tiny, params))
            assert cached.lora_rank == params["lora_rank"] and cached.max_seq_length == params["max_seq_length"]
            assert estimate(cached).total_bytes == estimate(fresh).total_bytes
        assert cache.compositions == 2  # one per lora choice, however many points
        first = cache.config(_overrides(tiny, sample[0]))
        first.lora_rank, first.trial.steps = 999, 999  # each point's config is its own copy
        again = cache.config(_overrides(tiny, sample[0]))
        assert again.lora_rank == sample[0]["lora_rank"] and again.trial.steps != 999


@pytest.mark.parametrize(
    "extra",
    [
        ["gpu.memory_gib=0.5"],  # a nested value of a group's node
        ["gpu=l4_24g", "gpu.memory_gib=12"],  # a group choice with a value inside it
        ["lora_target_modules=[q_proj]"],  # a list replaces the default list
        ["lora_alpha=${lora_rank}"],  # an interpolation stays an interpolation
        ["+trial.note=abc"],  # `+` adds a key
        ["++lora_rank=64"],  # `++` adds or overrides
        ["+lora_rank=64"],  # `+` on an existing key: Hydra's error
        ["~lora_alpha"],  # `~` deletes
        ["no_such_lever=3"],  # a key the config lacks: Hydra's error (struct mode)
        ["gpu.no_such=1"],  # the same inside a group's node
        ["lora=no_such_choice"],  # a group option that does not exist
        ["lora_rank=8", "lora_rank=64"],  # the last one wins
        ["gpu={memory_gib: 2}"],  # a dict on a group key is a value (merged), as Hydra reads it
        ["hydra.job.name=x", "lora_rank=64"],  # hydra.* is composed, the value after it applied
    ],
)
def test_cached_config_matches_hydra_for_every_override_kind(extra):
    with tiny_sweeper() as tiny:
        cache = tiny.compose.cache()
        for lora in ("qv", "all_linear"):
            overrides = [*tiny.plan.fixed, f"lora={lora}", "lora_rank=16", *extra]
            _same(cache.config, tiny.compose, overrides)


def test_split_keeps_groups_and_hydra_keys_on_the_composed_side():
    cache = ComposeCache(compose=lambda overrides: None, is_group=lambda key: key in {"sweeps", "lora", "gpu"})
    composed, applied = cache.split([SWEEP, "x=1", "lora=qv", "y=2", "gpu=l4", "z=3"])
    assert composed == [SWEEP, "lora=qv", "gpu=l4"]
    assert [o.input_line for o in applied] == ["x=1", "y=2", "z=3"]  # Hydra's order kept
    composed, applied = cache.split(["a=1", "hydra.job.name=n", "lora=qv", "b=2"])
    assert composed == ["a=1", "hydra.job.name=n", "lora=qv"]  # values before a hydra key: composed, order kept
    assert [o.input_line for o in applied] == ["b=2"]


def test_frontier_start_composes_once_per_group_choice_and_skips_a_missing_key(caplog):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tiny_sweeper(sweep="+sweeps=tiny_cpu_concessions") as tiny:
        composed = []
        counting = ComposeCache(lambda overrides: composed.append(overrides) or tiny.compose(overrides), tiny.compose.is_group)
        study = optuna.create_study(direction="maximize")
        with caplog.at_level(logging.INFO):
            enqueue_frontier(study, tiny.plan, tiny.prescreen, counting, 3)
        # 72 candidates, 2 lora choices, and the user's config (forecast.departures counts from it)
        assert len(composed) == 3 and composed[0] == ["+sweeps=tiny_cpu_concessions"]
        picks = [t.system_attrs["fixed_params"] for t in study.get_trials(deepcopy=False)]
        assert len(picks) == 3 and "Frontier start (model): enqueued 3 of " in caplog.text

    # Every candidate fails to compose. (build_plan refuses a parameter the config lacks before any
    # trial, while holding the recipe; the frontier is handed one here to show it never raises.)
    with tiny_sweeper() as tiny:
        missing = optuna.distributions.CategoricalDistribution([1, 2])
        plan = replace(tiny.plan, distributions={**tiny.plan.distributions, "no_such_lever": missing})
        study = optuna.create_study(direction="maximize")
        caplog.clear()
        with caplog.at_level(logging.INFO):
            enqueue_frontier(study, plan, tiny.prescreen, tiny.compose.cache(), 3)  # skipped: the sweep goes on
        assert study.get_trials() == [] and "Frontier start (model): enqueued" not in caplog.text
        assert "Frontier start skipped: none of the space's points could be composed, checked and estimated" in caplog.text


def test_cache_outside_a_hydra_app_equals_compose_train_config():
    """The benchmark's way (bench/search_seconds.py:measure_frontier_s): compose_train_config and the
    groups from config_groups."""
    from grpo_sweep.config.compose import compose_train_config, config_groups

    groups = config_groups([SWEEP])
    assert {"lora", "gpu", "model", "backend", "quant", "sweeps", "preset"} <= groups
    assert "gpu.memory_gib" not in groups and "lora_rank" not in groups
    cache = ComposeCache(compose_train_config, groups.__contains__)
    points = [
        ["max_seq_length=256", "per_device_train_batch_size=8", "lora_rank=32", "lora=all_linear"],
        ["max_seq_length=64", "per_device_train_batch_size=2", "lora_rank=8", "lora=qv"],
        ["max_seq_length=128", "lora=qv", "gpu.memory_gib=1.5", "lora_rank=64"],
        ["lora=qv", "no_such_lever=1"],
    ]
    for point in points:
        _same(cache.config, compose_train_config, [SWEEP, *point])
    assert cache.compositions == 2


def test_an_override_hydra_cannot_parse_raises_hydras_error():
    with tiny_sweeper() as tiny:
        cache = tiny.compose.cache()
        for bad in (["lora_rank=[1,"], ["lora_rank=8", "=3"]):
            _same(cache.config, tiny.compose, [*tiny.plan.fixed, "lora=qv", *bad])


@pytest.mark.parametrize("sweep", ["gemma3_1b_l4", "qwen2_5_0_5b_t4", "tiny_cpu_vllm"])
def test_cache_equals_fresh_compose_on_the_gpu_sweep_spaces(sweep):
    """Floats, booleans and several levers at once: a sample of each shipped sweep file's space."""
    import yaml

    from grpo_sweep.config.compose import CONF_DIR, compose_train_config, config_groups
    from grpo_sweep.memory.estimator import estimate

    params = yaml.safe_load((CONF_DIR / "sweeps" / f"{sweep}.yaml").read_text())["hydra"]["sweeper"]["params"]
    distributions, _ = space.parse_space([f"{k}={v}" for k, v in params.items()])
    grid = space.grid_choices(distributions)
    base = [f"+sweeps={sweep}"]
    cache = ComposeCache(compose_train_config, config_groups(base).__contains__)
    compared = 0
    for point in itertools.islice(space.candidates(grid, seed=3), 5):
        overrides = [*base, *(space.to_override(k, v) for k, v in point.items())]
        same = _same(cache.config, compose_train_config, overrides)
        if same is not None:
            assert estimate(same[0]).total_bytes == estimate(same[1]).total_bytes
            compared += 1
    assert compared == 5  # every point composes: configs compared, not only errors


def test_the_plan_and_each_trials_check_share_the_sweeps_one_cache(monkeypatch):
    """plan.Composer.configs: the plan composed the user's config and its group choices; each trial
    prepare checks then costs no Hydra composition, and its config is the one a fresh composition of
    the trial's whole command line gives (its hydra.* overrides, left out of the cache's key, only
    name its folder): the same config, the same levers recorded."""
    import optuna

    from grpo_sweep.config.local import validate_here
    from grpo_sweep.levers import requested_levers
    from grpo_sweep.study.attrs import Key
    from hydra_plugins.grpo_optuna_sweeper import handles
    from hydra_plugins.grpo_optuna_sweeper.prepare import prepare

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tiny_sweeper(sweep="+sweeps=tiny_cpu_concessions") as tiny:
        hydra_calls = []
        real = handles.load_sweep_config
        monkeypatch.setattr(handles, "load_sweep_config", lambda *a: hydra_calls.append(a[2]) or real(*a))
        study = optuna.create_study(direction="maximize")
        for lora in ("qv", "all_linear", "qv"):
            study.enqueue_trial({"lora": lora})
            prepared = prepare(study.ask(), tiny.plan, tiny.prescreen, tiny.compose)
            assert hydra_calls == []  # both lora choices were composed by the plan already
            assert any(o.startswith("hydra.sweep.subdir=") for o in prepared.overrides)
            composed = [o for o in prepared.overrides if not o.startswith("++trial.prescreen")]
            cached = tiny.compose.configs.config([o for o in composed if not o.startswith("hydra.")])
            fresh = tiny.compose(composed)
            hydra_calls.clear()
            assert OmegaConf.to_container(cached, resolve=False) == OmegaConf.to_container(fresh, resolve=False)
            validate_here(fresh)  # as prepare does: the split resolved (gradient_accumulation_steps)
            assert prepared.attrs[Key.LEVERS] == requested_levers(fresh)
