"""The two landscapes the search-cost replay (bench/search_seconds.py) runs on.

A landscape is every point of a search space with what a trial of it would show and cost:
- status ok / oom, the true throughput (tokens/s: a point's median run), the peak or deficit;
- the estimator's prediction (the sweeper's pre-screen reads it);
- seconds: start (process start to the first GRPO step, plus the exit after the last), each step's
  seconds, and an OOM's seconds until it failed;
- the run-to-run noise: one run shows one of the point's measured runs (tiny_cpu), or
  true x exp(N(0, sigma)) (a model, or a machine noisier than the recording's).

tiny_cpu: the 180-point grid measured for real (bench/data/grid_tiny_cpu.json, record_grid.py):
    every point's runs (5 where it fits; the best points topped up: record_grid.py --top-up), each
    with its throughput and what it cost in seconds.
gemma3_1b_l4: a MODEL, not a measurement: the seed's search space for Gemma 3 1B on an L4 as
    sweeps/gemma3_1b_l4.yaml had it before sweeps held the recipe (the cached JSON's "grid"; bench/recipe_held.py
    selects the recipe-held spaces from it), the memory wall from grpo_sweep.memory.estimator (with a per-point
    error drawn like the estimator's measured GPU error), throughput and step seconds from
    grpo_sweep.memory.throughput.relative_step_time, start seconds from the H200 check's measured
    trial (bench/results/gpu_check_h200.json), noise drawn like the tiny grid's measured runs.
gpu_landscape(path): a landscape the device check measured on a card (scripts/gpu_landscape.py), each
    point with its runs and the sweeper's models' forecast of it.
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
GEMMA = ROOT / "bench" / "data" / "landscape_gemma3_1b_l4.json"
GPU_CHECK = ROOT / "bench" / "results" / "gpu_check_h200.json"
RANGE_IN_SIGMAS = 1.693  # the expected range (max - min) of 3 draws of a normal, in standard deviations
GEMMA_ESTIMATOR_SIGMA = 0.08  # true peak = predicted x exp(N(0, 0.08)): the H200 check measured 0.86x on one config
SEED = 0


def key(levers: dict) -> tuple:
    return tuple(sorted(levers.items()))


def finish(land: dict) -> dict:
    land["by_key"] = {key(p["levers"]): p for p in land["points"]}
    land["optimum"] = max(p["tokens_per_s"] for p in land["points"] if p["status"] == "ok")
    return land


# ------------------------------------------------------------------------------------------ tiny_cpu


def run_costs(run: dict) -> dict:
    """One recorded run (record_grid.run_record) as the replay charges it: start = wall time minus the
    steps (start latency + exit), the steps' seconds, and what it showed."""
    steps = list(run["step_times_s"])
    return {
        "tokens_per_s": run["tokens_per_s"],
        "start_s": run["wall_time_s"] - sum(steps),
        "step_s": steps,
        "wall_s": run["wall_time_s"],
    }


def repeated_runs(point: dict) -> list[float]:
    """A point's measured throughputs when it fits and ran at least twice (else none)."""
    runs = [r for r in point.get("tokens_per_s_runs") or [] if r]
    return runs if point["status"] == "ok" and len(runs) >= 2 else []


def measured_sigma(points: list[dict]) -> float:
    """The log-normal sigma of one run, pooled over the points that fit: sqrt(sum over points of the
    squared log deviations from the point's mean log / sum of (runs - 1))."""
    squares, dof = 0.0, 0
    for p in points:
        runs = repeated_runs(p)
        if not runs:
            continue
        logs = [math.log(r) for r in runs]
        mean = statistics.fmean(logs)
        squares += sum((x - mean) ** 2 for x in logs)
        dof += len(logs) - 1
    return math.sqrt(squares / dof)


def tiny_cpu(sigma: float | None = None) -> dict:
    """The recorded grid, every point with its measured runs and what each cost.

    sigma None: a replayed run of a point shows one of that point's recorded runs, drawn at random,
    and costs that run's seconds (the noise and the costs as measured). A number: the point's
    median throughput x exp(N(0, sigma)) at its mean costs."""
    grid = json.loads(GRID.read_text())
    steps = int(next(o.split("=")[1] for o in grid["fixed_overrides"] if o.startswith("trial.steps=")))
    points = []
    for p in grid["points"]:
        runs = [run_costs(r) for r in p["runs"]]
        point = {**p, "measured_runs": runs, "cost_source": "measured"}
        point["start_s"] = statistics.fmean(r["start_s"] for r in runs)
        point["oom_s"] = statistics.fmean(r["wall_s"] for r in runs)
        if p["status"] == "ok":
            point["step_s"] = [statistics.fmean(r["step_s"][i] for r in runs) for i in range(steps)]
        points.append(point)
    run_sigma = measured_sigma(grid["points"])
    return finish(
        {
            "name": "tiny_cpu",
            "grid": grid["grid"],
            "points": points,
            "budget_bytes": grid["budget_bytes"],
            "steps": steps,
            "first_timed_step": 2,  # the CPU tracker runs every step under a budget: step 2 is the first timed one
            "noise": "measured runs" if sigma is None else f"log-normal sigma {sigma:.3f}",
            "sigma": run_sigma if sigma is None else sigma,
            "measured_sigma": run_sigma,
            "spread": spread_of(grid["points"]) if sigma is None else sigma * RANGE_IN_SIGMAS,
            "load_avg_1m": grid.get("load_avg_1m"),
            "how": f"{grid['how']} ({grid['measured_at']}); every point's seconds and runs measured",
        }
    )


def spread_of(points: list[dict]) -> float | None:
    """The median over the points that fit of (max - min) / median of their runs (None: no point
    was run twice)."""
    spreads = []
    for p in points:
        if runs := repeated_runs(p):
            spreads.append((max(runs) - min(runs)) / statistics.median(runs))
    return statistics.median(spreads) if spreads else None


def truth_uncertainty(points: list[dict], optimum: float, within: float = 0.10) -> list[dict]:
    """How sure the benchmark's truth is where it decides "within 5 %": for each point within
    `within` of the optimum, its runs, its median / optimum and the relative standard error of that
    median (1.2533 x the standard deviation of its log runs / sqrt(runs)), best first."""
    out = []
    for p in points:
        runs = repeated_runs(p)
        if not runs or p["tokens_per_s"] < (1 - within) * optimum:
            continue
        se = 1.2533 * statistics.stdev(math.log(r) for r in runs) / math.sqrt(len(runs))
        out.append({"levers": p["levers"], "of_optimum": p["tokens_per_s"] / optimum, "runs": len(runs), "median_se": se})
    return sorted(out, key=lambda row: -row["of_optimum"])


# -------------------------------------------------------------------------------------- gemma3_1b_l4
def gemma_space() -> dict:
    """The OLD Gemma space (the seed's search before sweeps held the recipe: batch and accumulation independent,
    length, rank, 4-bit and targets searched alongside), as the cached landscape holds it. Not
    sweeps/gemma3_1b_l4.yaml: that sweep now holds the seed baseline's recipe (bench/recipe_held.py
    selects its recipe-held spaces from this one), and the old numbers in summary.json rest on this."""
    if not GEMMA.exists():
        raise FileNotFoundError(f"{GEMMA}: the cached old Gemma landscape (its 'grid' is the old space) is missing")
    return json.loads(GEMMA.read_text())["grid"]


def build_gemma() -> dict:
    """Estimate and time every point of the old Gemma space again (minutes: ~6k estimates); cached in GEMMA.
    The model, GPU and lengths come from +sweeps=gemma3_1b_l4; every lever of the old space is set per point."""
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
        "how": "python bench/landscapes.py: every point of the seed's old gemma3_1b_l4 space (a model: estimator + throughput model)",
        "measured_at": measured_at(),
        "budget_bytes": int(base[next(iter(base))].gpu.memory_gib * 2**30),
        "steps": int(base[next(iter(base))].trial.steps),
        "grid": space,
        "columns": [*space, "predicted_peak_bytes", "step_s", "tokens_per_s"],
        "points": rows,
    }
    GEMMA.write_text(json.dumps(out) + "\n")
    return out


def gemma3_1b_l4(sigma: float) -> dict:
    """The modelled Gemma landscape (see the module docstring): one run shows true x exp(N(0, sigma))."""
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
            "noise": f"log-normal sigma {sigma:.3f}",
            "sigma": sigma,
            "spread": sigma * RANGE_IN_SIGMAS,  # the expected (max - min) / median of 3 runs
            "cost_model": {"start_s": start, "start_source": "gpu_check_h200.json l4 case: wall - steps x step time"},
            "how": "A MODEL, not a measurement: "
            + data["how"]
            + f"; true peak = predicted x exp(N(0, {GEMMA_ESTIMATOR_SIGMA})); "
            f"start {start:.0f} s from a measured H200 trial; an OOM costs start + half a step",
        }
    )


# ------------------------------------------------------------- the shipped sweeps' spaces, with forecasts
# Each point carries the sweeper's own forecast of it (`grpo-sweep plan --json`: the pre-screen's peak
# and verdict, the throughput model's tokens/s, vLLM's waves), so a replay starts where the sweeper's
# start (start.choose) would and prunes what its pre-screen would.

TINY_VLLM = ROOT / "bench" / "data" / "landscape_tiny_cpu_vllm.json"
PLANS = ROOT / "bench" / "data"
# The Gemma sweep's knobs only: sweeps/gemma3_1b_l4.yaml with its concessions' parameters taken out, so
# every point trains the seed baseline's recipe (conf/preset/seed_baseline.yaml).
GEMMA_CONCESSION_PARAMS = ("max_seq_length", "num_generations", "lora_rank", "load_in_4bit", "lora")
GEMMA_KNOBS_OVERRIDES = (
    "+sweeps=gemma3_1b_l4",
    *(f"~hydra.sweeper.params.{name}" for name in GEMMA_CONCESSION_PARAMS),
    "hydra.sweeper.concessions=[]",
)
REFUSED = "vLLM could not start"  # the trial's error when vLLM's share cannot hold its weights and one sequence


def plan_of(name: str, overrides: tuple[str, ...], fresh: bool = False) -> dict:
    """`grpo-sweep plan OVERRIDES --json` (the sweeper's forecast of every point), cached in
    bench/data/plan_<name>.json: the same numbers a sweep of these overrides starts from."""
    import subprocess

    path = PLANS / f"plan_{name}.json"
    if path.exists() and not fresh:
        data = json.loads(path.read_text())
        if data.get("overrides") == list(overrides):
            return data
    done = subprocess.run(
        [sys.executable, "-c", "from grpo_sweep.cli import main; main()", "plan", *overrides, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"grpo-sweep plan {' '.join(overrides)} failed: {done.stderr[-2000:]}")
    data = {"overrides": list(overrides), "made_at": measured_at(), **json.loads(done.stdout)}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def forecasts(plan: dict) -> dict:
    """The plan's points as the sweeper's forecast.Forecast objects, keyed like a landscape's points."""
    from hydra_plugins.grpo_optuna_sweeper.forecast import Forecast

    out = {}
    for p in plan["points"]:
        if p.get("error") is not None:
            out[key(p["params"])] = Forecast(p["params"], error=p["error"])
            continue
        share = p["predicted_peak_bytes"] / p["limit_bytes"] if p["limit_bytes"] else None
        out[key(p["params"])] = Forecast(
            p["params"],
            predicted_bytes=p["predicted_peak_bytes"],
            limit_bytes=p["limit_bytes"],
            runs=p["prescreen"] == "run",
            tokens_per_s=p["predicted_tokens_per_s"],
            waves=p["generation_waves"],
            # the plan keeps `fits` (share <= 1 and vLLM starts), not vLLM's start alone
            vllm_starts=bool(p["fits"]) or share is None or share > 1,
            taken=p["concessions_taken"],
            departures=p.get("departures", 0),
        )
    return out


def with_forecast(point: dict, f) -> dict:
    """A point with the sweeper's forecast of it: the pre-screen reads predicted_peak_bytes against
    limit_bytes (search_seconds.sweep), the start reads `forecast`."""
    return {**point, "forecast": f, "predicted_peak_bytes": f.predicted_bytes, "limit_bytes": f.limit_bytes}


def tiny_cpu_vllm(path: Path = TINY_VLLM, sigma: float | None = None) -> dict:
    """The measured landscape of sweeps/tiny_cpu_vllm.yaml (record_grid.py --sweep tiny_cpu_vllm): every
    point of the shipped knob space run for real, its runs and what each cost.

    A point that fits: one replayed run shows one of its measured runs (sigma None) or its median x
    exp(N(0, sigma)) at its mean costs. A point that did not: `oom` (training over the card: the
    tensor tracker's OOM) or refused (vLLM would not start in its share): both infeasible, charged
    their measured wall time. Points the recording has not reached yet are left out (a partial file)."""
    data = json.loads(path.read_text())
    plan = forecasts(plan_of("tiny_cpu_vllm", ("+sweeps=tiny_cpu_vllm",)))
    recorded = [p for p in data["points"] if p["status"] is not None and p["runs"]]
    points = [measured_point(p, plan[key(p["levers"])], "tracker") for p in recorded]
    run_sigma = measured_sigma(recorded) if any(repeated_runs(p) for p in recorded) else 0.0  # one pass only: no spread yet
    steps = len(next(p["step_s"] for p in points if p["status"] == "ok"))
    return finish(
        {
            "name": "tiny_cpu_vllm",
            "grid": plan_grid(data["points"]),
            "points": points,
            "budget_bytes": int(0.125 * 2**30),
            "steps": steps,
            "first_timed_step": 2,  # the CPU tracker runs every step under a budget: step 2 is the first timed one
            "noise": "measured runs" if sigma is None else f"log-normal sigma {sigma:.3f}",
            "sigma": run_sigma if sigma is None else sigma,
            "measured_sigma": run_sigma,
            "spread": spread_of(recorded) if sigma is None else sigma * RANGE_IN_SIGMAS,
            "recorded_points": len(recorded),
            "space_points": len(data["points"]),
            "runs": sum(len(p["runs"]) for p in recorded),
            "sessions": data.get("sessions", []),
            "how": f"{data['how']}; {len(recorded)} of {len(data['points'])} points recorded, "
            f"{sum(len(p['runs']) for p in recorded)} runs",
        }
    )


def measured_point(p: dict, f, memory_source: str) -> dict:
    """A recorded point (record_grid.py --sweep, scripts/gpu_landscape.py) as the replay runs it: its
    forecast, its measured runs and their mean costs; a point that did not fit is charged its runs' wall
    time and keeps no deficit (the sampler learns only "infeasible")."""
    runs = [run_costs(r) for r in p["runs"]]
    point = with_forecast({**p, "cost_source": "measured", "refused": REFUSED in (p.get("error") or "")}, f)
    point["oom_s"] = statistics.fmean(r["wall_s"] for r in runs)
    if p["status"] == "ok":
        ok = [r for r in runs if r["tokens_per_s"]]
        point["measured_runs"] = ok
        point["start_s"] = statistics.fmean(r["start_s"] for r in ok)
        point["step_s"] = [statistics.fmean(r["step_s"][i] for r in ok) for i in range(len(ok[0]["step_s"]))]
    else:
        point["deficit_bytes"] = None
        point["memory_source"] = memory_source
    return point


def gpu_landscape(path: Path, sigma: float | None = None) -> dict:
    """A landscape measured on a card by the device check (scripts/gpu_check.sh --part landscape:
    landscape_gpu_<card>_<date>.json, or its CPU dry run): one recipe's knob points, each with its runs
    and the sweeper's models' forecast of it recorded beside them (the estimator's peak against the
    trial's budget, the throughput model's tokens/s). Replayed like tiny_cpu_vllm: sigma None draws one
    of a point's measured runs, a number its median x exp(N(0, sigma)). The grid is the part's axes; a
    point the recording did not reach is absent (the replay fails it unrun, as TRL's refusal)."""
    from hydra_plugins.grpo_optuna_sweeper.config import GrpoOptunaSweeperConf
    from hydra_plugins.grpo_optuna_sweeper.forecast import Forecast
    from hydra_plugins.grpo_optuna_sweeper.outcome import prescreen_verdict

    data = json.loads(Path(path).read_text())
    margin = GrpoOptunaSweeperConf().prescreen_margin
    recorded = [p for p in data["points"] if p["status"] is not None and p["runs"]]
    points = []
    for p in recorded:
        limit, peak = p.get("limit_bytes"), p.get("predicted_peak_bytes")
        f = Forecast(
            p["levers"],
            predicted_bytes=peak,
            limit_bytes=limit,
            runs=peak is None or prescreen_verdict(peak, limit, margin) is None,
            tokens_per_s=p.get("predicted_tokens_per_s"),
        )
        points.append(measured_point(p, f, p.get("memory_source") or "cuda"))
    run_sigma = measured_sigma(recorded) if any(repeated_runs(p) for p in recorded) else 0.0
    ok = [p for p in points if p["status"] == "ok"]
    if not ok:
        raise ValueError(f"{path}: no point of the landscape fitted; nothing to replay")
    return finish(
        {
            "name": Path(path).stem,
            "grid": data["grid"],
            "points": points,
            "budget_bytes": max(p.get("limit_bytes") or 0 for p in recorded) or None,
            "steps": len(ok[0]["step_s"]),
            "first_timed_step": 2,  # two steps a point: the first is warm-up, the second measured
            "noise": "measured runs" if sigma is None else f"log-normal sigma {sigma:.3f}",
            "sigma": run_sigma if sigma is None else sigma,
            "measured_sigma": run_sigma,
            "spread": spread_of(recorded) if sigma is None else sigma * RANGE_IN_SIGMAS,
            "recorded_points": len(recorded),
            "runs": sum(len(p["runs"]) for p in recorded),
            "card": data.get("card"),
            "recipe": data.get("recipe", []),  # the overrides every point adds to: what the sweeper composes
            "sessions": data.get("sessions", []),
            "how": f"{data['how']}; {len(recorded)} points recorded, {sum(len(p['runs']) for p in recorded)} runs",
        }
    )


def plan_grid(points: list[dict]) -> dict:
    """The space's values per parameter, in the order the points first show them."""
    grid: dict = {}
    for p in points:
        for k, v in p["levers"].items():
            if v not in grid.setdefault(k, []):
                grid[k].append(v)
    return grid


def gemma3_1b_l4_knobs(sigma: float) -> dict:
    """A MODEL, not a measurement: sweeps/gemma3_1b_l4.yaml's knob space (its concessions' parameters
    taken out: the seed baseline's recipe held), every point as the sweeper forecasts it (plan_of).

    As gemma3_1b_l4: true peak = predicted x exp(N(0, GEMMA_ESTIMATOR_SIGMA)) (over the budget: an
    OOM, start + half a step); true tokens/s = the throughput model's (the model is the truth: the
    model start's best case); step seconds from the recipe's tokens per step (held: the same at every
    point); start seconds from the measured H200 trial; one run shows true x exp(N(0, sigma))."""
    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.memory.throughput import relative_step_time

    plan = plan_of("gemma3_1b_l4_knobs", GEMMA_KNOBS_OVERRIDES)
    judged = forecasts(plan)
    base = compose_train_config(["+sweeps=gemma3_1b_l4"])
    speed = relative_step_time(base)
    tokens_per_step = speed["step_s"] * speed["tokens_per_s"]
    check = json.loads(GPU_CHECK.read_text())["cases"]["l4"]  # a real trial on the H200 (3 steps)
    start = check["wall_time_s"] - check["steps"] * check["step_time_s"]
    steps = int(base.trial.steps)
    rng = random.Random(SEED)
    points = []
    for f in judged.values():
        if f.error is not None:  # the sweeper refuses it before any model loads: not in the landscape (FAIL, unrun)
            continue
        true_peak = f.predicted_bytes * math.exp(rng.gauss(0, GEMMA_ESTIMATOR_SIGMA))
        true_speed = f.tokens_per_s
        ok = true_peak <= f.limit_bytes
        step_s = tokens_per_step / true_speed
        points.append(
            with_forecast(
                {
                    "levers": f.params,
                    "status": "ok" if ok else "oom",
                    "refused": False,
                    "tokens_per_s": true_speed if ok else None,
                    "peak_memory_bytes": int(min(true_peak, f.limit_bytes)),
                    "memory_source": "cuda",
                    "deficit_bytes": None if ok else int(true_peak - f.limit_bytes),
                    "start_s": start,
                    "step_s": [step_s] * steps,
                    "oom_s": start + 0.5 * step_s,
                    "cost_source": "model",
                },
                f,
            )
        )
    return finish(
        {
            "name": "gemma3_1b_l4_knobs",
            "grid": plan["space"]["parameters"],
            "points": points,
            "budget_bytes": int(base.gpu.memory_gib * 2**30),
            "steps": steps,
            "first_timed_step": 2,
            "noise": f"log-normal sigma {sigma:.3f}",
            "sigma": sigma,
            "spread": sigma * RANGE_IN_SIGMAS,
            "how": "A MODEL, not a measurement: sweeps/gemma3_1b_l4.yaml's knobs (recipe held: the seed baseline), "
            f"each point as `grpo-sweep plan` forecasts it; true peak = predicted x exp(N(0, {GEMMA_ESTIMATOR_SIGMA})); "
            "true tokens/s = the throughput model's; "
            f"start {start:.0f} s from a measured H200 trial; an OOM costs start + half a step",
        }
    )


if __name__ == "__main__":
    print(f"wrote {GEMMA}: {len(build_gemma()['points'])} points")
