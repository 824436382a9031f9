"""Cross-check the estimator's training side at full scale: Gemma 3 1B under FakeTensorMode.

    PYTHONPATH=src python bench/fake_trace.py [--batch 4] [--seq 1024] [--rank 16] [--checkpointing]

One forward + backward of a plain causal-LM loss (labels = inputs: full-vocabulary logits, upcast to
fp32, log-softmax and its gradient), LoRA on q/v, SDPA, bfloat16 - traced with fake tensors, so no
real memory is used (~10 s, a few hundred MB of RAM). How: build the model on the `meta` device
(building it under FakeTensorMode fails inside peft), add the LoRA adapter, then replace every
parameter and buffer with a fake CPU tensor of the same shape and dtype, mapping shared parameters
once so tied embeddings stay tied. bench/live_tensor_tracker.py follows every storage an op returns
and gives the peak. The estimator predicts weights + LoRA + activations + logits for the same shape
with logits_mode=full on a CUDA (bf16) target. Target: within 15 %.
Writes bench/results/fake_trace.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


def fake_model(cfg, rank: int, checkpointing: bool):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_sweep.trial.models import build_config

    config = build_config(cfg.model.arch, cfg.max_seq_length)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def to_fake(model) -> None:
    """Every meta parameter/buffer becomes a fake CPU tensor (call under FakeTensorMode)."""
    import torch

    done: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in done:
                done[id(param)] = torch.nn.Parameter(
                    torch.empty(param.shape, dtype=param.dtype, device="cpu"), requires_grad=param.requires_grad
                )
            module._parameters[name] = done[id(param)]
        for name, buf in list(module._buffers.items()):
            if buf is not None:
                module._buffers[name] = torch.zeros(buf.shape, dtype=buf.dtype, device="cpu")


def trace(batch: int, seq: int, rank: int, checkpointing: bool) -> dict:
    import torch
    from live_tensor_tracker import LiveBytes
    from torch._subclasses.fake_tensor import FakeTensorMode

    from grpo_sweep.config.compose import compose_train_config

    cfg = compose_train_config(["model=gemma3_1b", f"max_seq_length={seq}", "max_prompt_length=64"])
    model = fake_model(cfg, rank, checkpointing)
    started = time.perf_counter()
    with FakeTensorMode(allow_non_fake_inputs=True), LiveBytes() as tracker:
        to_fake(model)
        model.train()
        weights = tracker.live
        ids = torch.randint(0, cfg.model.arch.vocab_size, (batch, seq))
        loss = model(input_ids=ids, labels=ids).loss
        after_forward = tracker.live
        loss.backward()
    return {
        "peak_bytes": tracker.peak,
        "weights_bytes": weights,
        "after_forward_bytes": after_forward,
        "seconds": time.perf_counter() - started,
        "cfg": cfg,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--both", action="store_true", help="trace without and with checkpointing")
    args = parser.parse_args()
    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.memory.estimator import GiB, estimate

    rows = []
    for ckpt in [False, True] if args.both else [args.checkpointing]:
        traced = trace(args.batch, args.seq, args.rank, ckpt)
        cfg = compose_train_config(
            [
                "model=gemma3_1b",
                "gpu=l4_24g",
                f"max_seq_length={args.seq}",
                "max_prompt_length=64",
                f"per_device_train_batch_size={args.batch}",
                "gradient_accumulation_steps=1",
                "num_generations=2",
                f"lora_rank={args.rank}",
                "lora_target_modules=[q_proj,v_proj]",
                f"gradient_checkpointing={ckpt}",
            ]
        )
        est = estimate(cfg, "full")
        training_side = {k: est.components[k] for k in ("weights", "lora_params", "activations", "logits")}
        predicted = sum(training_side.values())
        err = (predicted - traced["peak_bytes"]) / traced["peak_bytes"]
        rows.append(
            {
                "gradient_checkpointing": ckpt,
                "batch": args.batch,
                "seq": args.seq,
                "rank": args.rank,
                "traced_peak_bytes": traced["peak_bytes"],
                "traced_weights_bytes": traced["weights_bytes"],
                "predicted_bytes": predicted,
                "predicted_components": training_side,
                "error": err,
                "trace_seconds": round(traced["seconds"], 1),
                "within_15pct": abs(err) <= 0.15,
            }
        )
        print(
            f"gemma3_1b b{args.batch} s{args.seq} r{args.rank} ckpt={ckpt}: traced {traced['peak_bytes'] / GiB:.2f}"
            f" GiB (weights {traced['weights_bytes'] / GiB:.2f}), predicted {predicted / GiB:.2f} GiB, "
            f"error {100 * err:+.1f} % ({traced['seconds']:.0f} s)",
            flush=True,
        )
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "fake_trace.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = ["| checkpointing | batch x seq | traced peak GiB | predicted GiB | error |", "|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['gradient_checkpointing']} | {r['batch']} x {r['seq']} | "
            f"{r['traced_peak_bytes'] / GiB:.2f} | {r['predicted_bytes'] / GiB:.2f} | {100 * r['error']:+.1f} % |"
        )
    (out / "fake_trace.md").write_text("\n".join(lines) + "\n")
    return 0 if all(r["within_15pct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
