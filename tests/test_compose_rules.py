"""The candidates and the composition cache by hand, in process: the candidates of a space (space.candidates) and the
composition cache (compose.ComposeCache) over a small composition function that reads its config
groups and applies the value overrides with Hydra's own function, as Hydra's composition does.

That the cache gives what a real Hydra composition gives, on the real sweeps, is
tests/test_compose_cache.py (seconds per composition); here each rule of the split and the
cache is checked on its own, in milliseconds.
"""

from __future__ import annotations

import itertools

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from hydra_plugins.grpo_optuna_sweeper import handles, space, start
from hydra_plugins.grpo_optuna_sweeper.compose import ComposeCache

GROUPS = {"lora", "gpu"}
PARSER = OverridesParser.create()


class Compose:
    """compose(overrides) -> cfg, counting its calls: the defaults come from the group overrides
    (wherever they stand), then every other override is applied in order (Hydra's two stages)."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def __call__(self, overrides: list[str]):
        self.calls.append(list(overrides))
        parsed = PARSER.parse_overrides(overrides)
        choices = {o.key_or_group: o.value() for o in parsed if o.key_or_group in GROUPS and not isinstance(o.value(), dict)}
        if choices.get("gpu") == "broken":
            raise ConfigCompositionException("gpu=broken: no such config")
        cfg = OmegaConf.create(
            {
                "lora": {"name": choices.get("lora", "qv"), "alpha": 16},
                "gpu": {"name": choices.get("gpu", "l4"), "memory_gib": 24},
                "lora_rank": 8,
                "max_seq_length": 128,
                "extra": {"a": 1},
            }
        )
        OmegaConf.set_struct(cfg, True)
        handles.apply_overrides([o for o in parsed if o.key_or_group not in GROUPS or isinstance(o.value(), dict)], cfg)
        return cfg


def _plain(cfg):
    return OmegaConf.to_container(cfg, resolve=False)


def test_the_cache_gives_the_composed_config_at_one_composition_per_group_choice():
    compose = Compose()
    cache = ComposeCache(compose, GROUPS.__contains__)
    points = [
        [f"lora={lora}", f"lora_rank={rank}", f"max_seq_length={seq}", f"gpu={gpu}"]
        for lora, rank, seq, gpu in itertools.product(["qv", "all"], [8, 32], [64, 256], ["l4", "a100"])
    ]
    for point in points:
        expected = _plain(Compose()(point))
        got = cache.config(point)
        assert _plain(got) == expected and OmegaConf.is_struct(got)
    assert cache.compositions == len(compose.calls) == 4  # lora x gpu, whatever the values
    assert sorted(compose.calls) == sorted([f"lora={lo}", f"gpu={g}"] for lo in ("qv", "all") for g in ("l4", "a100"))
    # The same point again: no composition, and a config of its own (changing one leaves the next intact).
    first = cache.config(points[0])
    first.extra.a = 99
    assert cache.config(points[0]).extra.a == 1 and cache.compositions == 4


def test_a_composition_that_fails_fails_every_point_with_those_choices_once():
    compose = Compose()
    cache = ComposeCache(compose, GROUPS.__contains__)
    for rank in (8, 16, 32):
        with pytest.raises(ConfigCompositionException, match="gpu=broken: no such config"):
            cache.config(["gpu=broken", f"lora_rank={rank}"])
    assert cache.compositions == 1 and compose.calls == [["gpu=broken"]]
    assert cache.config(["gpu=l4", "lora_rank=16"]).lora_rank == 16 and cache.compositions == 2


def test_a_value_override_fails_as_hydra_fails_it():
    """A key the config lacks (struct mode), applied to the copy by Hydra's own function: Hydra's own
    error; `+key` adds and `~key` deletes, as on a command line."""
    cache = ComposeCache(Compose(), GROUPS.__contains__)
    for point in (["lora=qv", "no_such_lever=1"], ["lora=qv", "extra.b=2"]):
        with pytest.raises(ConfigCompositionException) as fresh:
            Compose()(point)
        with pytest.raises(ConfigCompositionException) as cached:
            cache.config(point)
        assert str(cached.value) == str(fresh.value)
    assert cache.config(["lora=qv", "+extra.b=2"]).extra == {"a": 1, "b": 2}
    assert "extra" not in cache.config(["lora=qv", "~extra"])
    assert cache.compositions == 1


def test_what_is_composed_and_what_is_applied_to_a_copy():
    """Group overrides, wherever they stand, are composed; the trailing value overrides are applied
    in order; a sweep, a `hydra` key and every override before the last of those stay composed, in
    order. A group key given a dict is a value override."""
    cache = ComposeCache(Compose(), GROUPS.__contains__)

    def split(overrides):
        composed, applied = cache.split(overrides)
        return composed, [o.input_line for o in applied]

    assert split([]) == ([], [])
    assert split(["lora=qv"]) == (["lora=qv"], [])
    assert split(["a=1", "lora=qv", "b=2", "gpu=l4"]) == (["lora=qv", "gpu=l4"], ["a=1", "b=2"])
    assert split(["a=1", "b=1,2", "c=3", "lora=qv"]) == (["a=1", "b=1,2", "lora=qv"], ["c=3"])
    assert split(["a=1", "hydra.job.name=n", "c=3"]) == (["a=1", "hydra.job.name=n"], ["c=3"])
    assert split(["a=1", "hydra/launcher=basic", "c=3"]) == (["a=1", "hydra/launcher=basic"], ["c=3"])
    assert split(["a=1", "hydra=x", "c=3"]) == (["a=1", "hydra=x"], ["c=3"])
    assert split(["a=1", "hydrant=x", "c=3"]) == ([], ["a=1", "hydrant=x", "c=3"])  # only `hydra` itself
    assert split(["lora={name: x}", "gpu=l4"]) == (["gpu=l4"], ["lora={name: x}"])
    assert split(["x=1", "lora=qv", "y=2", "gpu=l4", "z=3"]) == (["lora=qv", "gpu=l4"], ["x=1", "y=2", "z=3"])


def test_an_override_hydra_cannot_parse_is_composed_whole():
    compose = Compose()
    cache = ComposeCache(compose, GROUPS.__contains__)
    with pytest.raises(Exception) as fresh:  # noqa: PT011 - whatever Hydra raises, the same
        Compose()(["lora=qv", "lora_rank=[1,"])
    with pytest.raises(type(fresh.value)) as cached:
        cache.config(["lora=qv", "lora_rank=[1,"])
    assert str(cached.value) == str(fresh.value) and compose.calls == [["lora=qv", "lora_rank=[1,"]]
    parsed = cache._parse("lora_rank=8")
    assert cache._parse("lora_rank=8") is parsed  # parsed once


def test_candidates_are_every_point_or_a_seeded_sample_of_cap_distinct_points():
    grid = {"a": [1, 2, 3], "b": ["x", "y"], "c": [True, False]}
    every = [dict(zip(grid, p)) for p in itertools.product(*grid.values())]
    assert list(space.candidates(grid, seed=0)) == every  # in the grid's order
    assert list(space.candidates(grid, seed=0, cap=12)) == every  # exactly the cap: every point
    drawn = list(space.candidates(grid, seed=3, cap=5))
    assert len(drawn) == 5 and all(p in every for p in drawn)
    assert len({tuple(p.values()) for p in drawn}) == 5  # distinct
    assert list(space.candidates(grid, seed=3, cap=5)) == drawn  # the seed's
    assert any(list(space.candidates(grid, seed=s, cap=5)) != drawn for s in range(4, 10))
    assert len(list(space.candidates(grid, seed=1, cap=11))) == 11  # one short of every point: still ends
    assert list(space.candidates({"a": [1]}, seed=None)) == [{"a": 1}]
    assert start._differences({"a": 1, "b": 2}, {"a": 1, "b": 3}) == 1
    assert start._differences({"a": 1, "b": 2}, {"a": 1}) == 1  # a key the other lacks differs
