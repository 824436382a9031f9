"""`make bench`: run every benchmark in one go and write bench/results/summary.json + summary.md.

The grid for search efficiency is recorded once (bench/record_grid.py) and replayed here; pass
--record-grid to measure it again. docs/performance.md renders summary.json (bench/docs_tables.py) and includes the per-benchmark .md files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_replay  # noqa: E402
import overhead  # noqa: E402
import published_runs  # noqa: E402
import recipe_held  # noqa: E402
import record_grid  # noqa: E402
import search_efficiency  # noqa: E402
import search_real_space  # noqa: E402
import search_vs_limit  # noqa: E402
import throughput_model  # noqa: E402
import trial_start  # noqa: E402
import vllm_vs_hf  # noqa: E402
from common import RESULTS, markdown_table, measured_at, run_python  # noqa: E402


def main(record: bool) -> dict:
    if record or not search_efficiency.DATA.exists():
        record_grid.main(budget_gib=record_grid.DEFAULT_BUDGET_GIB)
    trial_start.main()
    overhead.main(rounds=4, tracker_overrides=overhead.TRACKER_OVERRIDES)
    search_efficiency.main()
    calibration_replay.main()
    recipe_held.main(recipe_held.SEEDS)  # reads search_efficiency.json: after it
    search_real_space.main(search_real_space.SEEDS, search_real_space.landscapes.TINY_VLLM, "make bench")
    search_vs_limit.main(search_vs_limit.SEEDS, "make bench")
    vllm_vs_hf.main()
    throughput_model.main(fresh=True, calibrate=True)  # the plan remade from today's model; 5 real trials
    published_runs.main()
    # Its measured peaks come from real trials (cached in estimator_accuracy_measured.json; --fresh remeasures).
    done = run_python(["bench/estimator_accuracy.py"])
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return summarize()


def summarize(keep_measured_at: bool = False) -> dict:
    """summary.json and summary.md from the latest result of each benchmark. keep_measured_at: keep the
    previous summary's `measured_at` (the `make bench` it came from) when only a result was added."""
    load = lambda name: json.loads((RESULTS / f"{name}.json").read_text())  # noqa: E731
    previous = load("summary") if (RESULTS / "summary.json").exists() else {}
    recipe = load("recipe_held") if (RESULTS / "recipe_held.json").exists() else {}
    real = load("search_real_space") if (RESULTS / "search_real_space.json").exists() else {}
    limit = load("search_vs_limit") if (RESULTS / "search_vs_limit.json").exists() else {}
    start, over, search = load("trial_start"), load("overhead"), load("search_efficiency")
    accuracy = load("estimator_accuracy")["summary"]
    summary = {
        "overhead_ratio": over["overhead_ratio"],
        "tracker_overhead_ratio": over.get("tracker_overhead_ratio"),
        "cold_start_s": start["cold_start_s"],
        "warm_start_s": start["warm_start_s"],
        "grid_size": search["grid_size"],
        "grid_points_within_5pct": search.get("grid_points_within_5pct"),
        "grid_median_run_spread": search.get("grid_median_run_spread"),
        "search_median_trials": search["search_median_trials"],
        "search_median_trials_no_prescreen": search["search_median_trials_no_prescreen"],
        "search_median_trials_no_frontier_start": search.get("search_median_trials_no_frontier_start"),
        "tpe_unconstrained_median_trials": search["tpe_unconstrained_median_trials"],
        "random_median_trials": search["random_median_trials"],
        "infeasible_final_picks": search["infeasible_final_picks"],
        # Issue 15: search cost in machine seconds (to a point within 5 % of the optimum) and how often the
        # final pick is truly within 5 % under noise; `_gemma_l4`: a MODEL of the seed's Gemma 3 1B / L4 space.
        **{
            k: search.get(k)
            for suffix in ("", "_gemma_l4")
            for k in (
                f"search_median_seconds{suffix}",
                f"random_median_seconds{suffix}",
                f"tpe_unconstrained_median_seconds{suffix}",
                f"grid_seconds{suffix}",
                f"pick_within_5pct_rate{suffix}",
                f"pick_within_5pct_rate_no_confirm{suffix}",
                # How far off the pick is (its true value / the optimum), and the best rate any sweep of
                # the same budget could reach (an oracle that knows the points within 10 %).
                f"pick_of_optimum_median{suffix}",
                f"pick_within_5pct_rate_oracle{suffix}",
            )
        },
        # Without the frontier start (frontier_start=0, n_startup_trials=10), and without neighbour moves
        # (neighbour_every=0); 300 paired seeds for the neighbour moves' effect on the pick and the search.
        **{
            k: search.get(k)
            for suffix in ("", "_gemma_l4")
            for k in (
                f"search_median_seconds_no_frontier_start{suffix}",
                f"pick_within_5pct_rate_no_frontier_start{suffix}",
                f"search_median_seconds_no_neighbours{suffix}",
                f"pick_within_5pct_rate_no_neighbours{suffix}",
            )
        },
        "search_median_trials_no_neighbours": search.get("search_median_trials_no_neighbours"),
        **{
            f"{k}_300_seeds_{variant}{suffix}": (
                ((search.get("seconds") or {}).get("neighbour_effect") or {}).get(f"{variant}{suffix}") or {}
            ).get(k)
            for suffix in ("", "_gemma_l4")
            for variant in ("with", "without")
            for k in ("pick_within_5pct_rate", "good_point_run_rate")
        },
        # The Gemma model's pick at quieter machines (a run's log-normal sigma; this machine's is above).
        **{k: v for k, v in search.items() if k.startswith("pick_within_5pct_rate_") and "_gemma_l4_sigma_" in k},
        "stop_below": (search.get("seconds") or {}).get("stop_below"),
        "estimator_median_abs_err": accuracy["median_abs_error"],
        "estimator_max_abs_err": accuracy["worst_abs_error"],
        "vllm_vs_hf_step_ratio": load("vllm_vs_hf")["vllm_vs_hf_step_ratio"] if (RESULTS / "vllm_vs_hf.json").exists() else None,
        "vllm_vs_hf_generation_ratio": (
            load("vllm_vs_hf")["vllm_vs_hf_generation_ratio"] if (RESULTS / "vllm_vs_hf.json").exists() else None
        ),
        # Issue 26: the pre-screen's calibration vs the fixed margin on a landscape whose raw estimator is
        # off by -12 %, +15 % and +25 % (bench/calibration_replay.py; sums over the three cases).
        **{
            k: load("calibration_replay").get(k) if (RESULTS / "calibration_replay.json").exists() else None
            for mode in ("fixed", "calibrated")
            for k in (
                f"calibration_oom_trials_{mode}",
                f"calibration_false_prunes_{mode}",
                f"calibration_seconds_to_5pct_{mode}",
            )
        },
        # Issue 24: the same search on recipe-held spaces selected from the old ones (bench/recipe_held.py:
        # `_recipe_held_<space>`), and the old spaces replayed again beside them (`_old_space_rerun`).
        **{k: v for k, v in recipe.items() if "_recipe_held_" in k or k.endswith("_old_space_rerun")},
        "recipe_held_measured_at": recipe.get("measured_at"),
        # Issue 41: the search on the shipped sweeps' own spaces (bench/search_real_space.py): the measured
        # tiny_cpu_vllm landscape and the Gemma 3 1B / L4 knob space (a model), per start, beside random and TPE.
        **{k: v for k, v in real.items() if "_real_space_" in k},
        "real_space_measured_at": real.get("measured_at"),
        # Issue 58: the model-led search against one run of the best point (bench/search_vs_limit.py):
        # {space, sigma, model_error, ours_s, random_s, tpe_s, limit_s, pick, trials}, medians over seeds;
        # random_s / tpe_s to their declared winner, random_oracle_s / tpe_oracle_s to their first good point.
        "search_vs_limit": limit.get("search_vs_limit"),
        "search_vs_limit_measured_at": limit.get("measured_at"),
        # Issue 56: the throughput model against the measured tiny_cpu_vllm landscape (bench/throughput_model.py)
        # and against public GPU runs, the held-out ones never fitted (bench/published_runs.py).
        **{
            k: load(name).get(k) if (RESULTS / f"{name}.json").exists() else None
            for name, keys in (
                (
                    "throughput_model",
                    (
                        "plan_vs_landscape_spearman",
                        "plan_first_pick_ratio",
                        "calibrated_pick_ratio_after_5",
                        "calibrated_pick_ceiling_after_5",
                        "calibrated_pick_best_untried_after_5",
                        "calibrated_median_error",
                    ),
                ),
                (
                    "published_runs",
                    (
                        "published_heldout_median_factor",
                        "published_heldout_worst_factor",
                        "published_card_ratio_error",
                        "published_heldout_median_factor_worst_case",
                        "published_heldout_worst_factor_worst_case",
                        "published_card_ratio_error_worst_case",
                    ),
                ),
            )
            for k in keys
        },
        "measured_at": previous.get("measured_at") if keep_measured_at and previous.get("measured_at") else measured_at(),
    }
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    rows = [{"figure": k, "value": v} for k, v in summary.items() if not isinstance(v, list)]  # lists: their own page
    parts = [f"## Performance (`make bench`, {summary['measured_at']})", "", markdown_table(rows), ""]
    for name in (
        "overhead",
        "trial_start",
        "search_efficiency",
        "search_seconds",
        "calibration_replay",
        "recipe_held",
        "search_real_space",
        "search_vs_limit",
        "vllm_vs_hf",
        "estimator_accuracy",
    ):
        path = RESULTS / f"{name}.md"
        if path.exists():
            parts += [path.read_text(), ""]
    (RESULTS / "summary.md").write_text("\n".join(parts))
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--record-grid",
        action="store_true",
        help="measure the grid again (about 30 min on a quiet core: 5 runs per point that fits)",
    )
    parser.add_argument("--summarize", action="store_true", help="only rebuild summary.json/.md from results")
    parser.add_argument(
        "--keep-measured-at",
        action="store_true",
        help="with --summarize: keep the summary's measured_at (the `make bench` it came from), e.g. after adding one result",
    )
    cli = parser.parse_args()
    print(json.dumps(summarize(cli.keep_measured_at) if cli.summarize else main(cli.record_grid), indent=2))
