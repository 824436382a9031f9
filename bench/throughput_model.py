"""The throughput model against the measured tiny_cpu_vllm landscape: does the plan rank as trials measure?

    PYTHONPATH=src python bench/throughput_model.py [--fresh]

Every point of sweeps/tiny_cpu_vllm.yaml's space that fits (bench/data/landscape_tiny_cpu_vllm.json, each
point's median of 3 real runs) beside the sweeper's own forecast of it (`grpo-sweep plan --json`, cached
in bench/data/plan_tiny_cpu_vllm.json; --fresh remakes it after a model change). Reported:
- plan_vs_landscape_spearman: Spearman's rho of predicted against measured tokens/s over those points;
- plan_first_pick_ratio: the measured tokens/s of the model start's first pick (start.choose, the sweep's
  default seed 0 breaking ties as the sweep breaks them) over the best point's;
- the model's median predicted / measured tokens/s, and the measured range of its top four.
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
    write_result("throughput_model", payload, table, "Throughput model vs the measured tiny_cpu_vllm landscape")
    return payload


if __name__ == "__main__":
    out = main(fresh="--fresh" in sys.argv[1:])
    print({k: v for k, v in out.items() if k != "first_pick"})
