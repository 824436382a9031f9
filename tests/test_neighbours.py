"""Neighbour moves (hydra_plugins/grpo_optuna_sweeper/neighbours.py): the moves, the turn rule and
the queued point on real Optuna studies, then a real sweep whose later trials are the best config
with one lever moved one step."""

from __future__ import annotations

import random

import pytest
from helpers.runners import sweep_args, train_here
from helpers.studies import counted, load_study

from hydra_plugins.grpo_optuna_sweeper import neighbours
from hydra_plugins.grpo_optuna_sweeper.config import check_setting

SPACE = {"batch": [16, 2, 8, 4], "lora": ["qv", "all_linear"], "ckpt": [False, True], "rank": [8]}


def test_moves_step_a_numeric_lever_to_its_sorted_neighbours_and_swap_any_other():
    moves = neighbours.moves({"batch": 4, "lora": "qv", "ckpt": False, "rank": 8}, SPACE)
    assert moves == [
        {"batch": 2, "lora": "qv", "ckpt": False, "rank": 8},  # 4's neighbours in sorted order: 2 and 8, not 16
        {"batch": 8, "lora": "qv", "ckpt": False, "rank": 8},
        {"batch": 4, "lora": "all_linear", "ckpt": False, "rank": 8},
        {"batch": 4, "lora": "qv", "ckpt": True, "rank": 8},  # a bool is not a number here
    ]
    ends = neighbours.moves({"batch": 16, "lora": "all_linear", "ckpt": True, "rank": 8}, SPACE)
    assert [m["batch"] for m in ends if m["batch"] != 16] == [8]  # the top end moves down only
    # A value outside the choices (a preset's) or a lever the point lacks: no move of that lever.
    assert neighbours.moves({"batch": 3}, {"batch": [2, 4]}) == []
    assert neighbours.moves({"lora": "qv"}, SPACE) == [{"lora": "all_linear"}]
    # Floats are numbers too (gpu_memory_utilization).
    assert neighbours.moves({"gmu": 0.4}, {"gmu": [0.3, 0.4, 0.5, 0.6]}) == [{"gmu": 0.3}, {"gmu": 0.5}]


def test_due_every_nth_search_trial_after_the_startup_trials():
    assert [c for c in range(12) if neighbours.due(c, 5, 2)] == [5, 7, 9, 11]
    assert [c for c in range(6) if neighbours.due(c, 0, 3)] == [0, 3]
    assert not any(neighbours.due(c, 5, 0) for c in range(20))  # 0: off
    for good in (0, 3):
        assert check_setting("neighbour_every", good) == good
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(ValueError, match=r"hydra.sweeper.neighbour_every=.*: must be an integer >= 0 \(0: off\)"):
            check_setting("neighbour_every", bad)


def test_pick_skips_tried_and_refused_points_and_follows_the_seed():
    best = {"batch": 4, "lora": "qv", "ckpt": False, "rank": 8}
    tried = [best, {**best, "batch": 8}]
    refused = {"ckpt"}  # e.g. the pre-screen prunes it

    def runs(point):
        return not any(point[k] != best[k] for k in refused)

    picks = {tuple(sorted(neighbours.pick(best, SPACE, tried, runs, random.Random(s)).items())) for s in range(40)}
    assert picks == {
        tuple(sorted({**best, "batch": 2}.items())),
        tuple(sorted({**best, "lora": "all_linear"}.items())),
    }
    same = [neighbours.pick(best, SPACE, tried, runs, random.Random(7)) for _ in range(3)]
    assert same[0] == same[1] == same[2]
    everything = [*tried, {**best, "batch": 2}, {**best, "lora": "all_linear"}]
    assert neighbours.pick(best, SPACE, everything, runs, random.Random(0)) is None


def _fits(point):
    """A toy pre-screen: memory grows with the batch and all_linear's targets, checkpointing halves it."""
    return point["batch"] * (2 if point["lora"] == "all_linear" else 1) * (0.5 if point["ckpt"] else 1) <= 16


def test_repairs_pair_a_refused_step_with_one_move_of_another_lever():
    best = {"batch": 8, "lora": "all_linear", "ckpt": False, "rank": 8}
    blocked = [s for s in neighbours.moves(best, SPACE) if not _fits(s)]
    assert blocked == [{**best, "batch": 16}]  # 16 x 2 = 32: the only step that does not fit
    assert neighbours.repairs(best, SPACE, blocked) == [
        {**best, "batch": 16, "lora": "qv"},
        {**best, "batch": 16, "ckpt": True},
    ]  # never batch 16 -> 8 again (the step undone): the stepped lever stays where the step put it
    two = [{**best, "batch": 16}, {**best, "lora": "qv"}]
    both = neighbours.repairs(best, SPACE, two)
    assert len(both) == len({neighbours.point_key(p) for p in both})  # 16+qv from either step: once
    assert {**best, "batch": 16, "lora": "qv"} in both


def test_pick_takes_a_repair_first_then_the_plain_steps():
    best = {"batch": 8, "lora": "all_linear", "ckpt": False, "rank": 8}
    repaired = [{**best, "batch": 16, "lora": "qv"}, {**best, "batch": 16, "ckpt": True}]
    picks = [neighbours.pick(best, SPACE, [best], _fits, random.Random(s)) for s in range(30)]
    assert all(p in repaired for p in picks) and all(r in picks for r in repaired)  # both, at random
    # Both repairs tried: a plain step that fits (batch 4, lora qv, ckpt on), never the refused batch 16.
    plain = {neighbours.point_key(neighbours.pick(best, SPACE, [best, *repaired], _fits, random.Random(s))) for s in range(30)}
    assert plain == {neighbours.point_key({**best, **c}) for c in ({"batch": 4}, {"lora": "qv"}, {"ckpt": True})}
    # A repair that the pre-screen refuses as well is no move.
    assert neighbours.pick(best, SPACE, [best], lambda p: _fits(p) and p["batch"] < 16, random.Random(0))["batch"] != 16


def _told(study, params, value, **attrs):
    import optuna

    from hydra_plugins.grpo_optuna_sweeper.outcome import CONSTRAINT

    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in SPACE.items()}
    study.enqueue_trial(params)
    trial = study.ask(dists)
    for key, val in {"status": "ok", **attrs}.items():
        trial.set_user_attr(key, val)
    trial.set_constraint(CONSTRAINT, -1.0)
    study.tell(trial, value)
    return trial


def test_enqueue_moves_from_the_best_median_config_not_a_preset():
    import optuna

    from grpo_sweep.study.best import REPEATS_ATTR

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    a = {"batch": 4, "lora": "qv", "ckpt": False, "rank": 8}
    b = {"batch": 8, "lora": "all_linear", "ckpt": True, "rank": 8}
    assert neighbours.enqueue(study, SPACE, lambda p: True, 0) is None  # nothing feasible yet
    first_a = _told(study, a, 100.0)
    _told(study, a, 100.0, **{REPEATS_ATTR: first_a.number})
    first_b = _told(study, b, 130.0)  # one lucky run: its median 130 ...
    _told(study, b, 60.0, **{REPEATS_ATTR: first_b.number})
    _told(study, b, 70.0, **{REPEATS_ATTR: first_b.number})  # ... is 70 after three
    _told(study, {**b, "batch": 16}, 500.0, preset="seed_optimized")  # a preset sets levers outside the space

    move = neighbours.enqueue(study, SPACE, lambda p: True, 0)
    assert move["from"] == first_a.number  # the best median that is not a preset
    assert sum(move["params"][k] != a[k] for k in a) == 1 and move["params"] in neighbours.moves(a, SPACE)
    waiting = [t for t in study.get_trials(deepcopy=False) if t.state.name == "WAITING"]
    assert len(waiting) == 1 and waiting[0].user_attrs[neighbours.NEIGHBOUR_ATTR] == first_a.number
    assert neighbours.enqueue(study, SPACE, lambda p: True, 0) is None  # a queued trial goes first
    # Every move of the best config tried (slower, all of them): the next best config moves instead.
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # the queued move, failed: still tried
    for point in neighbours.moves(a, SPACE):
        if point != waiting[0].system_attrs["fixed_params"]:
            _told(study, point, 10.0)
    move = neighbours.enqueue(study, SPACE, lambda p: True, 0)
    assert move["from"] == first_b.number and move["params"] in neighbours.moves(b, SPACE)
    assert neighbours.enqueue(optuna.create_study(), SPACE, lambda p: False, 0) is None


@pytest.mark.slow
def test_a_real_sweep_moves_one_lever_of_the_best_config(tmp_path):
    """n_startup_trials=2, neighbour_every=1: after two sampled trials, each search trial is the best
    config so far with one lever moved one step, never a point the study already ran."""
    result = train_here(
        sweep_args(
            tmp_path,
            "hydra.sweeper.n_trials=4",
            "hydra.sweeper.n_startup_trials=2",
            "hydra.sweeper.neighbour_every=1",
            "hydra.sweeper.confirm_top=0",
            "hydra.sweeper.stop_below=null",
            "per_device_train_batch_size=2",
            "completions_per_step=2",
            "gradient_checkpointing=false",
            "lora=qv",
            "max_seq_length=choice(64,128)",
            "lora_rank=choice(8,16)",
            "hydra.sweeper.concessions=[max_seq_length,lora_rank]",  # recipe settings: declared
            neighbours=True,
        )
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(f"journal:{tmp_path / 'study.journal'}")
    trials = counted(study)
    assert len(trials) == 4
    assert not any(neighbours.NEIGHBOUR_ATTR in t.user_attrs for t in trials[:2])
    space = {"max_seq_length": [64, 128], "lora_rank": [8, 16]}
    moved = [t for t in trials[2:] if neighbours.NEIGHBOUR_ATTR in t.user_attrs]
    assert moved, [t.user_attrs for t in trials]  # at least the first turn had a fresh move
    for t in moved:
        origin = study.trials[t.user_attrs[neighbours.NEIGHBOUR_ATTR]]
        assert origin.user_attrs["status"] == "ok" and origin.number < t.number
        assert t.params in neighbours.moves(origin.params, space)
        assert all(o.params != t.params for o in study.trials[: t.number])
    assert "Neighbour move: trial " in result.stdout + result.stderr


@pytest.mark.slow
def test_a_real_sweep_repairs_a_step_that_would_not_fit(tmp_path):
    """The card fits sequence 64 x batch 4 and 128 x 2, not 128 x 4 (the estimator's own numbers set the
    budget). From 64 x 4, the step to sequence 128 is refused by the pre-screen: the next trial is the
    repair, 128 with the batch halved, not the plain step to batch 2."""
    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.memory.estimator import estimate
    from hydra_plugins.grpo_optuna_sweeper.config import GrpoOptunaSweeperConf

    fixed = ["lora=qv", "lora_rank=8", "completions_per_step=4", "gradient_checkpointing=false"]

    def predicted(seq, batch):
        cfg = compose_train_config(["+sweeps=tiny_cpu", *fixed, f"max_seq_length={seq}", f"per_device_train_batch_size={batch}"])
        return estimate(cfg).total_bytes

    budget = 1.25 * max(predicted(64, 4), predicted(128, 2))
    assert predicted(128, 4) > budget * (1 + GrpoOptunaSweeperConf().prescreen_margin)  # the refused step
    result = train_here(
        sweep_args(
            tmp_path,
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.n_startup_trials=1",
            "hydra.sweeper.neighbour_every=1",
            "hydra.sweeper.confirm_top=0",
            "hydra.sweeper.stop_below=null",
            "hydra.sweeper.enqueue=[{max_seq_length:64,per_device_train_batch_size:4}]",
            f"gpu.memory_gib={budget / 2**30}",
            *fixed,
            "max_seq_length=choice(64,128)",
            "per_device_train_batch_size=choice(2,4)",
            "hydra.sweeper.concessions=[max_seq_length]",
            enqueue=True,
            neighbours=True,
        )
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trials = counted(load_study(f"journal:{tmp_path / 'study.journal'}"))
    assert [t.params for t in trials] == [
        {"max_seq_length": 64, "per_device_train_batch_size": 4},
        {"max_seq_length": 128, "per_device_train_batch_size": 2},
    ]
    assert [t.user_attrs["status"] for t in trials] == ["ok", "ok"]  # the repaired point fits for real
    assert trials[1].user_attrs[neighbours.NEIGHBOUR_ATTR] == trials[0].number
    assert "(a repair: one of the two alone would not pass the pre-screen)" in result.stdout + result.stderr
