"""The seven levers users tune by hand to make GRPO fit, defined once.

Every other module (schema, backends, estimator, sweeps, report, README) refers to these names;
a backend's job is only to translate them into its own arguments.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lever:
    name: str
    memory: str  # what raising it costs in memory
    speed: str  # what raising it does to throughput


LEVERS: tuple[Lever, ...] = (
    Lever(
        "max_seq_length",
        "activations and logits grow linearly with prompt+completion tokens; vLLM needs KV room for it",
        "longer sequences: more tokens per step, but generation time grows with length",
    ),
    Lever(
        "gpu_memory_utilization",
        "vLLM reserves this fraction of the card up front (weights + KV cache)",
        "more KV cache lets vLLM batch more sequences; training gets what is left",
    ),
    Lever(
        "per_device_train_batch_size",
        "completions per micro-batch: activations and logits scale with it",
        "bigger micro-batches use the GPU better, until memory runs out",
    ),
    Lever(
        "gradient_accumulation_steps",
        "none at training time (same micro-batch); a larger generation batch",
        "more completions per optimiser step at the same peak; sequential, so no faster per token",
    ),
    Lever(
        "num_generations",
        "none at a fixed batch (it only groups completions per prompt)",
        "more samples per prompt: better advantage estimates; must divide the generation batch",
    ),
    Lever(
        "lora_rank",
        "LoRA weights, their gradients and AdamW state (fp32) grow linearly with rank",
        "small effect; larger rank means slightly slower matmuls",
    ),
    Lever(
        "load_in_4bit",
        "base weights about 1/4 of bf16 (NF4 plus quantisation constants)",
        "dequantisation costs compute: usually slower per token",
    ),
)

LEVER_NAMES: tuple[str, ...] = tuple(lever.name for lever in LEVERS)
# Not one of the seven but chosen with them: which projections get LoRA adapters.
EXTRA_LEVER_NAMES: tuple[str, ...] = ("lora_target_modules",)


def requested_levers(cfg) -> dict:
    """The levers as the user asked for them (plain Python values), for metrics.json and loggers."""
    out = {}
    for name in LEVER_NAMES + EXTRA_LEVER_NAMES:
        value = cfg[name] if isinstance(cfg, dict) else getattr(cfg, name)
        out[name] = list(value) if name == "lora_target_modules" else value
    return out
