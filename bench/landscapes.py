"""The two landscapes the search-cost replay (bench/search_seconds.py) runs on.

A landscape is every point of a search space with what a trial of it would show and cost:
- status ok / oom, the true throughput (tokens/s: a point's median run), the peak or deficit;
- the estimator's prediction (the sweeper's pre-screen reads it);
- seconds: start (process start to the first GRPO step, plus the exit after the last), each step's
  seconds, and an OOM's seconds until it failed;
- the run-to-run noise: one run shows true x exp(N(0, sigma)).

tiny_cpu: the 180-point grid measured for real (bench/data/grid_tiny_cpu.json, record_grid.py);
    seconds measured for real on a stratified subset (bench/data/grid_tiny_cpu_wall.json,
    record_grid.py --wall-times) and modelled for the other points by a fit on that subset (`fit`).
gemma3_1b_l4: a MODEL, not a measurement: the seed's search space for Gemma 3 1B on an L4
    (sweeps/gemma3_1b_l4.yaml), the memory wall from grpo_sweep.memory.estimator (with a per-point
    error drawn like the estimator's measured GPU error), throughput and step seconds from
    grpo_sweep.memory.throughput.relative_step_time, start seconds from the H200 check's measured
    trial (bench/results/gpu_check_h200.json), noise drawn like the measured spread.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, measured_at

GRID = ROOT / "bench" / "data" / "grid_tiny_cpu.json"
WALL = ROOT / "bench" / "data" / "grid_tiny_cpu_wall.json"
GEMMA = ROOT / "bench" / "data" / "landscape_gemma3_1b_l4.json"
GEMMA_SWEEP = ROOT / "sweeps" / "gemma3_1b_l4.yaml"
GPU_CHECK = ROOT / "bench" / "results" / "gpu_check_h200.json"
RANGE_IN_SIGMAS = 1.693  # the expected range (max - min) of 3 draws of a normal, in standard deviations
GEMMA_ESTIMATOR_SIGMA = 0.08  # true peak = predicted x exp(N(0, 0.08)): the H200 check measured 0.86x on one config
SEED = 0


def key(levers: dict) -> tuple:
    return tuple(sorted(levers.items()))


def sigma_from_spread(spread: float) -> float:
    """A point's (max - min) / median over 3 runs -> the log-normal sigma of one run."""
    return spread / RANGE_IN_SIGMAS


def finish(land: dict) -> dict:
    land["by_key"] = {key(p["levers"]): p for p in land["points"]}
    land["optimum"] = max(p["tokens_per_s"] for p in land["points"] if p["status"] == "ok")
    return land


# ------------------------------------------------------------------------------------------ tiny_cpu
def tokens_per_step(levers: dict) -> int:
    """Worst-case lengths: every sequence at max_seq_length, batch x accumulation sequences per step."""
    return levers["max_seq_length"] * levers["per_device_train_batch_size"] * levers["gradient_accumulation_steps"]


def fit(rows: list[dict]) -> dict:
    """The cost model of a tiny-grid trial, fitted on the measured subset.

    step seconds = a + b x tokens per step (least squares over the timed steps of measured fits);
    the first step costs `first_ratio` x a timed one (median); start and exit seconds are medians; an
    OOM costs start + `oom_step_fraction` x its (modelled) first step + exit (median over measured OOMs).
    The leave-one-out median relative error of a fit's full wall time is reported with it.
    """
    ok = [r for r in rows if r["status"] == "ok" and len(r["step_times_s"]) >= 2]
    xs = [tokens_per_step(r["levers"]) for r in ok]
    ys = [statistics.median(r["step_times_s"][1:]) for r in ok]

    def line(xs, ys):
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        return my - b * mx, b

    a, b = line(xs, ys)
    first = statistics.median(r["step_times_s"][0] / statistics.median(r["step_times_s"][1:]) for r in ok)
    start = statistics.median(r["start_latency_s"] for r in rows if r.get("start_latency_s"))
    tail = statistics.median(r["wall_time_s"] - r["start_latency_s"] - sum(r["step_times_s"]) for r in ok)
    model = {"step_a_s": a, "step_b_s_per_token": b, "first_ratio": first, "start_s": start, "exit_s": tail}
    ooms = [r for r in rows if r["status"] == "oom" and r.get("wall_time_s")]
    fractions = [max(0.0, (r["wall_time_s"] - start - tail) / (first * (a + b * tokens_per_step(r["levers"])))) for r in ooms]
    model["oom_step_fraction"] = statistics.median(fractions) if fractions else 1.0
    errors = []
    for i, r in enumerate(ok):  # leave one out: how well an unmeasured point's wall time is modelled
        a_i, b_i = line(xs[:i] + xs[i + 1 :], ys[:i] + ys[i + 1 :])
        step = a_i + b_i * xs[i]
        predicted = start + tail + first * step + (len(r["step_times_s"]) - 1) * step
        errors.append(abs(predicted - r["wall_time_s"]) / r["wall_time_s"])
    model["loo_median_rel_error"] = statistics.median(errors) if errors else None
    model["measured_points"] = len(rows)
    return model


def modelled_costs(levers: dict, status: str, model: dict, steps: int) -> dict:
    step = model["step_a_s"] + model["step_b_s_per_token"] * tokens_per_step(levers)
    step_s = [model["first_ratio"] * step] + [step] * (steps - 1)
    oom_s = model["start_s"] + model["oom_step_fraction"] * step_s[0] + model["exit_s"]
    return {"start_s": model["start_s"] + model["exit_s"], "step_s": step_s, "oom_s": oom_s, "cost_source": "model"}


def measured_costs(row: dict) -> dict:
    start = row["wall_time_s"] - sum(row["step_times_s"])  # start latency + exit: all but the steps
    return {"start_s": start, "step_s": list(row["step_times_s"]), "oom_s": row["wall_time_s"], "cost_source": "measured"}


def tiny_cpu(spread: float | None = None) -> dict:
    """The recorded grid with every point's seconds (measured where measured, else modelled)."""
    grid = json.loads(GRID.read_text())
    wall = json.loads(WALL.read_text())
    steps = int(next(o.split("=")[1] for o in grid["fixed_overrides"] if o.startswith("trial.steps=")))
    model = fit(wall["points"])
    measured = {key(r["levers"]): r for r in wall["points"]}
    points = []
    for p in grid["points"]:
        row = measured.get(key(p["levers"]))
        if row is not None and (row["status"] == "oom" or len(row["step_times_s"]) == steps):
            costs = measured_costs(row)
        else:
            costs = modelled_costs(p["levers"], p["status"], model, steps)
        points.append({**p, **costs})
    today = today_spread(wall)
    return finish(
        {
            "name": "tiny_cpu",
            "grid": grid["grid"],
            "points": points,
            "budget_bytes": grid["budget_bytes"],
            "steps": steps,
            "first_timed_step": 2,  # the CPU tracker runs every step under a budget: step 2 is the first timed one
            "sigma": sigma_from_spread(spread if spread is not None else today),
            "spread": spread if spread is not None else today,
            "spread_today": today,
            "cost_model": model,
            "how": f"throughput and memory: {grid['how']} ({grid['measured_at']}); seconds: {wall['how']} "
            f"({wall['measured_at']}), the other points modelled (cost_model)",
        }
    )


def today_spread(wall: dict) -> float:
    """The median (max - min) / median over the top points' repeated runs (record_grid --wall-times)."""
    spreads = []
    for row in wall.get("top_spread") or []:
        runs = [r for r in row["tokens_per_s_runs"] if r]
        if len(runs) >= 2:
            spreads.append((max(runs) - min(runs)) / statistics.median(runs))
    return statistics.median(spreads)


# -------------------------------------------------------------------------------------- gemma3_1b_l4
def gemma_space() -> dict:
    from omegaconf import OmegaConf

    params = OmegaConf.load(GEMMA_SWEEP).hydra.sweeper.params
    space = {}
    for name, text in params.items():
        inner = str(text).strip()
        assert inner.startswith("choice(") and inner.endswith(")"), f"{name}: {text} (only choice() is modelled)"
        values = []
        for v in inner[len("choice(") : -1].split(","):
            v = v.strip()
            values.append({"true": True, "false": False}.get(v, int(v) if v.isdigit() else (float(v) if "." in v else v)))
        space[name] = values
    return space


def build_gemma() -> dict:
    """Estimate and time every point of the seed's Gemma space (minutes: ~6k estimates); cached in GEMMA."""
    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.memory.estimator import estimate
    from grpo_sweep.memory.throughput import relative_step_time

    space = gemma_space()
    base = {lora: compose_train_config(["+sweeps=gemma3_1b_l4", f"lora={lora}"]) for lora in space.get("lora", ["qv"])}
    rows = []
    for values in itertools.product(*space.values()):
        levers = dict(zip(space, values))
        if (levers["per_device_train_batch_size"] * levers["gradient_accumulation_steps"]) % levers["num_generations"]:
            continue
        cfg = base[levers.get("lora", "qv")].copy()
        for name, value in levers.items():
            if name != "lora":
                cfg[name] = value
        est = estimate(cfg)
        speed = relative_step_time(cfg)
        rows.append([*values, int(est.total_bytes), round(speed["step_s"], 5), round(speed["tokens_per_s"], 3)])
    out = {
        "how": "python bench/landscapes.py: every point of sweeps/gemma3_1b_l4.yaml (a model: estimator + throughput model)",
        "measured_at": measured_at(),
        "budget_bytes": int(base[next(iter(base))].gpu.memory_gib * 2**30),
        "steps": int(base[next(iter(base))].trial.steps),
        "grid": space,
        "columns": [*space, "predicted_peak_bytes", "step_s", "tokens_per_s"],
        "points": rows,
    }
    GEMMA.write_text(json.dumps(out) + "\n")
    return out


def gemma3_1b_l4(spread: float) -> dict:
    """The modelled Gemma landscape (see the module docstring), noise sigma from `spread`."""
    data = json.loads(GEMMA.read_text()) if GEMMA.exists() else build_gemma()
    check = json.loads(GPU_CHECK.read_text())["cases"]["l4"]  # a real trial on the H200 (3 steps)
    start = check["wall_time_s"] - check["steps"] * check["step_time_s"]
    budget, steps = data["budget_bytes"], data["steps"]
    rng = random.Random(SEED)
    points = []
    names = list(data["grid"])
    for values in data["points"]:
        row = {"levers": dict(zip(names, values)), **dict(zip(data["columns"][len(names) :], values[len(names) :]))}
        true_peak = row["predicted_peak_bytes"] * math.exp(rng.gauss(0, GEMMA_ESTIMATOR_SIGMA))
        ok = true_peak <= budget
        points.append(
            {
                "levers": row["levers"],
                "status": "ok" if ok else "oom",
                "tokens_per_s": row["tokens_per_s"] if ok else None,
                "predicted_peak_bytes": row["predicted_peak_bytes"],
                "peak_memory_bytes": int(min(true_peak, budget)),
                "memory_source": "cuda",
                "deficit_bytes": None if ok else int(true_peak - budget),
                "start_s": start,
                "step_s": [row["step_s"]] * steps,
                "oom_s": start + 0.5 * row["step_s"],  # it fails within its first step
                "cost_source": "model",
            }
        )
    return finish(
        {
            "name": "gemma3_1b_l4",
            "grid": data["grid"],
            "points": points,
            "budget_bytes": budget,
            "steps": steps,
            "first_timed_step": 2,  # CUDA: the allocator's peak is known after step 2 with worst-case lengths
            "sigma": sigma_from_spread(spread),
            "spread": spread,
            "cost_model": {"start_s": start, "start_source": "gpu_check_h200.json l4 case: wall - steps x step time"},
            "how": "A MODEL, not a measurement: "
            + data["how"]
            + f"; true peak = predicted x exp(N(0, {GEMMA_ESTIMATOR_SIGMA})); "
            f"start {start:.0f} s from a measured H200 trial; an OOM costs start + half a step",
        }
    )


if __name__ == "__main__":
    print(f"wrote {GEMMA}: {len(build_gemma()['points'])} points")
