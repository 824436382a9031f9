"""Record the lever grid that bench/search_efficiency.py replays: every point run for real.

Each point is a real GRPO trial (tiny model, CPU) under the simulated budget of GRID_BUDGET_GIB
on `gpu=cpu_sim`, so points over the budget end in a real (simulated-device) OOM with a deficit,
exactly what the sweeper would see. Points TRL rejects (num_generations not dividing the batch)
are not part of the grid. Writes bench/data/grid_tiny_cpu.json with how it was made.

Usage: python bench/record_grid.py [--budget-gib 0.05]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, measured_at

GRID = {
    "max_seq_length": [64, 96, 128],
    "per_device_train_batch_size": [2, 4, 8, 16],
    "gradient_accumulation_steps": [1, 2],
    "num_generations": [2, 4],
    "lora_rank": [8, 32],
    "lora": ["qv", "all_linear"],  # a config group: LoRA target modules (the rank stays the lever above)
}
FIXED = ["trial.steps=3", "task.num_prompts=256", "max_prompt_length=32", "gpu=cpu_sim"]
DATA = ROOT / "bench" / "data" / "grid_tiny_cpu.json"
DEFAULT_BUDGET_GIB = 0.1  # about half of the points fit: the wall runs through the grid


def grid_points() -> list[dict]:
    points = []
    for values in itertools.product(*GRID.values()):
        point = dict(zip(GRID, values))
        if (point["per_device_train_batch_size"] * point["gradient_accumulation_steps"]) % point["num_generations"]:
            continue
        points.append(point)
    return points


def main(budget_gib: float) -> None:
    from grpo_sweep.compose import compose_train_config
    from grpo_sweep.trial import run_trial

    rows = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for i, point in enumerate(grid_points()):
            overrides = [*FIXED, f"gpu.memory_gib={budget_gib}", *(f"{k}={v}" for k, v in point.items())]
            record = run_trial(compose_train_config(overrides), Path(tmp) / str(i))
            rows.append({
                "levers": point,
                "status": record["status"],
                "tokens_per_s": record.get("tokens_per_s"),
                "peak_memory_bytes": record.get("peak_memory_bytes"),
                "predicted_peak_bytes": record.get("predicted_peak_bytes"),
                "deficit_bytes": record.get("deficit_bytes"),
                "memory_source": record.get("memory_source"),
            })
    DATA.parent.mkdir(parents=True, exist_ok=True)
    DATA.write_text(json.dumps({
        "how": "python bench/record_grid.py --budget-gib %s: one real GRPO trial per point (tiny model, "
               "CPU, worst-case lengths, 3 optimiser steps, first excluded from throughput), under the "
               "simulated budget on gpu=cpu_sim" % budget_gib,
        "measured_at": measured_at(),
        "wall_time_s": time.time() - started,
        "budget_bytes": int(budget_gib * 2**30),
        "grid": GRID,
        "fixed_overrides": FIXED,
        "points": rows,
    }, indent=1) + "\n")
    print(f"wrote {DATA} ({len(rows)} points)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget-gib", type=float, default=DEFAULT_BUDGET_GIB)
    main(parser.parse_args().budget_gib)
