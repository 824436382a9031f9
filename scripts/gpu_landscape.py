"""The device check's landscape part: one recipe's knob landscape, measured on the card.

Every point is a real GRPO trial of one recipe (Gemma 3 1B's architecture with random weights, no
download; completions_per_step, num_generations and the lengths held) that differs in the knobs
only: the split (per_device_train_batch_size of a fixed completions_per_step), steps_per_generation
(micro-batches generated at once, at or below the accumulation), gradient checkpointing, the
attention kernel and the fused AdamW. All trials start from this one process through
`grpo_sweep.trial.parent.run_trial` (as bench/record_grid.py does), so a point costs its trial
process alone, not a fresh interpreter and Hydra app each.

The points run in value order: the base point, each knob moved alone, then two at once, and so on
(AXES: the first value of each axis is the base). A point starts only while the time left holds it
and the reruns still owed; then the best `top` points run again until each has `repeats` runs.
Per run: tokens/s, the generation and training seconds (metrics.json's `generation_s`/`training_s`
where the trial records them, else `generation_time_s` times TRL's generation calls a step, and
the step less it), `mfu_training` and
`decode_bandwidth_use` where recorded, the allocator and NVML peaks, and the throughput model's
prediction of the same point (memory/throughput.py relative_step_time).

Writes landscape_gpu_<card>_<date>.json in the format of bench/data/landscape_tiny_cpu_vllm.json
(bench/record_grid.py --sweep), with each point's forecast beside it, so bench/landscapes.py
gpu_landscape replays it in the search bench. The file is rewritten after every run.

Run by scripts/gpu_check.sh --part landscape (on the card) or --part landscape --cpu-dry-run (the
tiny model, a few points, the same flow).
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from common import measured_at  # noqa: E402 - bench/ is not a package
from record_grid import run_record  # noqa: E402

# The knobs, each axis's first value the base point's; among points that move as many knobs, those
# moving an earlier axis run first. steps_per_generation null is the accumulation (one generation per
# optimiser step); 1 generates each micro-batch on its own, the dearest points (up to 8 calls a step).
AXES = {
    "per_device_train_batch_size": [8, 4, 16, 32],
    "gradient_checkpointing": [False, True],
    "attn_implementation": ["sdpa", "eager"],
    "optim": ["adamw_torch", "adamw_torch_fused"],
    "steps_per_generation": [None, 1],
}
AXES_CPU = {**AXES, "per_device_train_batch_size": [4, 2, 8]}
# The recipe every point holds. 480-token prompts and 32-token completions: the training pass is long
# enough for the knobs to show, HF generate's decode (~40 ms a token on the card) stays short.
RECIPE = [
    "model=gemma3_1b",
    "model.source=random",
    "model.tokenizer=local",
    "backend=trl",
    "task.num_prompts=64",
    "completions_per_step=32",
    "num_generations=4",
    "max_seq_length=512",
    "max_prompt_length=480",
    "lora_rank=16",
]
RECIPE_CPU = [
    "model=tiny",
    "model.init=random",
    "backend=trl",
    "task.num_prompts=32",
    "gpu=cpu_sim",
    "gpu.memory_gib=1.0",
    "completions_per_step=8",
    "num_generations=4",
    "max_seq_length=64",
    "max_prompt_length=32",
]
# Two optimiser steps: the first is warm-up, the second is measured. On the card the trials fork
# from one warm forkserver (torch, transformers and TRL imported once); it initialises no CUDA when
# bitsandbytes is absent (scripts/gpu_check.sh installs the landscape's wheels without it).
RUN = ["trial.steps=2", "trial.start_method=forkserver"]
TRIAL_CAP_S = {"gpu": 120, "cpu": 60}  # trial.timeout_s of one point, cut to the time left
FIRST_GUESS_S = {"gpu": 25.0, "cpu": 4.0}  # a run's seconds until the first one is measured


def ordered_points(axes: dict) -> list[dict]:
    """Every point of the grid, the base first, then by how many knobs differ from it (fewest first),
    ties in the axes' order; a steps_per_generation that equals the accumulation (the null point's
    config again) is left out."""
    base = {k: v[0] for k, v in axes.items()}
    points = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
    points = [
        p
        for p in points
        if not (p["steps_per_generation"] == 1 and p["per_device_train_batch_size"] == max(axes["per_device_train_batch_size"]))
    ]

    def rank(p: dict) -> tuple:
        moved = [i for i, k in enumerate(axes) if p[k] != base[k]]
        return (len(moved), moved, [axes[k].index(p[k]) for k in axes])

    return sorted(points, key=rank)


def overrides_of(point: dict) -> list[str]:
    return [f"{k}={'null' if v is None else str(v).lower() if isinstance(v, bool) else v}" for k, v in point.items()]


def gpu_conf_for(env: dict) -> str:
    """The conf/gpu/*.yaml of the card this runs on (its family in the name, its memory within 15 %), so
    the throughput model predicts for the card that measures. An unknown card stops the part: its
    datasheet numbers are needed."""
    import yaml

    name = (env.get("gpu") or "").lower()
    total = (env.get("total_memory_bytes") or 0) / 2**30
    found = []
    for path in sorted((ROOT / "src" / "grpo_sweep" / "conf" / "gpu").glob("*.yaml")):
        conf = yaml.safe_load(path.read_text())
        family = path.stem.split("_")[0]
        gib = conf.get("memory_gib") or 0
        near = abs(gib - total) <= 0.15 * gib  # an L40S is no L4
        if not conf.get("simulated") and family in name.replace(" ", "") and near:
            found.append((abs(gib - total), path.stem))
    if not found:
        raise SystemExit(f"gpu_landscape: no conf/gpu/*.yaml for the card {env.get('gpu')!r}; add one (ARCHITECTURE.md: a card)")
    return min(found)[1]


def speed_fields(m: dict, calls_per_step: int) -> dict:
    """The generation and training seconds of a run's steps, and how they were found: metrics.json's own
    split and the card's fractions where the trial records them, else derived: generation_time_s is the
    median of TRL's generation calls, `calls_per_step` of them in each optimiser step."""
    out = {k: m.get(k) for k in ("generation_s", "training_s", "mfu_training", "decode_bandwidth_use") if m.get(k) is not None}
    if "generation_s" in out:
        out["speed_source"] = "metrics.json"
        return out
    gen, step = m.get("generation_time_s"), m.get("step_time_s")
    if gen is not None and step is not None:
        gen *= calls_per_step
        out.update(
            generation_s=gen,
            training_s=max(step - gen, 0.0),
            speed_source=f"generation_time_s x {calls_per_step} calls a step; the step time less it",
        )
    return out


def calls_per_step(cfg) -> int:
    """TRL's generation calls in one optimiser step: the accumulation over steps_per_generation (one
    call per generation batch), at least one."""
    from grpo_sweep.config.split import split_of

    accum = split_of(cfg)[1] or 1
    return max(1, accum // (cfg.get("steps_per_generation") or accum))


def predicted(cfg) -> dict:
    """The throughput model's seconds and tokens/s for this point (pure arithmetic, no torch)."""
    from grpo_sweep.memory.throughput import relative_step_time

    model = relative_step_time(cfg)
    return {f"predicted_{k}": model[k] for k in ("tokens_per_s", "training_s", "generation_s") if k in model}


def record(
    *,
    cpu: bool,
    budget_s: float,
    out_dir: Path,
    env: dict,
    max_points: int | None = None,
    top: int = 5,
    repeats: int = 3,
    work: Path | None = None,
    say=print,
) -> Path:
    """Run the landscape within `budget_s` seconds; return the written file's path."""
    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.config.local import validate_here
    from grpo_sweep.config.schema import ConfigError
    from grpo_sweep.trial.parent import run_trial

    t0 = time.monotonic()
    flavour = "cpu" if cpu else "gpu"
    axes = AXES_CPU if cpu else AXES
    card = "cpu" if cpu else gpu_conf_for(env)
    recipe = RECIPE_CPU if cpu else [*RECIPE, f"gpu={card}"]
    run = list(RUN)
    order = ordered_points(axes)[:max_points]
    slug = "cpu" if cpu else card.split("_")[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"landscape_gpu_{slug}_{time.strftime('%Y-%m-%d')}.json"
    data = {
        "how": "scripts/gpu_check.sh --part landscape"
        + (" --cpu-dry-run" if cpu else "")
        + ": real GRPO trials of one recipe (`recipe`), the knobs in `grid` varied, in value order (the base point, "
        "each knob alone, then two at once, ...) as long as the time budget held them; the best points run again "
        f"until {repeats} runs each; tokens_per_s the median; all trials forked from one process (run_trial)",
        "card": card,
        "recipe": recipe,
        "run_overrides": run,
        "grid": axes,
        "repeats": repeats,
        "top": top,
        "budget_s": budget_s,
        "versions": env.get("versions"),
        "sessions": [{"started_at": measured_at(), "conditions": "the device check's landscape part, nothing else running"}],
        "points": [],
        "not_reached": [],
    }
    costs: list[float] = []
    rows: dict[tuple, dict] = {}
    work = Path(work or tempfile.mkdtemp(prefix="gpu_landscape_"))

    def left() -> float:
        return budget_s - (time.monotonic() - t0)

    def per_run() -> float:
        """A run's seconds so far; the first run also started the forkserver, so it counts alone only."""
        return statistics.median(costs[1:] or costs) if costs else FIRST_GUESS_S[flavour]

    def save() -> None:
        data["elapsed_s"] = round(time.monotonic() - t0, 1)
        data["per_run_s"] = {
            "median": round(per_run(), 2) if costs else None,
            "start_s_median": start_overhead(data["points"]),
            "runs": len(costs),
        }
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
        tmp.replace(path)  # whole or not at all

    def run_point(point: dict, attempt: int) -> dict:
        cfg = compose_train_config([*recipe, *overrides_of(point), *run])
        try:
            validate_here(cfg, cuda=not cpu)
        except ConfigError as err:  # refused before any model loads: recorded, never run (the loader skips it)
            row = {
                "levers": point,
                "status": "refused",
                "tokens_per_s": None,
                "tokens_per_s_runs": [],
                "runs": [],
                "error": str(err),
            }
            data["points"].append(row)
            say(f"[landscape] {point} refused: {err}")
            return row
        cfg.trial.timeout_s = int(max(10, min(TRIAL_CAP_S[flavour], left() - 5)))
        started = time.monotonic()
        m = run_trial(cfg, work / f"{len(costs)}")
        costs.append(time.monotonic() - started)
        forked = "trial.start_method=forkserver" in run
        if forked and not cpu and len(costs) == 1 and m["status"] not in ("ok", "oom"):
            # The first trial on the card failed under the forkserver (one that initialised CUDA on
            # import leaves no forked trial a working CUDA): that point and every later one spawn.
            run[run.index("trial.start_method=forkserver")] = "trial.start_method=spawn"
            data["run_overrides"] = run
            data["start_method_note"] = f"the first trial failed under forkserver, so all spawn: {(m.get('error') or '')[:300]}"
            return run_point(point, attempt)
        row = rows.get(key(point))
        if row is None:
            row = rows[key(point)] = {"levers": point, "status": None, "tokens_per_s_runs": [], "runs": []}
            row.update(predicted(cfg))
            data["points"].append(row)
        row["runs"].append(
            {
                **run_record(m),
                "status": m.get("status"),
                **speed_fields(m, calls_per_step(cfg)),
                **{k: m.get(k) for k in ("peak_memory_bytes", "peak_reserved_bytes", "nvml_peak_bytes")},
            }
        )
        row["tokens_per_s_runs"].append(m.get("tokens_per_s"))
        ok = [r for r in row["tokens_per_s_runs"] if r is not None]
        row.update(
            status=m["status"] if row["status"] in (None, "ok") else row["status"],
            tokens_per_s=statistics.median(ok) if ok else None,
            peak_memory_bytes=m.get("peak_memory_bytes"),
            nvml_peak_bytes=m.get("nvml_peak_bytes"),
            peak_reserved_bytes=m.get("peak_reserved_bytes"),
            predicted_peak_bytes=m.get("predicted_peak_bytes"),
            limit_bytes=m.get("budget_bytes"),
            memory_source=m.get("memory_source"),
            error=(m.get("error") or "")[:300] or None,
            **median_speed(row["runs"]),
        )
        say(
            f"[landscape] {attempt + 1}/{repeats} {point} {m['status']} {m.get('tokens_per_s') or 0:.0f} tok/s "
            f"{costs[-1]:.1f} s ({left():.0f} s left)"
        )
        save()
        return row

    for i, point in enumerate(order):
        fits = sum(1 for r in data["points"] if r["status"] == "ok")
        owed = min(top, fits + 1) * (repeats - 1)  # the reruns this point may add to
        if left() < per_run() * (1 + owed):
            data["not_reached"] = order[i:]
            break
        run_point(point, 0)
    best = sorted((r for r in data["points"] if r["status"] == "ok"), key=lambda r: -r["tokens_per_s"])[:top]
    for attempt in range(1, repeats):
        for row in best:
            if len(row["runs"]) > attempt:
                continue
            if left() < per_run():
                data.setdefault("reruns_skipped", []).append(row["levers"])
                continue
            run_point(row["levers"], attempt)
    data["knob_ratios"] = knob_ratios(data)
    save()
    say(table(data))
    for name, r in data["knob_ratios"].items():
        say(f"  {name}: measured x{r['measured']:.3f}, model x{r['model']:.3f} ({r['disagreement']:+.0%})")
    say(f"wrote {path} ({len(data['points'])} points, {len(costs)} runs, {time.monotonic() - t0:.0f} s)")
    return path


def knob_ratios(data: dict) -> dict:
    """Each knob moved alone against the base point: its measured speed ratio (median tokens/s over the
    base's), the throughput model's, and how far they disagree (measured / model - 1): the numbers the
    Performance page reports per knob. Only points where both ran and the model predicted."""
    axes = data["grid"]
    base_levers = {k: v[0] for k, v in axes.items()}
    by = {key(p["levers"]): p for p in data["points"] if p["status"] == "ok" and p.get("tokens_per_s")}
    base = by.get(key(base_levers))
    out = {}
    if base is None or not base.get("predicted_tokens_per_s"):
        return out
    for name, values in axes.items():
        for value in values[1:]:
            p = by.get(key({**base_levers, name: value}))
            if p is None or not p.get("predicted_tokens_per_s"):
                continue
            measured = p["tokens_per_s"] / base["tokens_per_s"]
            model = p["predicted_tokens_per_s"] / base["predicted_tokens_per_s"]
            out[f"{name}={value}"] = {"measured": measured, "model": model, "disagreement": measured / model - 1}
    return out


def table(data: dict) -> str:
    """The points as a person reads them: the knobs that differ from the base, measured and modelled."""
    axes = data["grid"]
    base = {k: v[0] for k, v in axes.items()}
    rows = [
        f"{'point (moved from the base)':<44} {'status':<7} {'tok/s':>7} {'model':>7} {'runs':>4} {'gen s':>6} {'train s':>7} {'peak GiB':>8}"
    ]
    for p in data["points"]:
        moved = " ".join(f"{k}={v}" for k, v in p["levers"].items() if v != base[k]) or "base"
        num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        rows.append(
            f"{moved[:44]:<44} {str(p['status'])[:7]:<7} {num(p['tokens_per_s'], '.0f'):>7} "
            f"{num(p.get('predicted_tokens_per_s'), '.0f'):>7} {len(p['runs']):>4} {num(p.get('generation_s'), '.2f'):>6} "
            f"{num(p.get('training_s'), '.2f'):>7} {num(p.get('peak_memory_bytes') and p['peak_memory_bytes'] / 2**30, '.2f'):>8}"
        )
    return "\n".join(rows)


def key(levers: dict) -> tuple:
    return tuple(sorted(levers.items(), key=lambda kv: kv[0]))


def median_speed(runs: list[dict]) -> dict:
    """The point's median generation and training seconds (and the card fractions) over its runs that fit."""
    out = {}
    for k in ("generation_s", "training_s", "mfu_training", "decode_bandwidth_use"):
        values = [r[k] for r in runs if r.get("status") == "ok" and r.get(k) is not None]
        out[k] = statistics.median(values) if values else None
    return out


def start_overhead(points: list[dict]) -> float | None:
    """The median seconds of a run beyond its steps (the trial process's start and exit): what a point
    costs over its training, the number the device budget is planned from."""
    extra = [
        r["wall_time_s"] - sum(r["step_times_s"]) for p in points for r in p["runs"] if r.get("wall_time_s") and r["step_times_s"]
    ]
    return round(statistics.median(extra), 2) if extra else None
