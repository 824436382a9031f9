"""The throughput model against the measured tiny_cpu_vllm landscape: does the plan rank as trials measure?

    PYTHONPATH=src python bench/throughput_model.py [--fresh]

Every point of sweeps/tiny_cpu_vllm.yaml's space that fits (bench/data/landscape_tiny_cpu_vllm.json, each
point's median of 3 real runs) beside the sweeper's own forecast of it (`grpo-sweep plan --json`, cached
in bench/data/plan_tiny_cpu_vllm.json; --fresh remakes it after a model change). Reported:
- plan_vs_landscape_spearman: Spearman's rho of predicted against measured tokens/s over those points;
- plan_first_pick_ratio: the measured tokens/s of the model start's first pick (start.choose, the sweep's
  default seed 0 breaking ties as the sweep breaks them) over the best point's;
- the model's median predicted / measured tokens/s, and the measured range of its top four.
Beside them, the public GPU runs (bench/published_runs.py's configs) at the expected length: each run's
logged mean completion length as task.expected_completion_tokens (published_runs.py judges the worst case).
The cpu_sim card's overheads were fitted to this same landscape (conf/gpu/cpu_sim.yaml says so): these
figures are in-sample. Writes bench/results/throughput_model.json and .md.
"""

from __future__ import annotations

import statistics
import sys

import landscapes
from common import write_result

SEED = 0  # hydra.sweeper.seed's default: the tie-break the sweep itself uses


def main(fresh: bool = False) -> dict:
    from grpo_sweep.report.trials import average_ranks, spearman
    from hydra_plugins.grpo_optuna_sweeper.start import choose

    if fresh:
        landscapes.plan_of("tiny_cpu_vllm", ("+sweeps=tiny_cpu_vllm",), fresh=True)
    land = landscapes.tiny_cpu_vllm()
    fits = [p for p in land["points"] if p["status"] == "ok" and p["forecast"].tokens_per_s]
    predicted = [p["forecast"].tokens_per_s for p in fits]
    measured = [p["tokens_per_s"] for p in fits]
    rho = spearman(average_ranks(predicted), average_ranks(measured))
    _, picks, _ = choose("model", [p["forecast"] for p in land["points"]], 1, SEED)
    first = land["by_key"][landscapes.key(picks[0])]
    ranked = sorted(fits, key=lambda p: -p["forecast"].tokens_per_s)
    top4 = [p["tokens_per_s"] / land["optimum"] for p in ranked[:4]]
    payload = {
        "points": len(fits),
        "plan_vs_landscape_spearman": rho,
        "plan_first_pick_ratio": first["tokens_per_s"] / land["optimum"],
        "first_pick": picks[0],
        "optimum_tokens_per_s": land["optimum"],
        "median_predicted_over_measured": statistics.median(a / b for a, b in zip(predicted, measured)),
        "top4_measured_of_optimum": top4,
        "in_sample": "the cpu_sim card's overheads were fitted to this landscape",
    }
    table = [
        {"figure": "Spearman rho, plan vs measured", "value": rho, "goal": ">= 0.9"},
        {"figure": "first pick's measured tok/s / best", "value": payload["plan_first_pick_ratio"], "goal": ">= 0.9"},
        {"figure": "median predicted / measured tok/s", "value": payload["median_predicted_over_measured"], "goal": "1"},
        {"figure": "model's top four, measured / best", "value": f"{min(top4):.2f}-{max(top4):.2f}", "goal": ""},
    ]
    payload["published_expected"] = published_at_expected_length()
    for split, figures in payload["published_expected"]["splits"].items():
        table.append(
            {
                "figure": f"public GPU runs ({split}), factor off at the expected length: median / worst",
                "value": f"{figures['median_factor']:.2f} / {figures['worst_factor']:.2f}",
                "goal": "<= 1.25 / <= 2 (heldout)",
            }
        )
    write_result("throughput_model", payload, table, "Throughput model vs the measured tiny_cpu_vllm landscape")
    return payload


def published_at_expected_length() -> dict:
    """The public GPU runs (bench/published_runs.py's configs) predicted at the expected case: each run's
    logged mean completion length as task.expected_completion_tokens (the budget where it logged none).
    published_runs.py judges the worst case, as trials measure; this is the forecast a user gets who
    states the mean length of their data."""
    import published_runs

    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.memory.throughput import relative_step_time

    rows = []
    for run in published_runs.load()["runs"]:
        if not run.get("predictable"):
            continue
        over = published_runs.overrides(run)
        if run.get("completion_length_mean"):
            over.append(f"task.expected_completion_tokens={round(run['completion_length_mean'])}")
        predicted = relative_step_time(compose_train_config(over))["expected"]["step_s"]
        measured = run["seconds_per_step"]
        rows.append({"id": run["id"], "split": run["split"], "measured_s": measured, "predicted_s": predicted})
        rows[-1]["factor"] = published_runs.factor(predicted, measured)
    splits = {
        split: {
            "runs": len(f),
            "median_factor": statistics.median(f),
            "worst_factor": max(f),
        }
        for split in published_runs.SPLITS
        if (f := [r["factor"] for r in rows if r["split"] == split])
    }
    return {"rows": rows, "splits": splits}


if __name__ == "__main__":
    out = main(fresh="--fresh" in sys.argv[1:])
    print({k: v for k, v in out.items() if k != "first_pick"})
