"""bench/recipe_held.py: the recipe-held spaces the search is re-measured on really
hold the recipe, are what the sweeper would search, and the replay on them runs only such points.

Seconds: the spaces are selected from the recorded landscapes, and one seed of the replay runs.
"""

from __future__ import annotations

import logging
import math
import sys

import pytest
from helpers.config import compose
from helpers.runners import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import landscapes  # noqa: E402
import recipe_held as rh  # noqa: E402

from grpo_sweep.levers import RECIPE, kind_of, recipe_of  # noqa: E402


@pytest.fixture(scope="module")
def spaces():
    tiny = landscapes.tiny_cpu()
    olds = {"tiny_cpu": tiny, "gemma3_1b_l4": landscapes.gemma3_1b_l4(sigma=tiny["measured_sigma"])}
    return {name: (olds[spec["old"]], rh.hold(olds[spec["old"]], name, spec)) for name, spec in rh.SPACES.items()}


def test_every_point_trains_the_same_completions_per_step_and_only_listed_concessions_vary(spaces):
    for name, (old, sub) in spaces.items():
        spec = rh.SPACES[name]
        total = spec["completions_per_step"]
        points = sub["points"]
        assert points and any(p["status"] == "ok" for p in points), name
        # The old space trains many totals; each recipe-held point trains the recipe's.
        assert len({rh.completions_per_step(p["levers"]) for p in old["points"]}) > 1
        assert {p["settings"]["per_device_train_batch_size"] * p["settings"]["gradient_accumulation_steps"] for p in points} == {
            total
        }
        # Every recipe setting (levers.KINDS; the `lora` group sets lora_target_modules) is one value across
        # the space, unless the space lists it as a concession.
        recipe_settings = [s for s in old["grid"] if kind_of(s) == RECIPE]
        assert {"max_seq_length", "lora_rank", "lora"} <= set(recipe_settings)
        for setting in recipe_settings:
            seen = {p["settings"][setting] for p in points}
            if setting in spec["concessions"]:
                assert seen == set(spec["concessions"][setting]), (name, setting)
            else:
                assert seen == {spec["recipe"][setting]}, (name, setting, seen)
        if not spec["concessions"]:  # knobs only: the whole recipe is one, and only knobs are searched
            assert len({tuple(sorted((k, v) for k, v in p["settings"].items() if kind_of(k) == RECIPE)) for p in points}) == 1
            assert all(kind_of(k) != RECIPE for k in sub["grid"]), (name, sub["grid"])
        # The accumulation is derived, never searched; each searched micro-batch divides the total; the space
        # is complete (every combination the sampler can ask is a recorded point).
        assert "gradient_accumulation_steps" not in sub["grid"]
        assert all(total % b == 0 for b in sub["grid"]["per_device_train_batch_size"])
        assert len(sub["by_key"]) == len(points) == math.prod(len(v) for v in sub["grid"].values())
        assert sub["optimum"] == max(p["tokens_per_s"] for p in points if p["status"] == "ok") <= old["optimum"]


def test_the_sweeper_would_search_these_spaces_with_exactly_these_concessions(spaces):
    """concessions.check_space (the sweeper's own rule) accepts a knob-only space with no list, refuses a
    concessions space without its list, and accepts it with the list; divisors_only keeps its splits."""
    from optuna.distributions import CategoricalDistribution

    from hydra_plugins.grpo_optuna_sweeper import concessions

    lora = {choice: recipe_of(compose([f"lora={choice}"])) for choice in ("qv", "all_linear")}

    def changes(key: str) -> dict:
        if key == "lora":  # a config group: what its choices change, found by composing them (as the sweeper)
            return concessions.diff(lora["qv"], lora["all_linear"])
        return dict.fromkeys(
            concessions.setting_changes(key) | ({concessions.CPS} if key == "per_device_train_batch_size" else set())
        )

    for name, (old, sub) in spaces.items():
        spec = rh.SPACES[name]
        dists = {k: CategoricalDistribution(v) for k, v in sub["grid"].items()}
        kept = concessions.divisors_only(
            {"per_device_train_batch_size": CategoricalDistribution(old["grid"]["per_device_train_batch_size"])},
            [spec["completions_per_step"]],
            logging.getLogger("test"),
        )
        assert set(sub["grid"]["per_device_train_batch_size"]) <= set(kept["per_device_train_batch_size"].choices)
        listed = sorted(spec["concessions"])
        if not listed:
            assert concessions.check_space(dists, [], changes) == {}
            continue
        with pytest.raises(ValueError, match="concessions"):  # SweeperSettingError (see test_sweeper_settings)
            concessions.check_space(dists, [], changes)
        assert set(concessions.check_space(dists, listed, changes)) == set(listed)


def test_the_replay_on_a_recipe_held_space_runs_only_recipe_held_points(spaces):
    import search_seconds as ss

    old, sub = spaces["gemma_concessions"]
    sub.update(compose_s=0.05, move_check_s=0.005, frontier_s=1.0)  # the sweeper's own seconds: small beside a trial
    run = ss.sweep(sub, 0, n_trials=ss.N_TRIALS, stop_below=0.5, confirm_top=3)
    ran = [sub["by_key"][landscapes.key(t.params)] for t in run["study"].trials if t.user_attrs.get("status") in ("ok", "slow")]
    assert ran and {rh.completions_per_step(p["settings"]) for p in ran} == {8}
    assert all(set(t.params) == set(sub["grid"]) for t in run["study"].trials)
    assert run["pick"] is not None and run["pick"]["settings"]["per_device_train_batch_size"] in (2, 4, 8)


def test_the_old_gemma_landscape_keeps_the_old_space_not_the_new_sweep():
    """The old numbers rest on the old space (batch and accumulation searched independently); the new
    sweeps/gemma3_1b_l4.yaml holds the recipe and no longer searches gradient_accumulation_steps."""
    from omegaconf import OmegaConf

    old = landscapes.gemma_space()
    new = OmegaConf.load(ROOT / "sweeps" / "gemma3_1b_l4.yaml").hydra.sweeper.params
    assert "gradient_accumulation_steps" in old and "gradient_accumulation_steps" not in new
    land = landscapes.gemma3_1b_l4(sigma=0.1)
    assert land["grid"] == old and len({rh.completions_per_step(p["levers"]) for p in land["points"]}) > 3
