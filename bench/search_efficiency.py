"""Search efficiency: replay search strategies on a lever grid that was measured for real.

bench/data/grid_tiny_cpu.json (bench/record_grid.py) holds real trials of every grid point under a
simulated budget: tokens/s (the median of its runs: 5, more for the best points after
record_grid.py --top-up) for points that fit, a real OOM with its deficit
for points that do not. Each strategy below asks for points and is told the recorded outcome, as
if it had run the trial, over SEEDS seeds:
- ours:            our sweeper's sampler and constraint handling (OOM -> infeasible with deficit),
                   with the estimator pre-screen (points predicted over budget are pruned unrun), the
                   frontier start and neighbour moves (the plugin's defaults);
- ours_no_prescreen: the same without the pre-screen;
- ours_no_frontier_start: ours without the frontier start (frontier_start=0, n_startup_trials=10:
                   plain TPE's start; "ours" runs the estimator's 5 fullest predicted fits first);
- ours_no_neighbours: ours without neighbour moves (neighbour_every=0);
- tpe_unconstrained: Optuna TPE that only sees OOMs as failed trials (what hydra-optuna-sweeper does);
- random:          uniform sampling without replacement;
- grid:            every point.
Reported per strategy: trials run until a config within 5 % of the grid optimum is found (pruned
points cost no trial; median and 90th percentile), OOM trials wasted before that, and whether the
final pick is feasible.

Then the same search in machine seconds, with early stop and confirmation, and how often the final
pick is truly within 5 % under run-to-run noise, on two landscapes (bench/search_seconds.py,
bench/landscapes.py): the tiny grid measured for real, and a model of the seed's Gemma 3 1B / L4
space (suffix `_gemma_l4`).
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, median, write_result

DATA = ROOT / "bench" / "data" / "grid_tiny_cpu.json"
SEEDS = 50  # the issue asks >= 20; with 20 the median moved by +-3 trials between seed sets
WITHIN = 0.05
# "ours" runs the plugin's defaults (frontier_start=5, n_startup_trials=5); this row, the start before them
NO_FRONTIER = {"frontier": 0, "n_startup_trials": 10}
# "ours" moves one lever of the best config every 2nd search trial (neighbour_every=2); this row, without
NO_NEIGHBOURS = {"neighbour_every": 0}
SWEEP_BUDGET = 40  # the final pick is the best feasible trial after this many trials


def load_grid() -> dict:
    data = json.loads(DATA.read_text())
    data["by_key"] = {key(p["levers"]): p for p in data["points"]}
    ok = [p["tokens_per_s"] for p in data["points"] if p["status"] == "ok"]
    data["optimum"] = max(ok)
    return data


def grid_facts(grid: dict) -> dict:
    """How hard the target is: how many points count as found, and how much a point's runs spread.

    The spread is (max - min) / median over a point's repeated runs (bench/record_grid.py --repeats):
    when it is near 5 %, "within 5 % of the optimum" is partly decided by measurement noise.
    """
    import landscapes

    ok = [p for p in grid["points"] if p["status"] == "ok"]
    return {
        "grid_points_within_5pct": sum(good_enough(p, grid["optimum"]) for p in ok),
        "grid_points_fit": len(ok),
        "grid_median_run_spread": landscapes.spread_of(grid["points"]),
    }


def key(levers: dict) -> tuple:
    return tuple(sorted(levers.items()))


def good_enough(point: dict, optimum: float) -> bool:
    return point["status"] == "ok" and point["tokens_per_s"] >= (1 - WITHIN) * optimum


def outcome(trials: list[dict], optimum: float) -> dict:
    """trials: the points a strategy ran, in order (pruned/invalid points excluded: they cost nothing).

    A strategy that never gets within 5 % is charged every trial it ran (at most the whole grid).
    """
    found = next((i + 1 for i, p in enumerate(trials) if good_enough(p, optimum)), len(trials))
    wasted = sum(1 for p in trials[:found] if p["status"] == "oom")
    feasible = [p for p in trials[:SWEEP_BUDGET] if p["status"] == "ok"]
    pick = max(feasible, key=lambda p: p["tokens_per_s"]) if feasible else None
    return {"trials_to_5pct": found, "oom_trials_wasted": wasted, "final_pick_feasible": bool(pick and pick["status"] == "ok")}


def optuna_strategy(
    grid: dict,
    seed: int,
    *,
    constrained: bool,
    prescreen: bool,
    frontier: int = 0,
    sampler: str | None = None,
    n_startup_trials: int = 10,
    neighbour_every: int = 0,
) -> list[dict]:
    """Ask/tell with the sweeper's own sampler, judge(), pre-screen, frontier start and neighbour
    moves, on recorded outcomes."""
    import optuna
    import search_seconds

    from hydra_plugins.grpo_optuna_sweeper import neighbours
    from hydra_plugins.grpo_optuna_sweeper import space as space_rules
    from hydra_plugins.grpo_optuna_sweeper import start as start_rules
    from hydra_plugins.grpo_optuna_sweeper.config import GrpoOptunaSweeperConf
    from hydra_plugins.grpo_optuna_sweeper.opening import build_sampler
    from hydra_plugins.grpo_optuna_sweeper.outcome import CONSTRAINT, for_sampler, judge, prescreen_verdict

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    conf = GrpoOptunaSweeperConf()
    space = {name: optuna.distributions.CategoricalDistribution(values) for name, values in grid["grid"].items()}
    study = optuna.create_study(
        direction="maximize", sampler=build_sampler(sampler or conf.sampler, seed, space, n_startup_trials)
    )
    budget = grid["budget_bytes"]
    if frontier:  # the sweeper composes each candidate and estimates it; the grid recorded that estimate
        fullness = [
            (params, grid["by_key"][key(params)]["predicted_peak_bytes"] / budget)
            for params in space_rules.candidates(grid["grid"], seed)
            if key(params) in grid["by_key"]
        ]
        for params in start_rules.pick(fullness, frontier, seed):
            study.enqueue_trial(params)
    ran: list[dict] = []
    asked = 0
    limit = len(grid["points"])
    found = False
    while (not found or len(ran) < SWEEP_BUDGET) and len(ran) < limit and asked < 20 * limit:
        if constrained and neighbours.due(asked, n_startup_trials, neighbour_every):  # asked: what the sweeper counts
            search_seconds.enqueue_neighbour(study, grid, seed, prescreen, conf.prescreen_margin)
        asked += 1
        trial = study.ask(space)
        point = grid["by_key"].get(key(trial.params))
        if point is None:  # TRL rejects it before any model loads: the sweeper marks it FAIL, unrun
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        if prescreen and point.get("predicted_peak_bytes") is not None:
            pruned = for_sampler(
                prescreen_verdict(point["predicted_peak_bytes"], budget, conf.prescreen_margin),
                sampler or conf.sampler,
                "maximize",
            )
            if pruned is not None:  # not run: costs no trial
                trial.set_constraint(CONSTRAINT, pruned.constraint)
                study.tell(trial, pruned.value, state=optuna.trial.TrialState[pruned.state])
                continue
        ran.append(point)
        if constrained:
            outcome = judge(point, objective="tokens_per_s", direction="maximize", budget_bytes=budget, headroom=None)
            trial.set_user_attr("status", outcome.attrs.get("status"))  # as the sweeper records it (the best rule reads it)
            if outcome.constraint is not None:
                trial.set_constraint(CONSTRAINT, outcome.constraint)
            study.tell(trial, outcome.value, state=optuna.trial.TrialState[outcome.state])
        elif point["status"] == "ok":  # hydra-optuna-sweeper: an OOM is just a failed trial
            study.tell(trial, point["tokens_per_s"])
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        found = found or good_enough(point, grid["optimum"])
    return ran


def random_strategy(grid: dict, seed: int) -> list[dict]:
    points = list(grid["points"])
    random.Random(seed).shuffle(points)
    return points


SECONDS_SEEDS = 30  # seconds and pick rates: each seed replays 3 sweeps with Optuna (minutes on 2 shared cores)
STOP_BELOW_SCAN = (None, 0.3, 0.5, 0.7)  # hydra.sweeper.stop_below candidates (None: off)
SCAN_SEEDS = 20
# Neighbour moves on and off, paired on the same seeds: 30 seeds resolve a pick rate to about +-0.09,
# too coarse to see the difference (about 4 min on a free core)
EFFECT_SEEDS = 300
CONFIRM_SCAN = ((3, 2), (3, 4), (2, 6))  # (confirm_top, confirm_repeats) in the same 40-trial sweep
# The pick on the Gemma model at quieter machines than this one (a run's log-normal sigma; a GPU
# alone on its card is nearer the low end), with and without neighbour moves: where noise, not the
# search, decides the pick. 200 seeds resolve a rate to about +-0.035.
NOISE_SCAN = (0.0, 0.03, 0.06, 0.1)
NOISE_SEEDS = 200
# A longer sweep on a noisy machine (the Gemma model at this machine's sigma): (n_trials, confirm_top,
# confirm_repeats); what docs/performance.md "On a noisy machine" recommends rests on it.
LONGER = ((40, 3, 2), (80, 3, 2), (80, 3, 4), (120, 3, 4))
LONGER_SEEDS = 100


def seconds_and_picks() -> tuple[dict, list[dict], dict]:
    """The `*_seconds` and `pick_within_5pct_rate*` keys for both landscapes, their table, and the scan
    of stop_below on the tiny grid that justifies the default."""
    import landscapes
    import search_seconds

    from hydra_plugins.grpo_optuna_sweeper.config import GrpoOptunaSweeperConf

    default_stop = GrpoOptunaSweeperConf().stop_below
    tiny = landscapes.tiny_cpu()  # each replayed run: one of the point's measured runs, at its measured cost
    gemma = landscapes.gemma3_1b_l4(sigma=tiny["measured_sigma"])
    grid_data = load_grid()  # the sweeper composes + estimates each point it launches or pre-screens: charged
    tiny_base = [*grid_data["fixed_overrides"], f"gpu.memory_gib={grid_data['budget_bytes'] / 2**30}"]
    tiny["compose_s"] = search_seconds.measure_compose_s(tiny, tiny_base)
    gemma["compose_s"] = search_seconds.measure_compose_s(gemma, ["+sweeps=gemma3_1b_l4"], cuda=True)
    # The frontier start composes and estimates every candidate before the first trial: measured.
    tiny["frontier_s"] = search_seconds.measure_frontier_s(tiny, tiny_base)
    gemma["frontier_s"] = search_seconds.measure_frontier_s(gemma, ["+sweeps=gemma3_1b_l4"], cuda=True)
    # A neighbour move's candidate is checked the same way (ComposeCache, validate, estimate): per point.
    from hydra_plugins.grpo_optuna_sweeper import space

    for land in (tiny, gemma):
        land["move_check_s"] = land["frontier_s"] / len(list(space.candidates(land["grid"], 0)))
    scan = {str(stop): search_seconds.scan(tiny, SCAN_SEEDS, stop) for stop in STOP_BELOW_SCAN}
    keys: dict = {}
    rows = []
    for suffix, land, label in (
        ("", tiny, "tiny_cpu"),
        ("_gemma_l4", gemma, "gemma3_1b_l4 (MODEL)"),
    ):
        r = search_seconds.evaluate(land, SECONDS_SEEDS, default_stop)
        keys.update({f"{k}{suffix}": v for k, v in r.items() if k != "stop_below"})
        nf = search_seconds.evaluate(land, SECONDS_SEEDS, default_stop, others=False, **NO_FRONTIER)
        keys[f"search_median_seconds_no_frontier_start{suffix}"] = nf["search_median_seconds"]
        keys[f"pick_within_5pct_rate_no_frontier_start{suffix}"] = nf["pick_within_5pct_rate"]
        keys[f"pick_within_5pct_rate_no_confirm_no_frontier_start{suffix}"] = nf["pick_within_5pct_rate_no_confirm"]
        nn = search_seconds.evaluate(land, SECONDS_SEEDS, default_stop, others=False, **NO_NEIGHBOURS)
        keys[f"search_median_seconds_no_neighbours{suffix}"] = nn["search_median_seconds"]
        keys[f"pick_within_5pct_rate_no_neighbours{suffix}"] = nn["pick_within_5pct_rate"]
        keys[f"pick_within_5pct_rate_no_confirm_no_neighbours{suffix}"] = nn["pick_within_5pct_rate_no_confirm"]
        keys[f"good_point_run_rate_no_neighbours{suffix}"] = nn["good_point_run_rate"]
        oracle = search_seconds.oracle_pick_rate(land)
        keys[f"pick_within_5pct_rate_oracle{suffix}"] = oracle["rate"]
        keys[f"run_spread{suffix}"] = land["spread"]
        rows.append(
            {
                "landscape": label,
                "run spread": land["spread"],
                "ours s": r["search_median_seconds"],
                "ours s, no confirm": r["search_median_seconds_no_confirm"],
                "random s": r.get("random_median_seconds", ""),
                "tpe unconstrained s": r.get("tpe_unconstrained_median_seconds", ""),
                "grid s": r.get("grid_seconds", ""),
                "pick within 5%": r["pick_within_5pct_rate"],
                "pick, no confirm": r["pick_within_5pct_rate_no_confirm"],
                "pick / optimum: median, worst tenth": f"{r['pick_of_optimum_median']:.3g}, {r['pick_of_optimum_p10']:.3g}",
                "search ran a good point": r["good_point_run_rate"],
                "oracle's pick (bound)": f"{oracle['rate']:.3g} ({oracle['contenders']} points x {oracle['runs_each']} runs)",
                "without frontier start: s": nf["search_median_seconds"],
                "its pick (no confirm)": f"{nf['pick_within_5pct_rate']:.3g} ({nf['pick_within_5pct_rate_no_confirm']:.3g})",
                "without neighbour moves: s": nn["search_median_seconds"],
                "its pick (no confirm), good point run": f"{nn['pick_within_5pct_rate']:.3g} "
                f"({nn['pick_within_5pct_rate_no_confirm']:.3g}), {nn['good_point_run_rate']:.3g}",
            }
        )
    effect = {}
    for suffix, land in (("", tiny), ("_gemma_l4", gemma)):
        for name, setting in (("with", {}), ("without", NO_NEIGHBOURS)):
            r = search_seconds.evaluate(land, EFFECT_SEEDS, default_stop, others=False, **setting)
            effect[f"{name}{suffix}"] = {
                k: r[k]
                for k in (
                    "search_median_seconds",
                    "pick_within_5pct_rate",
                    "pick_within_5pct_rate_no_confirm",
                    "good_point_run_rate",
                )
            }
    repeats = {}
    for top, rep in CONFIRM_SCAN:  # what to set on a noisy machine
        for suffix, land in (("", tiny), ("_gemma_l4", gemma)):
            picks = search_seconds.picks(land, SCAN_SEEDS, default_stop, top, rep)
            repeats[f"top{top}_x{rep}{suffix}"] = picks
    by_noise = {}
    for sigma in NOISE_SCAN:
        quiet = landscapes.gemma3_1b_l4(sigma=sigma)
        quiet.update({k: gemma[k] for k in ("compose_s", "frontier_s", "move_check_s")})
        by_noise[str(sigma)] = {
            name: search_seconds.picks(quiet, NOISE_SEEDS, default_stop, 3, 2, **setting)
            for name, setting in (("with", {}), ("without", NO_NEIGHBOURS))
        }
        no_confirm = search_seconds.picks(quiet, NOISE_SEEDS, default_stop, 0, 2)["pick_within_5pct_rate_no_confirm"]
        by_noise[str(sigma)]["with"]["pick_within_5pct_rate_no_confirm"] = no_confirm
        keys[f"pick_within_5pct_rate_gemma_l4_sigma_{sigma}"] = by_noise[str(sigma)]["with"]["pick_within_5pct_rate"]
        keys[f"pick_within_5pct_rate_no_confirm_gemma_l4_sigma_{sigma}"] = no_confirm
    longer = {
        f"{n}_trials_top{top}_x{rep}": search_seconds.picks(gemma, LONGER_SEEDS, default_stop, top, rep, n_trials=n)
        for n, top, rep in LONGER
    }
    info = {
        "stop_below": default_stop,
        "gemma_longer_sweeps": {"seeds": LONGER_SEEDS, **longer},
        "gemma_pick_by_noise": {"seeds": NOISE_SEEDS, "measured_sigma": tiny["measured_sigma"], **by_noise},
        "stop_below_scan": scan,
        "confirm_scan": repeats,
        "neighbour_effect": {"seeds": EFFECT_SEEDS, **effect},
        "seconds_seeds": SECONDS_SEEDS,
        "sweep_trials_for_pick": search_seconds.N_TRIALS,
        "tiny_run_sigma": tiny["measured_sigma"],
        "compose_s": {"tiny_cpu": tiny["compose_s"], "gemma3_1b_l4": gemma["compose_s"]},
        "frontier_s": {"tiny_cpu": tiny["frontier_s"], "gemma3_1b_l4": gemma["frontier_s"]},
        "move_check_s": {"tiny_cpu": tiny["move_check_s"], "gemma3_1b_l4": gemma["move_check_s"]},
        # Where "within 5 %" is decided: the points within 10 % of the optimum, how many runs their
        # truth rests on and the relative standard error of their median.
        "tiny_truth": landscapes.truth_uncertainty(tiny["points"], tiny["optimum"]),
        "tiny_load_avg_1m": tiny["load_avg_1m"],
        "tiny_how": tiny["how"],
        "gemma_how": gemma["how"],
        "gemma_points": len(gemma["points"]),
        "gemma_points_within_5pct": sum(search_seconds.good(p, gemma) for p in gemma["points"]),
    }
    return keys, rows, info


def main() -> dict:
    grid = load_grid()
    from hydra_plugins.grpo_optuna_sweeper.config import GrpoOptunaSweeperConf

    conf = GrpoOptunaSweeperConf()
    start = {  # the plugin's defaults
        "frontier": conf.start_points,
        "n_startup_trials": conf.n_startup_trials,
        "neighbour_every": conf.neighbour_every,
    }
    strategies = {
        "ours": lambda s: optuna_strategy(grid, s, constrained=True, prescreen=True, **start),
        "ours_no_prescreen": lambda s: optuna_strategy(grid, s, constrained=True, prescreen=False, **start),
        "ours_no_frontier_start": lambda s: optuna_strategy(
            grid, s, constrained=True, prescreen=True, **{**start, **NO_FRONTIER}
        ),
        "ours_no_neighbours": lambda s: optuna_strategy(grid, s, constrained=True, prescreen=True, **{**start, **NO_NEIGHBOURS}),
        "tpe_unconstrained": lambda s: optuna_strategy(grid, s, constrained=False, prescreen=False),
        "random": lambda s: random_strategy(grid, s),
    }
    per = {name: [outcome(run(seed), grid["optimum"]) for seed in range(SEEDS)] for name, run in strategies.items()}
    n = len(grid["points"])
    facts = grid_facts(grid)
    table = [
        {
            "strategy": "full grid",
            "median trials to within 5%": n,
            "90th percentile": n,
            "median OOM trials wasted": sum(p["status"] == "oom" for p in grid["points"]),
            "infeasible final picks": 0,
        }
    ]
    summary = {}
    for name, outs in per.items():
        summary[name] = {
            "median_trials": median(o["trials_to_5pct"] for o in outs),
            "p90_trials": sorted(o["trials_to_5pct"] for o in outs)[int(0.9 * len(outs))],
            "median_oom_wasted": median(o["oom_trials_wasted"] for o in outs),
            "infeasible_final_picks": sum(not o["final_pick_feasible"] for o in outs),
            "runs": outs,
        }
        table.append(
            {
                "strategy": name,
                "median trials to within 5%": summary[name]["median_trials"],
                "90th percentile": summary[name]["p90_trials"],
                "median OOM trials wasted": summary[name]["median_oom_wasted"],
                "infeasible final picks": summary[name]["infeasible_final_picks"],
            }
        )
    result = {
        "grid_size": n,
        "seeds": SEEDS,
        "sweep_budget_for_final_pick": SWEEP_BUDGET,
        "optimum_tokens_per_s": grid["optimum"],
        "grid_measured_at": grid["measured_at"],
        **facts,
        "search_median_trials": summary["ours"]["median_trials"],
        "search_median_trials_no_prescreen": summary["ours_no_prescreen"]["median_trials"],
        "search_median_trials_no_frontier_start": summary["ours_no_frontier_start"]["median_trials"],
        "search_median_trials_no_neighbours": summary["ours_no_neighbours"]["median_trials"],
        "tpe_unconstrained_median_trials": summary["tpe_unconstrained"]["median_trials"],
        "random_median_trials": summary["random"]["median_trials"],
        "infeasible_final_picks": summary["ours"]["infeasible_final_picks"],
        "strategies": summary,
    }
    seconds, seconds_table, seconds_info = seconds_and_picks()
    result.update(seconds)
    result["seconds"] = seconds_info
    assert not math.isnan(result["search_median_trials"])
    spread = facts["grid_median_run_spread"]
    write_result(
        "search_efficiency",
        result,
        table,
        f"Search efficiency on a {n}-point grid measured for real ({SEEDS} seeds; "
        f"{facts['grid_points_within_5pct']} points within 5 % of the optimum"
        + (f", median run-to-run spread of a point {spread:.0%})" if spread is not None else ")"),
    )
    path = write_result(
        "search_seconds",
        {k: v for k, v in result.items() if "seconds" in k or "pick" in k or k == "seconds"},
        seconds_table,
        f"Search cost in machine seconds and pick rate over {SECONDS_SEEDS} seeds (stop_below="
        f"{seconds_info['stop_below']}, confirm 3 x 2 in a {seconds_info['sweep_trials_for_pick']}-trial sweep; "
        "gemma3_1b_l4 is a MODEL, not a measurement)",
    )
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    out = main()
    print(json.dumps({k: v for k, v in out.items() if k != "strategies"}, indent=2))
