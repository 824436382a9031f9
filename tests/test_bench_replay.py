"""The search-efficiency replay (bench/search_efficiency.py) still drives the sweeper's own pieces.

It imports build_sampler, judge, the pre-screen and the frontier start from the plugin; if those
change shape, `make bench` would break or quietly measure something else. One seed per strategy
on the recorded grid takes seconds.
"""

from __future__ import annotations

import sys

import pytest
from helpers.runners import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import search_efficiency as se  # noqa: E402


def test_replay_uses_the_recorded_grid_and_the_sweepers_rules():
    grid = se.load_grid()
    budget = grid["budget_bytes"]
    assert len(grid["points"]) == 180 and grid["repeats"] == 5
    assert all(len(p["tokens_per_s_runs"]) >= 5 for p in grid["points"] if p["status"] == "ok")
    assert all(len(p["tokens_per_s_runs"]) == len(p["runs"]) for p in grid["points"])
    assert all(len(p["runs"]) == 1 for p in grid["points"] if p["status"] == "oom")  # bytes do not depend on timing

    ours = se.optuna_strategy(grid, 0, constrained=True, prescreen=True)
    assert all(p["predicted_peak_bytes"] <= 1.1 * budget for p in ours)  # pre-screened points never run
    assert any(se.good_enough(p, grid["optimum"]) for p in ours)
    assert len(ours) >= se.SWEEP_BUDGET  # it keeps going to the sweep budget, for the final pick

    raw = se.optuna_strategy(grid, 0, constrained=True, prescreen=False)
    assert any(p["predicted_peak_bytes"] > 1.1 * budget for p in raw)  # without it, such points run (and OOM)

    moving = se.optuna_strategy(grid, 0, constrained=True, prescreen=True, neighbour_every=2)
    assert moving != ours  # the same seed: neighbour moves from the 11th counted trial on change the path
    assert any(se.good_enough(p, grid["optimum"]) for p in moving)

    frontier = se.optuna_strategy(grid, 0, constrained=True, prescreen=True, frontier=5, n_startup_trials=5)
    first = frontier[:5]
    assert all(p["predicted_peak_bytes"] <= budget for p in first)
    fullest = max(p["predicted_peak_bytes"] for p in grid["points"] if p["predicted_peak_bytes"] <= budget)
    assert first[0]["predicted_peak_bytes"] == fullest

    result = se.outcome(ours, grid["optimum"])
    found = result["trials_to_5pct"]
    assert se.good_enough(ours[found - 1], grid["optimum"]) and result["final_pick_feasible"]
    assert not any(se.good_enough(p, grid["optimum"]) for p in ours[: found - 1])


def test_seconds_replay_uses_early_stop_confirmation_and_the_median_rule():
    """bench/search_seconds.py: slow trials PRUNED with intermediate values, confirmation runs enqueued by
    the sweeper's confirm.next_round, the pick named by the summary's median-of-runs rule, every trial charged."""
    import landscapes
    import search_seconds as ss

    from hydra_plugins.grpo_optuna_sweeper.standings import finalists

    # A quiet machine (2 % log-normal noise): its budget can settle the finalists, so confirmation runs.
    land = landscapes.tiny_cpu(sigma=0.02)  # every run of a point costs its mean seconds
    assert {p["cost_source"] for p in land["points"]} == {"measured"}
    assert all(p["start_s"] > 0 and len(p["step_s"]) == land["steps"] for p in land["points"] if p["status"] == "ok")
    assert all(p["oom_s"] > 0 for p in land["points"] if p["status"] == "oom")  # an OOM's time until it failed
    run = ss.sweep(land, 0, n_trials=ss.N_TRIALS, stop_below=0.9, confirm_top=3, confirm_repeats=2)
    study = run["study"]
    slow = [t for t in study.trials if t.user_attrs.get("status") == "slow"]
    assert slow and all(t.state.name == "PRUNED" and list(t.intermediate_values) == [2] for t in slow)
    confirmations = [t for t in study.trials if t.user_attrs.get("confirms") is not None]
    chosen = study.user_attrs["confirmation"]["finalists"]
    assert len(chosen) == 3
    # The sampler asked again for points it had run: those runs pool with the config's first trial.
    repeats = [t for t in study.trials if t.user_attrs.get("repeats") is not None]
    assert repeats and all(t.params == study.trials[t.user_attrs["repeats"]].params for t in repeats)
    search_runs = {
        n: sum(1 for t in study.trials if t.user_attrs.get("status") == "ok" and n in (t.number, t.user_attrs.get("repeats")))
        for n in chosen
    }
    # Confirmation runs rounds of the finalists while they are within noise and not within 5 %, within
    # 25 % of the replay's seconds (not capped at 1 + confirm_repeats runs), and the study records why it stopped.
    state = study.user_attrs["confirmation"]
    assert state["stopped"] in ("separated", "indifferent", "budget", "undecidable") and state["rounds"] >= 1
    assert {c.user_attrs["confirms"] for c in confirmations} <= set(chosen) and sum(search_runs.values()) >= 3
    assert state["spent_s"] <= 0.25 * state["sweep_s"] + 1e-9
    assert len(study.trials) == ss.N_TRIALS - 6 + len(confirmations)  # 6 runs reserved; confirmation ran what it needed
    winner = finalists(study)[0]
    assert winner.item.number in chosen and len(winner.runs) >= 3
    assert run["pick"] is land["by_key"][landscapes.key(winner.item.params)]
    assert run["confirm_s"] == pytest.approx(
        sum(ss.full_seconds(land["by_key"][landscapes.key(c.params)]) for c in confirmations)
    )
    assert 0 < run["search_s"] < run["seconds"]
    # Neighbour moves (the default neighbour_every=2): queued by the sweeper's neighbours.enqueue,
    # each a one-step move of a config the search had run, or a step the pre-screen refuses repaired
    # by a second lever; never one in the confirmation phase.
    from hydra_plugins.grpo_optuna_sweeper import neighbours
    from hydra_plugins.grpo_optuna_sweeper.config import GrpoOptunaSweeperConf

    allowed = ss.move_allowed(land, True, GrpoOptunaSweeperConf().prescreen_margin)
    moved = [t for t in study.trials if neighbours.NEIGHBOUR_ATTR in t.user_attrs]
    assert moved and not any(t.user_attrs.get("confirms") is not None for t in moved)
    repaired = 0
    for t in moved:
        origin = study.trials[t.user_attrs[neighbours.NEIGHBOUR_ATTR]]
        steps = neighbours.moves(origin.params, land["grid"])
        assert origin.number < t.number and allowed(t.params)
        if t.params not in steps:
            assert t.params in neighbours.repairs(origin.params, land["grid"], [s for s in steps if not allowed(s)])
            repaired += 1
    assert 0 < repaired < len(moved)  # the grid's wall blocks some steps: repairs first, plain steps too
    off = ss.sweep(land, 0, n_trials=ss.N_TRIALS, stop_below=0.9, confirm_top=3, neighbour_every=0)["study"]
    assert not any(neighbours.NEIGHBOUR_ATTR in t.user_attrs for t in off.trials)


def test_measured_noise_replays_the_points_own_runs():
    """With the recorded runs as the noise, a replayed run shows one of its point's measured values and
    costs that run's own seconds: the confirmation phase costs between its cheapest and dearest runs."""
    import landscapes
    import search_seconds as ss

    land = landscapes.tiny_cpu()
    assert land["noise"] == "measured runs" and 0 < land["measured_sigma"] < 1
    # The whole sweep to spend: at this noise 25 % could not settle the finalists, and no run would be confirmed.
    run = ss.sweep(land, 1, n_trials=ss.N_TRIALS, stop_below=None, confirm_top=3, confirm_repeats=2, confirm_budget=1.0)
    study = run["study"]
    for t in study.trials:
        if t.user_attrs.get("status") == "ok":
            point = land["by_key"][landscapes.key(t.params)]
            assert t.value in {r["tokens_per_s"] for r in point["measured_runs"]}
    confirmed = [land["by_key"][landscapes.key(t.params)] for t in study.trials if t.user_attrs.get("confirms") is not None]
    assert confirmed
    cheapest = sum(min(r["wall_s"] for r in p["measured_runs"]) for p in confirmed)
    dearest = sum(max(r["wall_s"] for r in p["measured_runs"]) for p in confirmed)
    assert cheapest - 1e-9 <= run["confirm_s"] <= dearest + 1e-9


def test_oracle_bound_knows_the_contenders_and_misses_only_by_noise():
    """bench/search_seconds.py oracle_pick_rate: the points within 10 % of the optimum, the budget split
    over them; without noise it always picks the optimum, with the measured runs it can miss."""
    import landscapes
    import search_seconds as ss

    exact = landscapes.tiny_cpu(sigma=1e-9)
    bound = ss.oracle_pick_rate(exact, n_trials=40, draws=200)
    contenders = [p for p in exact["points"] if p["status"] == "ok" and p["tokens_per_s"] >= 0.9 * exact["optimum"]]
    assert bound["contenders"] == len(contenders) and bound["runs_each"] == max(1, 40 // len(contenders))
    assert bound["rate"] == 1.0
    measured = ss.oracle_pick_rate(landscapes.tiny_cpu(), n_trials=40, draws=400)
    assert 0.0 < measured["rate"] <= 1.0


def test_calibration_replay_learns_a_biased_estimator():
    """bench/calibration_replay.py on the Gemma model with the raw estimator 12 % low: the replay's
    sweep, calibrated, runs fewer OOM trials than with the fixed margin (same seed, same sampler);
    the biased landscape's predictions are the true peaks x 0.88 (x 2 % scatter)."""
    import calibration_replay as cr
    import landscapes

    base = landscapes.gemma3_1b_l4(sigma=0.03)
    land = cr.biased(base, -0.12)
    budget = base["budget_bytes"]
    for p, q in zip(base["points"], land["points"]):
        true_peak = p["peak_memory_bytes"] if p["status"] == "ok" else budget + p["deficit_bytes"]
        assert 0.88 * 0.9 < q["predicted_peak_bytes"] / true_peak < 0.88 * 1.1
    fixed = cr.replay(land, calibrate=False, seeds=1)
    calibrated = cr.replay(land, calibrate=True, seeds=1)
    assert calibrated["oom_trials"][0] < fixed["oom_trials"][0]


def test_the_landscape_recorder_enumerates_a_shipped_sweeps_knob_space():
    """bench/record_grid.py --sweep: every point of the sweep file's space, each value as the file names it;
    tiny_cpu_vllm's space is at least 100 points at its held recipe: knobs, and vLLM's sequence cap, its concession."""
    import record_grid

    from grpo_sweep.levers import KNOB, kind_of

    points = record_grid.sweep_points("tiny_cpu_vllm")
    assert len(points) >= 100 and len({tuple(sorted(p.items())) for p in points}) == len(points)
    assert {k for k in points[0] if kind_of(k) != KNOB} == {"backend.vllm_max_num_seqs"}
    assert {p["gpu_memory_utilization"] for p in points} == {0.004, 0.1, 0.3, 0.5, 0.7, 0.9}
    assert {p["backend.vllm_enable_prefix_caching"] for p in points} == {False, True}


def test_random_and_tpe_are_charged_to_the_winner_they_declare():
    """bench/search_seconds.py declared: random search and TPE run their whole budget (they have no stop
    rule) but the reserve confirmation may take under ours' rule, and every run is charged: never less than the
    oracle moment they first run a good point, which they cannot know."""
    import landscapes
    import search_seconds as ss

    land = landscapes.tiny_cpu(sigma=0.02)
    for sampler in ("random", "tpe"):
        run = ss.declared(land, 0, sampler)
        trials = run["study"].trials
        confirming = [t for t in trials if t.user_attrs.get("confirms") is not None]
        assert len(trials) <= ss.N_TRIALS and len(trials) - len(confirming) >= ss.N_TRIALS - 3 * 2
        assert all(t.user_attrs.get("start") is None for t in trials)  # no start points
        assert run["pick"] is not None and run["pick"]["status"] == "ok"
        assert run["seconds"] >= (run["found_s"] or 0.0)
        assert run["seconds"] >= run["search_s"] > 0.0 and run["confirm_s"] >= 0.0
