"""hydra.sweeper.* settings out of range: one line that names the key, the value and what is allowed,
before the study's storage opens (hydra_plugins/grpo_optuna_sweeper/config.py: ALLOWED, check)."""

from __future__ import annotations

import pytest
from helpers.runners import sweep_args, train_here
from hydra.errors import CompactHydraException

from hydra_plugins.grpo_optuna_sweeper.config import ALLOWED, GrpoOptunaSweeperConf, check

# The error is caught as a ValueError (and checked to be a CompactHydraException), never by its own
# class: Hydra's plugin scan re-executes the plugin's modules in place, so a class imported here may
# no longer be the one the module raises (config.SweeperSettingError).

# Each setting with a rule, one value it must refuse (by hand, not from the rule) and the words of
# what is allowed.
BAD = {
    "n_trials": (0, "an integer >= 1"),
    "n_jobs": (0, "an integer >= 1"),
    "direction": ("fastest", "maximize or minimize"),
    "sampler": ("cmaes", "one of tpe, gp, random, grid"),
    "n_startup_trials": (-1, "an integer >= 0"),
    "seed": (-3, "an integer >= 0, or null"),
    "prescreen_margin": (-0.1, "a number >= 0"),
    "prescreen_calibrate": (-1, "an integer >= 0 (measured trials before calibration replaces the margin; 0: off)"),
    "headroom": (1.2, "a number in (0, 1]"),
    "start": ("fastest", "one of model, memory, none"),
    "start_points": (-5, "an integer >= 0 (0: off)"),
    "frontier_start": (-5, "an integer >= 0 (0: off), or null; the old name of start_points"),
    "neighbour_every": (True, "an integer >= 0 (0: off)"),
    "heartbeat_interval": (0, "an integer >= 1 (seconds)"),
    "grace_period": (0, "an integer >= 1 (seconds), or null"),
    "max_retry": (-1, "an integer >= 0"),
    "storage_retry_s": (-5, "a number of seconds >= 0"),
    "max_failures_in_a_row": (-2, "an integer >= 0 (0: never stop)"),
    "top_k": (0, "an integer >= 1"),
    "stop_below": (50, "a number in [0, 1]"),  # 50 % typed as a percentage
    "confirm_top": (1, "0 (off) or an integer >= 2"),
    "confirm_repeats": (-2, "an integer >= 0"),
    "learning_tolerance": (0, "a number in (0, 1) (relative: 1e-4 = 0.01 %), or null: per precision"),
    "soak_steps": (-1, "an integer >= 0 (steps the winner runs after the sweep; 0: off)"),
    "confirm_budget": (0, "a number in (0, 1] (a share of the sweep's seconds"),
    "search_stop": ("yes", "true or false"),
    "indifference": (5, "a number in [0, 0.5) (a fraction of the best: 0.05 = configs within 5 % of each other"),
}


def test_every_setting_with_a_rule_has_a_bad_value_here():
    assert set(BAD) == set(ALLOWED)


def test_the_defaults_and_the_edges_pass():
    check(vars(GrpoOptunaSweeperConf()))
    edges = {
        "stop_below": [None, 0, 1],
        "headroom": [None, 1, 0.5],
        "confirm_top": [0],
        "confirm_budget": [1, 0.05],
        "indifference": [0, 0.05, 0.2],
        "seed": [None, 0],
        "grace_period": [None],
        "learning_tolerance": [None, 1e-3],
    }
    for key, values in edges.items():
        for value in values:
            check({key: value})  # the other keys: their defaults
    check({"direction": "minimize", "prescreen_margin": 0})
    with pytest.raises(ValueError, match="direction='MAXIMIZE': must be maximize or minimize"):
        check({"direction": "MAXIMIZE"})  # Optuna would refuse it only once the storage is open


def test_the_grace_period_must_outlast_a_heartbeat():
    check({"heartbeat_interval": 1, "grace_period": 3})
    for grace in (30, 10):
        with pytest.raises(
            ValueError,
            match=rf"hydra.sweeper.grace_period={grace}: must be greater than hydra.sweeper.heartbeat_interval=30",
        ):
            check({"grace_period": grace})  # heartbeat_interval: its default, 30


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_bad_value_names_the_key_the_value_and_what_is_allowed(key):
    value, allowed = BAD[key]
    with pytest.raises(ValueError) as err:
        check({key: value})
    assert str(err.value).startswith(f"hydra.sweeper.{key}={value!r}: must be {allowed}")
    assert isinstance(err.value, CompactHydraException)  # Hydra prints the message alone


def test_a_bad_setting_stops_the_sweep_in_one_line_before_the_storage_opens(tmp_path):
    result = train_here(sweep_args(tmp_path / "sweep", "hydra.sweeper.stop_below=1.5", "hydra.sweeper.n_trials=1"))
    assert result.returncode != 0
    assert result.stderr.startswith(
        "hydra.sweeper.stop_below=1.5: must be a number in [0, 1] (a fraction of the best tokens/s so far: 0.5 = half), or null or 0: off"
    ), result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "sweep").exists()  # no sweep dir, no journal, no trial


def test_every_shipped_sweep_passes_the_check():
    from hydra import compose, initialize_config_dir

    from grpo_sweep.config.compose import CONF_DIR
    from grpo_sweep.config.schema import register

    register()
    sweeps = sorted(p.stem for p in (CONF_DIR / "sweeps").glob("*.yaml"))
    assert "gemma3_1b_l4" in sweeps and "tiny_cpu" in sweeps
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for name in sweeps:
            check(compose("train", overrides=[f"+sweeps={name}"], return_hydra_config=True).hydra.sweeper)


def test_frontier_start_is_the_old_name_of_start_points():
    """hydra.sweeper.start_points was frontier_start: a sweep file that still sets the old name runs as
    before, and one that sets both to different values is one line."""
    from hydra_plugins.grpo_optuna_sweeper.config import SweeperSettingError, check, start_points_of

    assert start_points_of({"frontier_start": 2, "start_points": 5}) == 2
    assert start_points_of({"start_points": 3}) == 3 and start_points_of({}) == 5
    check({"frontier_start": 2})
    check({"frontier_start": 3, "start_points": 3})
    with pytest.raises(SweeperSettingError, match="frontier_start=2 and hydra.sweeper.start_points=3: frontier_start is the old"):
        check({"frontier_start": 2, "start_points": 3})
