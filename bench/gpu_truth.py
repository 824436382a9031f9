"""The device check's measurements on a card against the models: part a's memory cases (the estimate against
the allocator, reserved and NVML peaks) and the landscape's knobs (each knob's measured speed ratio against
the throughput model's, recomputed with the model as it is now), plus HF generate's per-layer per-decode-step
seconds (a card's eager_layer_s) fitted from the landscape's measured generation seconds.

`python bench/gpu_truth.py [CHECK.json LANDSCAPE.json]` writes bench/results/gpu_truth_<card>.json and .md
(the tables the Performance page includes). Reads recorded files only; runs no trial.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, markdown_table  # noqa: E402

CHECK = RESULTS / "gpu_check_h200_2026-12-04.json"
LANDSCAPE = ROOT / "bench" / "data" / "landscape_gpu_h200_2026-12-04.json"
DISAGREE = 0.10  # a ratio off the model's by more than this gets a sentence on the Performance page


def overrides(levers: dict) -> list[str]:
    return [f"{k}={'null' if v is None else str(v).lower()}" for k, v in levers.items()]


def model_at(recipe: list[str], levers: dict, eager_layer_s: float | None = None) -> dict:
    """The throughput model at one point of the landscape, with what the fits subtract.

    Args:
        recipe: the landscape's recipe overrides.
        levers: the point's knobs.
        eager_layer_s: HF generate's seconds per layer per decode step; None: the card's own.

    Returns:
        relative_step_time's dict, plus the decode layer-steps and the generation and training seconds
        without the card's eager_layer_s and microbatch_overhead_s terms."""
    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.memory.shapes import shapes
    from grpo_sweep.memory.throughput import card_of, generation_rounds, relative_step_time

    extra = [] if eager_layer_s is None else [f"gpu.eager_layer_s={eager_layer_s}"]
    cfg = compose_train_config([*recipe, *overrides(levers), *extra])
    s = shapes(cfg, "trl")
    r = relative_step_time(cfg)
    decode_steps = generation_rounds(cfg, s) * s.C  # HF generate: one wave a round, to the budget
    card = card_of(cfg)
    fixed = decode_steps * s.L * card.eager_layer_s
    return {
        **r,
        "decode_layer_steps": decode_steps * s.L,
        "generation_without_eager_s": r["generation_s"] - fixed,
        "micro_batches": s.GA,
        "training_without_microbatch_s": r["training_s"] - s.GA * card.microbatch_s,
    }


def fit_microbatch_s(land: dict) -> dict:
    """Fixed training seconds per micro-batch: per point without checkpointing, (measured training seconds -
    the model's training without that term) / micro-batches; the median."""
    per_point = []
    for p in land["points"]:
        if p["status"] != "ok" or not p.get("training_s") or p["levers"].get("gradient_checkpointing"):
            continue
        m = model_at(land["recipe"], p["levers"])
        per_point.append((p["training_s"] - m["training_without_microbatch_s"]) / m["micro_batches"])
    return {
        "microbatch_overhead_s": statistics.median(per_point),
        "min": min(per_point),
        "max": max(per_point),
        "points": len(per_point),
    }


def fit_eager_layer_s(land: dict) -> dict:
    """HF generate's seconds per layer per decode step: per point, (measured generation seconds - the model's
    generation without that term) / (decode steps x layers); the median over the points that ran."""
    per_point = []
    for p in land["points"]:
        if p["status"] != "ok" or not p.get("generation_s"):
            continue
        m = model_at(land["recipe"], p["levers"])
        per_point.append((p["generation_s"] - m["generation_without_eager_s"]) / m["decode_layer_steps"])
    return {"eager_layer_s": statistics.median(per_point), "min": min(per_point), "max": max(per_point), "points": len(per_point)}


def knob_rows(land: dict) -> list[dict]:
    """Each knob alone against the base point: measured tokens/s ratio (medians) and the model's."""
    points = [p for p in land["points"] if p["status"] == "ok"]
    base = points[0]
    base_model = model_at(land["recipe"], base["levers"])
    rows = []
    for p in points[1:]:
        changed = {k: v for k, v in p["levers"].items() if v != base["levers"][k]}
        if len(changed) != 1:
            continue
        ((knob, value),) = changed.items()
        m = model_at(land["recipe"], p["levers"])
        measured = p["tokens_per_s"] / base["tokens_per_s"]
        model = m["tokens_per_s"] / base_model["tokens_per_s"]
        rows.append(
            {
                "knob": f"{knob}={value}",
                "runs (knob/base)": f"{len(p['runs'])}/{len(base['runs'])}",
                "measured ratio": measured,
                "model ratio": model,
                "model ratio (recorded)": land["knob_ratios"][f"{knob}={value}"]["model"],
                "off by": f"{measured / model - 1:+.0%}",
                "gen s measured/model": f"{p['generation_s']:.2f}/{m['generation_s']:.2f}",
                "train s measured/model": f"{p['training_s']:.2f}/{m['training_s']:.2f}",
            }
        )
    return rows


def memory_rows(check: dict) -> list[dict]:
    """Part a: each case's estimate against its allocator, reserved and NVML peaks (GiB)."""
    gib = 2**30
    rows = []
    for name, c in check["cases"].items():
        if name == "doctor":
            est, v = c["estimate_after"]["total_bytes"], c["verify"]
            peaks = (v["peak_allocated_bytes"], v["peak_reserved_bytes"], v["nvml_peak_bytes"])
        else:
            est = c["estimate"]["total_bytes"]
            peaks = (c["peak_memory_bytes"], c["peak_reserved_bytes"], c["nvml_peak_bytes"])
        row = {"case": name, "status": c["status"], "estimate GiB": est / gib}
        row.update({f"{k} GiB": b / gib for k, b in zip(("allocator", "reserved", "NVML"), peaks)})
        row["allocator/estimate"] = peaks[0] / est
        row["NVML/estimate"] = peaks[2] / est
        row["wall s (cap)"] = f"{c['wall_s']:.0f} ({c['cap_s']:.0f})"
        rows.append(row)
    return rows


def main(check_path: Path = CHECK, landscape_path: Path = LANDSCAPE) -> dict:
    check, land = json.loads(Path(check_path).read_text()), json.loads(Path(landscape_path).read_text())
    card = land["card"]
    fit, micro = fit_eager_layer_s(land), fit_microbatch_s(land)
    knobs, memory = knob_rows(land), memory_rows(check)
    base = land["points"][0]
    base_model = model_at(land["recipe"], base["levers"])
    payload = {
        "check": str(Path(check_path).relative_to(ROOT)),
        "landscape": str(Path(landscape_path).relative_to(ROOT)),
        "card": card,
        "eager_layer_s_fit": fit,
        "microbatch_overhead_s_fit": micro,
        "base_measured_over_model": base["tokens_per_s"] / base_model["tokens_per_s"],
        "knobs": knobs,
        "memory": memory,
        "disagreements": [r["knob"] for r in knobs if abs(r["measured ratio"] / r["model ratio"] - 1) > DISAGREE],
    }
    (RESULTS / f"gpu_truth_{card}.json").write_text(json.dumps(payload, indent=2) + "\n")
    text = (
        f"#### Part a on the {card}: the estimate against the measured peaks\n\n{markdown_table(memory)}\n\n"
        f"#### The landscape's knobs on the {card}: measured speed ratio against the model's\n\n{markdown_table(knobs)}\n\n"
        f"Base point: measured {base['tokens_per_s']:.0f} tokens/s, model {base_model['tokens_per_s']:.0f} "
        f"({payload['base_measured_over_model']:.2f}x). HF generate's eager_layer_s fitted over {fit['points']} points: "
        f"{fit['eager_layer_s'] * 1e3:.2f} ms per layer per decode step (range {fit['min'] * 1e3:.2f}-{fit['max'] * 1e3:.2f}); "
        f"microbatch_overhead_s over the {micro['points']} points without checkpointing: {micro['microbatch_overhead_s']:.3f} s "
        f"(range {micro['min']:.3f}-{micro['max']:.3f}).\n\n"
        f"_From {payload['check']} and {payload['landscape']} (bench/gpu_truth.py)_\n"
    )
    (RESULTS / f"gpu_truth_{card}.md").write_text(text)
    return payload


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:3]]
    out = main(*args)
    print(
        json.dumps(
            {k: out[k] for k in ("eager_layer_s_fit", "microbatch_overhead_s_fit", "base_measured_over_model", "disagreements")},
            indent=2,
        )
    )
