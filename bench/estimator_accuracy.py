"""Estimator accuracy: predicted peak vs measured peak of live tensor bytes on real CPU GRPO steps.

    PYTHONPATH=src python bench/estimator_accuracy.py [--source auto|trial|self] [--only NAME ...]

For each configuration (>= 20, four model sizes from 0.2M to ~75M parameters, random weights):
- trial: run a real trial (grpo_sweep.trial.parent.run_trial, trial.steps=2) and read metrics.json's
  `peak_memory_bytes` when `memory_source == "cpu-tracker"` (grpo_sweep's tensor tracker);
- self (fallback while that tracker is not installed): the same trainer built as the worker builds it
  and trained under bench/live_tensor_tracker.py, which follows every storage an op returns (only
  storages created inside the tracker count, so configurations measured one after another in this
  process do not see each other's tensors).
`auto` uses trial when grpo_sweep.trial.measure.tracker exists, else self. Writes
bench/results/estimator_accuracy.json and .md. Targets: median |error| <= 10 %, worst <= 25 %.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BASE = ["trial.steps=2", "task.num_prompts=32", "gpu=cpu"]

SMALL = [
    "model.arch.hidden_size=256",
    "model.arch.num_hidden_layers=4",
    "model.arch.num_attention_heads=4",
    "model.arch.num_key_value_heads=2",
    "model.arch.head_dim=64",
    "model.arch.intermediate_size=1024",
    "model.arch.vocab_size=8192",
]
MEDIUM = [
    "model.arch.hidden_size=512",
    "model.arch.num_hidden_layers=6",
    "model.arch.num_attention_heads=8",
    "model.arch.num_key_value_heads=2",
    "model.arch.head_dim=64",
    "model.arch.intermediate_size=1536",
    "model.arch.vocab_size=32000",
]
LARGE = [
    "model.arch.hidden_size=768",
    "model.arch.num_hidden_layers=8",
    "model.arch.num_attention_heads=12",
    "model.arch.num_key_value_heads=4",
    "model.arch.head_dim=64",
    "model.arch.intermediate_size=2048",
    "model.arch.vocab_size=32000",
]
GEMMA_SMALL = [
    "model.arch.model_type=gemma3_text",
    "model.arch.hidden_size=256",
    "model.arch.num_hidden_layers=6",
    "model.arch.num_attention_heads=4",
    "model.arch.num_key_value_heads=1",
    "model.arch.head_dim=64",
    "model.arch.intermediate_size=1024",
    "model.arch.vocab_size=16384",
]
SEQ = ["max_seq_length=96", "max_prompt_length=32"]

CONFIGS: dict[str, list[str]] = {
    "tiny_default": [],
    "tiny_b8": ["per_device_train_batch_size=8", "num_generations=4"],
    "tiny_seq192": ["max_seq_length=192", "max_prompt_length=64"],
    "tiny_all_linear": ["lora=all_linear"],
    "tiny_ckpt": ["gradient_checkpointing=true"],
    "small_default": SMALL + SEQ,
    "small_b8": SMALL + SEQ + ["per_device_train_batch_size=8"],
    "small_r64": SMALL + SEQ + ["lora_rank=64"],
    "small_all_linear": SMALL + SEQ + ["lora=all_linear"],
    "small_ckpt": SMALL + SEQ + ["gradient_checkpointing=true"],
    "small_seq256": SMALL + ["max_seq_length=256", "max_prompt_length=64"],
    "small_ga2": SMALL + SEQ + ["per_device_train_batch_size=2", "gradient_accumulation_steps=2", "num_generations=2"],
    "medium_default": MEDIUM + SEQ,
    "medium_b2": MEDIUM + SEQ + ["per_device_train_batch_size=2", "num_generations=2"],
    "medium_seq160": MEDIUM + ["max_seq_length=160", "max_prompt_length=32"],
    "medium_all_linear": MEDIUM + SEQ + ["lora=all_linear"],
    "medium_ckpt": MEDIUM + SEQ + ["gradient_checkpointing=true"],
    "large_default": LARGE + SEQ,
    "large_b2": LARGE + SEQ + ["per_device_train_batch_size=2", "num_generations=2"],
    "large_ckpt": LARGE + SEQ + ["gradient_checkpointing=true"],
    "large_r64_qv": LARGE + SEQ + ["lora_rank=64"],
    "gemma_small_default": GEMMA_SMALL + SEQ,
    "gemma_small_seq128": GEMMA_SMALL + ["max_seq_length=128", "max_prompt_length=32"],
    "gemma_small_ckpt": GEMMA_SMALL + SEQ + ["gradient_checkpointing=true"],
}
# vLLM colocate on vLLM's CPU build: the pool (gpu_memory_utilization x a simulated card: fp32 weights +
# the KV cache that share leaves) beside training; measured = the tracker's training peak + the pool
# read back from the engine. Always measured by a real trial (the in-process fallback runs plain TRL).
VLLM_CARD = ["backend=trl_vllm", "gpu=cpu_sim", "gpu.memory_gib=0.5"]
CONFIGS.update(
    {
        "vllm_tiny_u01": VLLM_CARD + ["gpu_memory_utilization=0.1"],
        "vllm_tiny_u03_b8": VLLM_CARD + ["gpu_memory_utilization=0.3", "per_device_train_batch_size=8", "num_generations=4"],
        "vllm_tiny_u05_seq192": VLLM_CARD + ["gpu_memory_utilization=0.5", "max_seq_length=192", "max_prompt_length=64"],
        "vllm_small_u02": VLLM_CARD + SMALL + SEQ + ["gpu_memory_utilization=0.2"],
    }
)


def compose(overrides: list[str]):
    from grpo_sweep.config.compose import compose_train_config

    base = [o for o in BASE if not (o.startswith("gpu=") and any(x.startswith("gpu=") for x in overrides))]
    return compose_train_config(base + overrides + ["model.init=random"])  # memory does not depend on the weights


def measure_one(overrides: list[str]) -> dict:
    """In this process: build the trainer exactly as the worker does and train under the tracker."""
    from types import SimpleNamespace

    sys.path.insert(0, str(Path(__file__).parent))
    from live_tensor_tracker import LiveBytes

    from grpo_sweep.trial.backends import get_backend
    from grpo_sweep.trial.models import load_tokenizer
    from grpo_sweep.trial.tasks import get_task

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    cfg = compose(overrides)
    task = get_task(cfg)
    tokenizer = load_tokenizer(cfg, task.corpus())
    dataset = task.dataset(tokenizer)
    with tempfile.TemporaryDirectory() as tmp, LiveBytes() as tracker:
        ctx = SimpleNamespace(
            tokenizer=tokenizer, dataset=dataset, reward_funcs=task.reward_funcs, callbacks=[], run_dir=Path(tmp), on_cuda=False
        )
        trainer = get_backend("trl").build_trainer(cfg, ctx)
        before = tracker.live
        tracker.reset_peak()
        started = time.perf_counter()
        trainer.train()
        return {
            "peak_bytes": tracker.peak,
            "live_before_train": before,
            "seconds": time.perf_counter() - started,
            "source": "bench-live-tensor-tracker",
        }


def measure_trial(overrides: list[str], run_dir: Path) -> dict | None:
    """A real trial; its peak when grpo_sweep's CPU tensor tracker measured it, else None."""
    from grpo_sweep.trial.parent import run_trial

    record = run_trial(compose(overrides), run_dir)
    if record.get("status") != "ok" or record.get("memory_source") != "cpu-tracker":
        return None
    return {
        "peak_bytes": record["peak_memory_bytes"],
        "source": "cpu-tracker",
        "trial_predicted_peak_bytes": record.get("predicted_peak_bytes"),
        "breakdown": record.get("peak_memory_breakdown"),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", choices=("auto", "trial", "self"), default="auto")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--measure-one")
    parser.add_argument("--fresh", action="store_true", help="measure again instead of using the cache")
    args = parser.parse_args()
    if args.measure_one:
        print(json.dumps(measure_one(json.loads(args.measure_one))))
        return 0
    from grpo_sweep.memory.estimator import GiB, estimate

    source = args.source
    if source == "auto":
        source = "trial" if importlib.util.find_spec("grpo_sweep.trial.measure.tracker") else "self"
    import torch

    torch.set_num_threads(1)  # 2 shared cores: oversubscribed threads only slow everyone down
    rows = []
    run_root = Path(tempfile.mkdtemp(prefix="estimator-accuracy-"))
    # Self-measurements are cached by overrides (they do not depend on the estimator), so a rerun after
    # an estimator change takes seconds; --fresh measures again.
    cache_path = RESULTS / "estimator_accuracy_measured.json"
    cache = {} if args.fresh or not cache_path.exists() else json.loads(cache_path.read_text())
    # Every model size's default first, so a partial run already spans the sizes.
    for name in sorted(CONFIGS, key=lambda n: not n.endswith("_default")):
        overrides = CONFIGS[name]
        if args.only and name not in args.only:
            continue
        cfg = compose(overrides)
        est = estimate(cfg)
        vllm = "backend=trl_vllm" in overrides
        measured = measure_trial(overrides, run_root / name) if (source == "trial" or vllm) else None
        if measured is None and vllm:
            raise RuntimeError(f"{name}: the trl_vllm trial did not measure a peak (see {run_root / name}/trial.log)")
        if measured is None:
            key = json.dumps(BASE + overrides)
            if key not in cache:
                cache[key] = measure_one(overrides)  # in this process: imports once (2 shared cores)
                gc.collect()
                RESULTS.mkdir(parents=True, exist_ok=True)
                cache_path.write_text(json.dumps(cache, indent=1) + "\n")
            measured = cache[key]
        err = (est.total_bytes - measured["peak_bytes"]) / measured["peak_bytes"]
        row = {
            "config": name,
            "overrides": overrides,
            "params": est.assumptions["params"],
            "predicted_bytes": est.total_bytes,
            "measured_bytes": measured["peak_bytes"],
            "error": err,
            "source": measured["source"],
            "components": est.components,
        }
        rows.append(row)
        print(
            f"{name:<22} params {row['params'] / 1e6:7.2f}M  predicted {est.total_bytes / 2**20:9.1f} MiB  "
            f"measured {measured['peak_bytes'] / 2**20:9.1f} MiB  error {100 * err:+6.1f} %  "
            f"({measured['source']})",
            flush=True,
        )
    errors = [abs(r["error"]) for r in rows]
    summary = {
        "configs": len(rows),
        "median_abs_error": statistics.median(errors),
        "worst_abs_error": max(errors),
        "targets": {"median": 0.10, "worst": 0.25},
        "passed": statistics.median(errors) <= 0.10 and max(errors) <= 0.25,
        "model_sizes": sorted({r["params"] for r in rows}),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "estimator_accuracy" if not args.only else "estimator_accuracy_partial"
    (RESULTS / f"{name}.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    lines = ["| config | params | predicted MiB | measured MiB | error | measured by |", "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['params'] / 1e6:.2f}M | {r['predicted_bytes'] / 2**20:.1f} | "
            f"{r['measured_bytes'] / 2**20:.1f} | {100 * r['error']:+.1f} % | {r['source']} |"
        )
    lines.append("")
    lines.append(
        f"{len(rows)} configurations: median |error| {100 * summary['median_abs_error']:.1f} %, "
        f"worst {100 * summary['worst_abs_error']:.1f} % (targets 10 % / 25 %): "
        f"{'PASS' if summary['passed'] else 'FAIL'}"
    )
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print(lines[-1])
    del GiB
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
