"""The throughput model against public GRPO runs on GPUs: predicted vs measured seconds per step.

    PYTHONPATH=src python bench/published_runs.py

Reads bench/data/published_grpo_runs.json (each run with its source, card, settings and measured
step time; how they were collected and how fit/heldout was chosen is in that file). Each run the model
can express (`predictable`) becomes our config: the card's conf/gpu file, conf/model where we have the
model, else `model=hub` with the architecture numbers the data file records beside their source, the
Unsloth backend (every run is an Unsloth notebook) with its vLLM switch, the run's LoRA targets and
gradient checkpointing, and one prompt's `num_generations` completions per micro-batch (Unsloth
logs "Total batch size (6 x 1 x 1)" for per_device_train_batch_size=1, num_generations=6). A run whose TRL
generates once per micro-step (`generates_every_microstep`, read from the metric names its log prints; the
data file's trl_rule cites TRL's `_prepare_inputs`) runs at steps_per_generation=1, TRL's later name for
that loop: one generation round per accumulation step. Every predicted run has TRL's default beta (0.04, not
set in any notebook) and computes a reference forward per micro-batch; its `beta` makes the model count it.

Which prediction is judged: the expected case (`memory.throughput.relative_step_time(cfg)["expected"]`)
with task.expected_completion_tokens = the run's logged mean completion length. A public run's step
time is measured at its natural lengths (its completions stop early), not padded to the budget as our
trials are, so the fair forecast is the one a user gets who states the mean length of their data.
Within it each generation wave decodes until its longest completion ends and the trainer pads a
micro-batch to that longest: a run that logs the longest per step would set it, but none of the
predicted runs does below the budget (the data file says so), so the model's tail rule
(throughput.EXPECTED_TAIL x the mean, at most the budget) stands in. The worst case (every completion at
the budget, what trials measure) is reported beside it under `_worst_case` keys.

Reported per split: the factor off max(p/m, m/p), its median and worst, Spearman's rho of predicted
against measured, and each same-setup card pair's ratio error |predicted ratio / measured ratio - 1|.
published_card_ratio_error is the first heldout pair's (the Mistral-7B T4 / RTX 4090 pair of the issue).
Each row also says whether the fit split holds a run of its setup (`fit_has_setup`: the same card, vLLM
engine generation and weight format, `setup_of`): a card constant fitted on one engine's 4-bit path is
carried to another's only by assumption, and the held-out runs the fit never covers are listed apart
(`heldout_without_fit_setup`). Writes bench/results/published_runs.json and .md.
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


def setup_of(run: dict) -> tuple[str, str, str]:
    """(card, generation engine, weight format) of RUN: the engine is vLLM's generation as the run's own log
    names it ("V0"/"V1" from its 'Initializing a V0 LLM engine' line) or "hf" where it generated without
    vLLM."""
    engine = run.get("vllm_engine")
    return run["card"], engine.split()[0] if engine else "hf", run["quant"]


def fit_setups(runs: list[dict]) -> set[tuple[str, str, str]]:
    """The setups (setup_of) of the fit split's predicted runs: what a card constant can be fitted on."""
    return {setup_of(r) for r in runs if r["split"] == "fit" and r.get("predictable", True)}


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
        lora_targets(run["lora_target_modules"]),
        # use_gradient_checkpointing="unsloth" in every notebook that sets it; unset is taken as on
        f"gradient_checkpointing={'false' if run.get('gradient_checkpointing') is False else 'true'}",
        f"num_generations={run['num_generations']}",
        f"per_device_train_batch_size={max(run['per_device_train_batch_size'], run['num_generations'])}",
        f"gradient_accumulation_steps={run['gradient_accumulation_steps']}",
        f"max_prompt_length={run['max_prompt_length']}",
        f"max_seq_length={run['max_prompt_length'] + completion}",
    ]
    if run.get("generates_every_microstep"):
        out.append("steps_per_generation=1")
    if run.get("beta") is not None:
        out.append(f"beta={run['beta']}")
    if run.get("gpu_memory_utilization") is not None:
        out.append(f"gpu_memory_utilization={run['gpu_memory_utilization']}")
    return out


def lora_targets(targets) -> str:
    if targets == "all_linear":
        return "lora=all_linear"
    return f"lora_target_modules=[{','.join(targets)}]"


def predict(run: dict) -> dict:
    """The model at RUN: its worst case (the top-level keys) and its expected case at the run's logged mean
    completion length (`expected`; the budget where the run logged none)."""
    over = overrides(run)
    if run.get("completion_length_mean"):
        over.append(f"task.expected_completion_tokens={round(run['completion_length_mean'])}")
    return relative_step_time(compose_train_config(over))


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
    """Each same-setup pair's measured and predicted step-time ratio, at the expected and the worst case."""
    out = []
    for a, b in data.get("card_pairs", []):
        if a not in by_id or b not in by_id:
            continue
        ra, rb = by_id[a], by_id[b]
        measured = ra["measured_s"] / rb["measured_s"]
        predicted = ra["predicted_s"] / rb["predicted_s"]
        worst = ra["predicted_worst_case_s"] / rb["predicted_worst_case_s"]
        out.append(
            {
                "pair": f"{a} / {b}",
                "cards": f"{ra['card']} / {rb['card']}",
                "splits": f"{ra['split']} / {rb['split']}",
                "measured_ratio": measured,
                "predicted_ratio": predicted,
                "ratio_error": abs(predicted / measured - 1),
                "predicted_ratio_worst_case": worst,
                "ratio_error_worst_case": abs(worst / measured - 1),
            }
        )
    return out


def row_of(run: dict, fitted: set[tuple[str, str, str]]) -> dict:
    """One predicted run: measured, the expected case (`predicted_s`, its phases) and the worst case;
    `fit_has_setup` says whether FITTED (fit_setups) holds its setup."""
    p = predict(run)
    e = p["expected"]
    return {
        "id": run["id"],
        "card": run["card"],
        "split": run["split"],
        "vllm_engine": run.get("vllm_engine"),
        "setup": "/".join(setup_of(run)),
        "fit_has_setup": setup_of(run) in fitted,
        "measured_s": run["seconds_per_step"],
        "predicted_s": e["step_s"],
        "generation_s": e["generation_s"],
        "training_s": e["training_s"],
        "completion_tokens_mean": e["completion_tokens"],
        "factor": factor(e["step_s"], run["seconds_per_step"]),
        "predicted_worst_case_s": p["step_s"],
        "factor_worst_case": factor(p["step_s"], run["seconds_per_step"]),
    }


def evaluate(data: dict) -> dict:
    rows, skipped = [], []
    fitted = fit_setups(data["runs"])
    for run in data["runs"]:
        if not run.get("predictable", True):
            skipped.append({"id": run["id"], "why": run["notes"].split(":")[0]})
            continue
        rows.append(row_of(run, fitted))
    worst_rows = [{**r, "predicted_s": r["predicted_worst_case_s"], "factor": r["factor_worst_case"]} for r in rows]
    pairs = card_pairs(data, {r["id"]: r for r in rows})
    heldout_pairs = [p for p in pairs if p["splits"] == "heldout / heldout"]
    heldout = split_summary([r for r in rows if r["split"] == "heldout"])
    heldout_worst = split_summary([r for r in worst_rows if r["split"] == "heldout"])
    return {
        "model": "memory.throughput.relative_step_time: the expected case at each run's logged mean completion length "
        "(task.expected_completion_tokens); beside it the worst case (every completion at the budget)",
        "data": str(DATA.relative_to(DATA.parents[2])),
        "splits": {s: split_summary([r for r in rows if r["split"] == s]) for s in SPLITS},
        "all": split_summary(rows),
        "splits_worst_case": {s: split_summary([r for r in worst_rows if r["split"] == s]) for s in SPLITS},
        "card_pairs": pairs,
        "published_heldout_median_factor": heldout["median_factor"],
        "published_heldout_worst_factor": heldout["worst_factor"],
        "published_card_ratio_error": heldout_pairs[0]["ratio_error"] if heldout_pairs else None,
        "published_heldout_median_factor_worst_case": heldout_worst["median_factor"],
        "published_heldout_worst_factor_worst_case": heldout_worst["worst_factor"],
        "published_card_ratio_error_worst_case": heldout_pairs[0]["ratio_error_worst_case"] if heldout_pairs else None,
        "heldout_without_fit_setup": [
            {"id": r["id"], "setup": r["setup"], "factor": r["factor"]}
            for r in rows
            if r["split"] == "heldout" and not r["fit_has_setup"]
        ],
        "rows": rows,
        "not_predicted": skipped,
    }


def main() -> Path:
    result = evaluate(load())
    keys = (
        "id",
        "card",
        "split",
        "vllm_engine",
        "setup",
        "fit_has_setup",
        "measured_s",
        "predicted_s",
        "factor",
        "predicted_worst_case_s",
        "factor_worst_case",
    )
    table = [{k: r.get(k) for k in keys} for r in result["rows"]]
    path = write_result("published_runs", result, table, "Throughput model vs public GPU GRPO runs (seconds per step)")
    for s in SPLITS + ("all",):
        summary = result["splits"].get(s) or result["all"]
        print(f"{s} (expected case): {summary}")
    for s in SPLITS:
        print(f"{s} (worst case): {result['splits_worst_case'][s]}")
    for r in result["heldout_without_fit_setup"]:
        print(f"heldout {r['id']} ({r['setup']}): no fit run of its setup; {r['factor']:.2f}x off")
    for p in result["card_pairs"]:
        print(
            f"card pair {p['pair']}: measured {p['measured_ratio']:.2f}x, predicted {p['predicted_ratio']:.2f}x "
            f"(worst case {p['predicted_ratio_worst_case']:.2f}x), error {p['ratio_error']:.0%}"
        )
    print(f"wrote {path} ({RESULTS})")
    return path


if __name__ == "__main__":
    main()
