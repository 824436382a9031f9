"""The search-efficiency replay (bench/search_efficiency.py) still drives the sweeper's own pieces.

It imports build_sampler, judge, the pre-screen and the frontier start from the plugin; if those
change shape, `make bench` would break or quietly measure something else. One seed per strategy
on the recorded grid takes seconds.
"""

from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import search_efficiency as se  # noqa: E402


def test_replay_uses_the_recorded_grid_and_the_sweepers_rules():
    grid = se.load_grid()
    budget = grid["budget_bytes"]
    assert len(grid["points"]) == 180 and grid["repeats"] == 3
    assert all(len(p["tokens_per_s_runs"]) == 3 for p in grid["points"] if p["status"] == "ok")

    ours = se.optuna_strategy(grid, 0, constrained=True, prescreen=True)
    assert all(p["predicted_peak_bytes"] <= 1.1 * budget for p in ours)  # pre-screened points never run
    assert any(se.good_enough(p, grid["optimum"]) for p in ours)
    assert len(ours) >= se.SWEEP_BUDGET  # it keeps going to the sweep budget, for the final pick

    raw = se.optuna_strategy(grid, 0, constrained=True, prescreen=False)
    assert any(p["predicted_peak_bytes"] > 1.1 * budget for p in raw)  # without it, such points run (and OOM)

    frontier = se.optuna_strategy(grid, 0, constrained=True, prescreen=True, frontier=se.FRONTIER)
    first = frontier[: se.FRONTIER]
    assert all(p["predicted_peak_bytes"] <= budget for p in first)
    fullest = max(p["predicted_peak_bytes"] for p in grid["points"] if p["predicted_peak_bytes"] <= budget)
    assert first[0]["predicted_peak_bytes"] == fullest

    result = se.outcome(ours, grid["optimum"])
    found = result["trials_to_5pct"]
    assert se.good_enough(ours[found - 1], grid["optimum"]) and result["final_pick_feasible"]
    assert not any(se.good_enough(p, grid["optimum"]) for p in ours[: found - 1])
