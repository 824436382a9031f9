"""The pre-screen's calibration (hydra_plugins.grpo_optuna_sweeper.calibration) against the fixed margin,
replayed on a landscape whose raw estimator is off by a stated amount.

`python bench/calibration_replay.py [seeds]` (bench/run_all.py runs it; about 2 min on 2 loaded cores).

Landscape: the modelled Gemma 3 1B / L4 space (bench/landscapes.py gemma3_1b_l4: every point's true
peak, status and costs), with the estimator made wrong on purpose: predicted = true peak x (1 + BIAS)
x exp(N(0, SCATTER)). BIAS -12 % (the raw estimator under-predicts, as when a card's allocator,
CUDA graphs or NCCL add what it does not model) and +15 % (over-predicts, as with worst-case lengths
a run never reaches); SCATTER 2 % per point. Each bias is replayed with the sweeper's own pieces
(search_seconds.sweep: TPE, the frontier start, neighbour moves, early stop, the pre-screen) twice:
the fixed 10 % margin (hydra.sweeper.prescreen_calibrate=0) and calibration (the default: after 3
measured trials, the correction and its allowance).

Per mode, summed over both biases, medians over seeds:
- calibration_oom_trials_*: OOM trials run in a 40-trial sweep (points the pre-screen let through);
- calibration_false_prunes_*: trials pruned whose point would have fit;
- calibration_seconds_to_5pct_*: machine seconds until a point within 5 % of the optimum ran to its end.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import landscapes  # noqa: E402
import search_seconds  # noqa: E402
from common import RESULTS, markdown_table, measured_at  # noqa: E402

BIASES = (-0.12, 0.15, 0.25)
SCATTER = 0.02
SEEDS = 20
N_TRIALS = 40


def biased(land: dict, bias: float, seed: int = 0) -> dict:
    """`land` with its raw prediction off by `bias` (x exp(N(0, SCATTER)) per point)."""
    rng = random.Random(seed)
    budget = land["budget_bytes"]
    points = []
    for p in land["points"]:
        true_peak = p["peak_memory_bytes"] if p["status"] == "ok" else budget + p["deficit_bytes"]
        points.append({**p, "predicted_peak_bytes": int(true_peak * (1 + bias) * math.exp(rng.gauss(0, SCATTER)))})
    return landscapes.finish({**land, "points": points, "name": f"{land['name']} bias {bias:+.0%}"})


def replay(land: dict, calibrate: bool, seeds: int) -> dict:
    oom, prunes, seconds = [], [], []
    for seed in range(seeds):
        run = search_seconds.sweep(land, seed, n_trials=N_TRIALS, stop_below=0.5, confirm_top=0, calibrate=calibrate)
        oom.append(run["oom_trials"])
        prunes.append(run["false_prunes"])
        found = search_seconds.sweep(
            land, seed, n_trials=N_TRIALS, stop_below=0.5, confirm_top=0, calibrate=calibrate, until_found=True
        )
        seconds.append(found["found_s"] if found["found_s"] is not None else found["seconds"])
    return {
        "oom_trials_mean": statistics.mean(oom),
        "false_prunes_mean": statistics.mean(prunes),
        "seconds_to_5pct_median": statistics.median(seconds),
        "oom_trials": oom,
        "false_prunes": prunes,
    }


def main(seeds: int = SEEDS) -> dict:
    base = landscapes.gemma3_1b_l4(sigma=0.03)
    out = {
        "how": __doc__.strip().splitlines()[0],
        "measured_at": measured_at(),
        "seeds": seeds,
        "n_trials": N_TRIALS,
        "cases": {},
    }
    for bias in BIASES:
        land = biased(base, bias)
        out["cases"][f"{bias:+.0%}"] = {mode: replay(land, mode == "calibrated", seeds) for mode in ("fixed", "calibrated")}
    for mode in ("fixed", "calibrated"):
        cases = [out["cases"][b][mode] for b in out["cases"]]
        out[f"calibration_oom_trials_{mode}"] = round(sum(c["oom_trials_mean"] for c in cases), 2)
        out[f"calibration_false_prunes_{mode}"] = round(sum(c["false_prunes_mean"] for c in cases), 2)
        out[f"calibration_seconds_to_5pct_{mode}"] = round(sum(c["seconds_to_5pct_median"] for c in cases), 1)
    (RESULTS / "calibration_replay.json").write_text(json.dumps(out, indent=2) + "\n")
    rows = [
        {"bias": bias, "mode": mode, **{k: v for k, v in r.items() if not isinstance(v, list)}}
        for bias, modes in out["cases"].items()
        for mode, r in modes.items()
    ]
    md = [
        f"### Pre-screen calibration vs the fixed margin ({out['measured_at']}, {seeds} seeds, {N_TRIALS} trials)",
        "",
        "The modelled Gemma 3 1B / L4 landscape with the raw estimator off by the stated bias (x exp(N(0, 2 %))).",
        "",
        markdown_table(rows),
        "",
    ]
    (RESULTS / "calibration_replay.md").write_text("\n".join(md))
    return out


if __name__ == "__main__":
    result = main(int(sys.argv[1]) if len(sys.argv) > 1 else SEEDS)
    print(json.dumps({k: v for k, v in result.items() if k != "cases"}, indent=2))
    for bias, modes in result["cases"].items():
        for mode, r in modes.items():
            print(bias, mode, {k: v for k, v in r.items() if not isinstance(v, list)})
