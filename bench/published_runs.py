"""The throughput model against public GRPO runs on GPUs: predicted vs measured seconds per step.

    PYTHONPATH=src python bench/published_runs.py

Reads bench/data/published_grpo_runs.json (each run with its source, card, settings and measured
step time; how they were collected and how fit/heldout was chosen is in that file). Each run the model
can express (`predictable`) becomes our config: the card's conf/gpu file, conf/model where we have the
model, else `model=hub` with the architecture numbers the data file records beside their source, the
Unsloth backend (every run is an Unsloth notebook) with its vLLM switch, all-linear LoRA with
gradient checkpointing (Unsloth's notebooks), and one prompt's `num_generations` completions per
micro-batch. Today's model (`memory.throughput.relative_step_time`) predicts each at the full
completion budget, as the sweep uses it. Reported per split: the factor off max(p/m, m/p), its median
and worst, Spearman's rho of predicted against measured, and each same-setup card pair's ratio error
|predicted ratio / measured ratio - 1|. Beside them, informational: the prediction at the run's
measured mean completion length, where the output logs it.
Writes bench/results/published_runs.json and .md.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from common import RESULTS, write_result

from grpo_sweep.config.compose import compose_train_config
from grpo_sweep.memory.throughput import relative_step_time
from grpo_sweep.report.trials import average_ranks, spearman

DATA = Path(__file__).resolve().parent / "data" / "published_grpo_runs.json"
SPLITS = ("fit", "heldout")
ARCH_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
    "max_position_embeddings",
)


def load(path: Path = DATA) -> dict:
    return json.loads(path.read_text())


def overrides(run: dict, completion_tokens: int | None = None) -> list[str]:
    """The Hydra overrides that make RUN our config; COMPLETION_TOKENS replaces the completion budget."""
    completion = completion_tokens or run["max_completion_length"]
    out = [f"gpu={run['card']}"]
    if run.get("model_conf"):
        out.append(f"model={run['model_conf']}")
    else:
        out += ["model=hub", f"model.hub_id={run['model']}"]
        out += [
            f"++model.arch.{k}={str(run['arch'][k]).lower() if isinstance(run['arch'][k], bool) else run['arch'][k]}"
            for k in ARCH_KEYS
        ]
    out += [
        "backend=unsloth",
        f"backend.fast_inference={'true' if run['use_vllm'] else 'false'}",
        f"load_in_4bit={'true' if run['quant'] == '4bit' else 'false'}",
        f"lora_rank={run['lora_rank']}",
        "lora=all_linear",
        "gradient_checkpointing=true",
        f"num_generations={run['num_generations']}",
        f"per_device_train_batch_size={max(run['per_device_train_batch_size'], run['num_generations'])}",
        f"gradient_accumulation_steps={run['gradient_accumulation_steps']}",
        f"max_prompt_length={run['max_prompt_length']}",
        f"max_seq_length={run['max_prompt_length'] + completion}",
    ]
    if run.get("gpu_memory_utilization") is not None:
        out.append(f"gpu_memory_utilization={run['gpu_memory_utilization']}")
    return out


def predict(run: dict, completion_tokens: int | None = None) -> dict:
    return relative_step_time(compose_train_config(overrides(run, completion_tokens)))


def factor(predicted: float, measured: float) -> float:
    return max(predicted / measured, measured / predicted)


def split_summary(rows: list[dict]) -> dict:
    factors = [r["factor"] for r in rows]
    rho = spearman(average_ranks([r["predicted_s"] for r in rows]), average_ranks([r["measured_s"] for r in rows]))
    return {
        "runs": len(rows),
        "median_factor": statistics.median(factors) if factors else None,
        "worst_factor": max(factors) if factors else None,
        "spearman_rho": rho,
    }


def card_pairs(data: dict, by_id: dict[str, dict]) -> list[dict]:
    out = []
    for a, b in data.get("card_pairs", []):
        if a not in by_id or b not in by_id:
            continue
        ra, rb = by_id[a], by_id[b]
        measured, predicted = ra["measured_s"] / rb["measured_s"], ra["predicted_s"] / rb["predicted_s"]
        out.append(
            {
                "pair": f"{a} / {b}",
                "cards": f"{ra['card']} / {rb['card']}",
                "splits": f"{ra['split']} / {rb['split']}",
                "measured_ratio": measured,
                "predicted_ratio": predicted,
                "ratio_error": abs(predicted / measured - 1),
            }
        )
    return out


def evaluate(data: dict) -> dict:
    rows, skipped = [], []
    for run in data["runs"]:
        if not run.get("predictable", True):
            skipped.append({"id": run["id"], "why": run["notes"].split(":")[0]})
            continue
        p = predict(run)
        row = {
            "id": run["id"],
            "card": run["card"],
            "split": run["split"],
            "measured_s": run["seconds_per_step"],
            "predicted_s": p["step_s"],
            "generation_s": p["generation_s"],
            "training_s": p["training_s"],
            "factor": factor(p["step_s"], run["seconds_per_step"]),
        }
        mean = run.get("completion_length_mean")
        if mean:
            at_mean = predict(run, round(mean))["step_s"]
            row["predicted_at_mean_length_s"] = at_mean
            row["factor_at_mean_length"] = factor(at_mean, run["seconds_per_step"])
        rows.append(row)
    by_id = {r["id"]: r for r in rows}
    pairs = card_pairs(data, by_id)
    heldout_pairs = [p for p in pairs if p["splits"] == "heldout / heldout"]
    return {
        "model": "memory.throughput.relative_step_time at the full completion budget",
        "data": str(DATA.relative_to(DATA.parents[2])),
        "splits": {s: split_summary([r for r in rows if r["split"] == s]) for s in SPLITS},
        "all": split_summary(rows),
        "card_pairs": pairs,
        "published_heldout_median_factor": split_summary([r for r in rows if r["split"] == "heldout"])["median_factor"],
        "published_heldout_worst_factor": split_summary([r for r in rows if r["split"] == "heldout"])["worst_factor"],
        "published_card_ratio_error": heldout_pairs[0]["ratio_error"] if heldout_pairs else None,
        "rows": rows,
        "not_predicted": skipped,
    }


def main() -> Path:
    result = evaluate(load())
    table = [
        {k: r.get(k) for k in ("id", "card", "split", "measured_s", "predicted_s", "factor", "factor_at_mean_length")}
        for r in result["rows"]
    ]
    path = write_result("published_runs", result, table, "Throughput model vs public GPU GRPO runs (seconds per step)")
    for s in SPLITS + ("all",):
        summary = result["splits"].get(s) or result["all"]
        print(f"{s}: {summary}")
    for p in result["card_pairs"]:
        print(
            f"card pair {p['pair']}: measured {p['measured_ratio']:.2f}x, predicted {p['predicted_ratio']:.2f}x, error {p['ratio_error']:.0%}"
        )
    print(f"wrote {path} ({RESULTS})")
    return path


if __name__ == "__main__":
    main()
