"""bench/search_real_space.py: the spaces it replays are the shipped sweeps' own, judged by the
sweeper's own forecast, and its replay starts and prunes where the sweeper would.

Seconds: the spaces load from bench/data (the recorded landscape, the cached plans) and one seed runs.
"""

from __future__ import annotations

import sys

import pytest
import yaml
from helpers.runners import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import landscapes  # noqa: E402
import record_grid  # noqa: E402
import search_seconds  # noqa: E402

from hydra_plugins.grpo_optuna_sweeper import start  # noqa: E402
from hydra_plugins.grpo_optuna_sweeper.outcome import prescreen_verdict  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    land = landscapes.tiny_cpu_vllm()
    land.update(compose_s=0.05, move_check_s=0.05, frontier_s=1.0)  # the sweeper's own seconds: small beside a trial
    return land


@pytest.fixture(scope="module")
def gemma():
    land = landscapes.gemma3_1b_l4_knobs(sigma=0.2)
    land.update(compose_s=0.05, move_check_s=0.05, frontier_s=1.0)
    return land


def test_the_cached_plans_are_the_shipped_sweeps_spaces(tiny, gemma):
    """A changed sweep file makes the cached forecast stale: the plan's points must be the file's space
    (tiny: every point; Gemma: the knobs, its concessions' parameters taken out)."""
    sweeps = ROOT / "src" / "grpo_sweep" / "conf" / "sweeps"
    plan = landscapes.forecasts(landscapes.plan_of("tiny_cpu_vllm", ("+sweeps=tiny_cpu_vllm",)))
    assert {landscapes.key(p) for p in record_grid.sweep_points("tiny_cpu_vllm")} == set(plan)
    assert set(tiny["by_key"]) <= set(plan) and tiny["recorded_points"] == len(tiny["points"])
    params = yaml.safe_load((sweeps / "gemma3_1b_l4.yaml").read_text())["hydra"]["sweeper"]["params"]
    knobs = [k for k in params if k not in landscapes.GEMMA_CONCESSION_PARAMS]
    assert sorted(gemma["grid"]) == sorted(knobs)
    gemma_plan = landscapes.forecasts(landscapes.plan_of("gemma3_1b_l4_knobs", landscapes.GEMMA_KNOBS_OVERRIDES))
    assert len(gemma_plan) == 384  # every knob point; the landscape holds those the sweeper does not refuse
    runnable = {k for k, f in gemma_plan.items() if f.error is None}
    assert set(gemma["by_key"]) == runnable and len(gemma["points"]) == len(runnable) < 384


def test_the_replays_prescreen_is_the_plans_verdict_and_refused_starts_are_infeasible(tiny):
    for p in tiny["points"]:
        assert (prescreen_verdict(p["predicted_peak_bytes"], p["limit_bytes"], 0.1) is None) == p["forecast"].runs, p["levers"]
    refused = [p for p in tiny["points"] if p["refused"]]
    assert refused and all(p["status"] == "oom" and p["oom_s"] > 0 for p in refused)
    assert all(not p["forecast"].fits for p in refused)  # the plan predicts vLLM would not start there


@pytest.mark.parametrize("mode", ["model", "memory", "none"])
def test_the_replay_starts_where_the_sweeper_starts(tiny, mode):
    run = search_seconds.sweep(tiny, 0, n_trials=search_seconds.N_TRIALS, stop_below=0.5, confirm_top=3, start=mode)
    estimated = [p["forecast"] for p in tiny["points"]]
    picks = start.choose(mode, estimated, 5, 0)[1] if mode != "none" else []
    first = [t.params for t in run["study"].trials[: len(picks)]]
    assert first == picks
    if mode == "model":  # the predicted fastest fits, each predicted to fit
        assert all(tiny["by_key"][landscapes.key(p)]["forecast"].fits for p in picks)
    assert run["pick"] is not None and run["pick"]["status"] == "ok"
    # confirmation stops once confirm_budget (25 %) of the sweep's seconds is spent: at most one round past it
    assert 0 <= run["confirm_s"] <= 0.25 * run["seconds"] + 3 * max(search_seconds.full_seconds(p) for p in tiny["points"])


def test_the_forecast_only_oracle_knows_only_the_forecast(tiny):
    """search_seconds.model_oracle_pick_rate: with a forecast equal to the truth (speeds and which points
    run) and a quiet machine it picks within 5 % with its first point; with the sweeper's own forecast and the measured runs it
    reaches less than the oracle that knows the points within 10 %."""
    import dataclasses

    perfect = {
        **tiny,
        "noise": "sigma 0.001",
        "sigma": 0.001,
        "points": [
            {**p, "forecast": dataclasses.replace(p["forecast"], tokens_per_s=p.get("tokens_per_s"), runs=p["status"] == "ok")}
            for p in tiny["points"]
        ],
    }
    exact = search_seconds.model_oracle_pick_rate(perfect, top=3, draws=50)
    assert exact["by_k"][1] == 1.0
    forecast_only = search_seconds.model_oracle_pick_rate(tiny, top=12, draws=300)
    assert set(forecast_only["by_k"]) == set(range(1, 13)) and forecast_only["runs_each"] == 40 // forecast_only["k"]
    assert forecast_only["rate"] < search_seconds.oracle_pick_rate(tiny, draws=300)["rate"]


def test_the_calibration_ceiling_leaves_out_ties_of_the_picks(tiny):
    """throughput_model.reach_after: once the picks hold the landscape's best, the ceiling is the best
    untried point that ties no pick; a tie of a pick counts only in `untried_best`."""
    import throughput_model

    from hydra_plugins.grpo_optuna_sweeper.forecast import ties

    ranked = sorted((p for p in tiny["points"] if p["status"] == "ok"), key=lambda p: -p["tokens_per_s"])
    best = ranked[0]
    reach = throughput_model.reach_after(tiny, [best["levers"]])
    assert reach["untried_best"] < 1.0 and reach["untried_ceiling"] <= reach["untried_best"]
    apart = [p for p in ranked[1:] if not ties(p["forecast"].tokens_per_s, best["forecast"].tokens_per_s)]
    assert reach["untried_ceiling"] == apart[0]["tokens_per_s"] / tiny["optimum"]
    assert reach["untried_best"] == ranked[1]["tokens_per_s"] / tiny["optimum"]
    twins = reach["twins_prefix_caching"]
    assert twins["pairs"] >= 1 and twins["sd_log_ratio"] > 0
    # With nothing tried, the ceiling is the best point itself.
    assert throughput_model.reach_after(tiny, [])["untried_ceiling"] == 1.0
