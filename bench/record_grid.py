"""Record the lever grid that bench/search_efficiency.py replays: every point run for real.

Each point is a real GRPO trial (tiny model, CPU) under the simulated budget of GRID_BUDGET_GIB
on `gpu=cpu_sim`, so points over the budget end in a real (simulated-device) OOM with a deficit,
exactly what the sweeper would see. Points TRL rejects (num_generations not dividing the batch)
are not part of the grid. Writes bench/data/grid_tiny_cpu.json with how it was made.

Usage: python bench/record_grid.py [--budget-gib 0.1] [--repeats 3]
       python bench/record_grid.py --wall-times 36   # wall time of a representative subset

--wall-times N runs N grid points once each (stratified: every sequence length x batch size cell,
both LoRA target sets, fits and OOMs alike) with today's trial defaults (trial.cpu_threads=1) and
writes bench/data/grid_tiny_cpu_wall.json: each trial's wall time (process start to exit), its
start latency (requested -> first GRPO step) and every step's seconds, or an OOM's time until it
failed. bench/search_efficiency.py fits its cost model of every grid point on these measurements.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
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
FIXED = [
    "trial.steps=3",
    "task.num_prompts=256",
    "max_prompt_length=32",
    "gpu=cpu_sim",
    "model.init=random",
]  # memory: weights do not matter
DATA = ROOT / "bench" / "data" / "grid_tiny_cpu.json"
WALL_DATA = ROOT / "bench" / "data" / "grid_tiny_cpu_wall.json"
DEFAULT_BUDGET_GIB = 0.1  # about half of the points fit: the wall runs through the grid
DEFAULT_REPEATS = 3


def grid_points() -> list[dict]:
    points = []
    for values in itertools.product(*GRID.values()):
        point = dict(zip(GRID, values))
        if (point["per_device_train_batch_size"] * point["gradient_accumulation_steps"]) % point["num_generations"]:
            continue
        points.append(point)
    return points


def main(budget_gib: float, repeats: int = DEFAULT_REPEATS) -> None:
    """Pass 1 runs every point; passes 2..repeats rerun the points that fit, in another order.

    A CPU step time moves with machine load by 10-30 % between runs of the same point, enough to
    reorder the top of the grid, so each point's throughput is the median of `repeats` runs taken in
    separate passes (forward, backward, shuffled: drift over the ~30 min does not favour any
    lever). OOM points are not rerun: the simulated card counts tensor bytes, which do not depend
    on timing, so their outcome and deficit are the same every time.
    """
    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.trial.parent import run_trial

    points = grid_points()
    rows = [{"levers": point, "tokens_per_s_runs": []} for point in points]
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(repeats):
            order = list(range(len(points)))
            if attempt % 3 == 1:
                order.reverse()
            elif attempt % 3 == 2:
                random.Random(attempt).shuffle(order)
            for i in order:
                row = rows[i]
                if attempt and row["status"] != "ok":
                    continue
                overrides = [*FIXED, f"gpu.memory_gib={budget_gib}", *(f"{k}={v}" for k, v in points[i].items())]
                record = run_trial(compose_train_config(overrides), Path(tmp) / f"{attempt}_{i}")
                if attempt and record["status"] != "ok":
                    raise RuntimeError(f"{points[i]} fitted in pass 1 but ended {record['status']} in pass {attempt + 1}")
                row["tokens_per_s_runs"].append(record.get("tokens_per_s"))
                row.update(
                    {
                        "status": record["status"],
                        "peak_memory_bytes": record.get("peak_memory_bytes"),
                        "predicted_peak_bytes": record.get("predicted_peak_bytes"),
                        "deficit_bytes": record.get("deficit_bytes"),
                        "memory_source": record.get("memory_source"),
                    }
                )
    for row in rows:
        runs = [r for r in row["tokens_per_s_runs"] if r is not None]
        row["tokens_per_s"] = statistics.median(runs) if runs else None
    DATA.parent.mkdir(parents=True, exist_ok=True)
    DATA.write_text(
        json.dumps(
            {
                "how": f"python bench/record_grid.py --budget-gib {budget_gib} --repeats {repeats}: real GRPO trials "
                "(tiny model, CPU, worst-case lengths, 3 optimiser steps, first excluded from throughput) under "
                f"the simulated budget on gpu=cpu_sim; tokens_per_s is the median of {repeats} runs taken in "
                "separate passes over the grid (OOM points run once: their bytes do not depend on timing)",
                "measured_at": measured_at(),
                "wall_time_s": time.time() - started,
                "budget_bytes": int(budget_gib * 2**30),
                "repeats": repeats,
                "grid": GRID,
                "fixed_overrides": FIXED,
                "points": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {DATA} ({len(rows)} points)")


TOP_FOR_SPREAD = 6
SPREAD_REPEATS = 3


def top_points(count: int) -> list[dict]:
    """The `count` best points of the recorded grid (by their median tokens/s)."""
    data = json.loads(DATA.read_text())
    ok = sorted((p for p in data["points"] if p["status"] == "ok"), key=lambda p: -p["tokens_per_s"])
    return [p["levers"] for p in ok[:count]]


def wall_subset(points: list[dict], size: int, seed: int = 0) -> list[int]:
    """Indices of `size` points covering every (max_seq_length, batch x accumulation) cell, then random."""
    rng = random.Random(seed)
    cells: dict[tuple, list[int]] = {}
    for i, p in enumerate(points):
        cells.setdefault((p["max_seq_length"], p["per_device_train_batch_size"] * p["gradient_accumulation_steps"]), []).append(i)
    picked = [rng.choice(members) for _, members in sorted(cells.items())]
    rest = [i for i in range(len(points)) if i not in picked]
    rng.shuffle(rest)
    return sorted((picked + rest)[:size])


def record_wall_times(size: int, budget_gib: float = DEFAULT_BUDGET_GIB) -> dict:
    """Run `size` grid points once each and keep what they cost in wall time (see the module docstring)."""
    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.trial.parent import run_trial

    points = grid_points()
    rows = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for i in wall_subset(points, size):
            overrides = [*FIXED, f"gpu.memory_gib={budget_gib}", *(f"{k}={v}" for k, v in points[i].items())]
            record = run_trial(compose_train_config(overrides), Path(tmp) / str(i))
            rows.append(
                {
                    "levers": points[i],
                    "status": record["status"],
                    "wall_time_s": record.get("wall_time_s"),
                    "start_latency_s": record.get("start_latency_s"),
                    "step_times_s": [r["step_time_s"] for r in record.get("history") or []],
                    "tokens_per_s": record.get("tokens_per_s"),
                }
            )
            print(f"[wall] {len(rows)}/{size} {points[i]} {record['status']} {record.get('wall_time_s'):.1f} s", flush=True)
        # Today's run-to-run spread where it decides the winner: the grid's TOP_FOR_SPREAD best points,
        # SPREAD_REPEATS runs each, interleaved (the same order a sweep's confirmation runs them in).
        top = top_points(TOP_FOR_SPREAD)
        spread_rows = [{"levers": p, "tokens_per_s_runs": [], "wall_time_s_runs": []} for p in top]
        for attempt in range(SPREAD_REPEATS):
            for j, row in enumerate(spread_rows):
                overrides = [*FIXED, f"gpu.memory_gib={budget_gib}", *(f"{k}={v}" for k, v in row["levers"].items())]
                record = run_trial(compose_train_config(overrides), Path(tmp) / f"top{attempt}_{j}")
                row["tokens_per_s_runs"].append(record.get("tokens_per_s"))
                row["wall_time_s_runs"].append(record.get("wall_time_s"))
                print(f"[spread] {attempt} {row['levers']} {record.get('tokens_per_s')}", flush=True)
    out = {
        "how": f"python bench/record_grid.py --wall-times {size}: one real trial per point of a stratified subset, "
        f"today's defaults (trial.cpu_threads=1), {FIXED}, gpu.memory_gib={budget_gib}; wall_time_s is the trial "
        "process from start to exit (an OOM's: until it failed and wrote metrics.json)",
        "measured_at": measured_at(),
        "elapsed_s": time.time() - started,
        "points": rows,
        "top_spread": spread_rows,
    }
    WALL_DATA.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {WALL_DATA} ({len(rows)} points)")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget-gib", type=float, default=DEFAULT_BUDGET_GIB)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="runs per point that fits (median kept)")
    parser.add_argument("--wall-times", type=int, default=0, help="only time N representative points (one run each)")
    cli = parser.parse_args()
    if cli.wall_times:
        record_wall_times(cli.wall_times, cli.budget_gib)
    else:
        main(cli.budget_gib, cli.repeats)
