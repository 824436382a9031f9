"""The seven levers users tune by hand to make GRPO fit, and the kind of every setting, defined once.

Every other module (schema, backends, estimator, sweeps, report, README) refers to these names;
a backend's job is only to translate them into its own arguments.

Each lever and companion is a *knob* or a *recipe* setting (KINDS):
- a knob changes speed and memory, not what is learned (how a fixed number of completions per
  optimiser step is split into micro-batch x accumulation, gradient checkpointing, vLLM's share);
- a recipe setting changes what is learned (completions per step, generations per prompt, lengths,
  LoRA rank and targets, 4-bit, learning rate). Our sweeper holds the recipe: a sweep changes a recipe
  setting only when `hydra.sweeper.concessions` lists it, and then says what the change bought.
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

KNOB, RECIPE = "knob", "recipe"


@dataclass(frozen=True)
class Kind:
    kind: str  # KNOB | RECIPE
    why: str  # one phrase: why it is (or is not) part of what is learned


# The kind of every lever and companion (and of the backend settings a sweep may search). A setting
# not listed here (nor under a KNOB_PREFIXES section) counts as recipe: a sweep must name it in
# hydra.sweeper.concessions, since nothing says it leaves the training unchanged.
KINDS: dict[str, Kind] = {
    "completions_per_step": Kind(RECIPE, "completions per optimiser step: the effective batch the gradient averages"),
    "per_device_train_batch_size": Kind(
        KNOB, "the micro-batch of a fixed completions_per_step: the same gradient, accumulated in fewer or more pieces"
    ),
    "gradient_accumulation_steps": Kind(
        KNOB, "completions_per_step / (per_device_train_batch_size x trial.num_processes): the other half of the split"
    ),
    "gpu_memory_utilization": Kind(KNOB, "vLLM's share of the card: how generation is scheduled, not what is sampled"),
    "gradient_checkpointing": Kind(KNOB, "recomputes activations in the backward pass: same gradients, less memory, more time"),
    "expandable_segments": Kind(KNOB, "the CUDA allocator's strategy: same tensors, less fragmentation"),
    "backend.vllm_enable_sleep_mode": Kind(KNOB, "vLLM frees its pool while training runs: same samples, wake-up time"),
    "backend.unsloth_standby": Kind(KNOB, "vLLM and training share the weights: same samples, less memory"),
    "backend": Kind(KNOB, "the generation engine (HF generate or vLLM): same sampling settings, other speed"),
    "num_generations": Kind(RECIPE, "completions per prompt: the group each advantage is measured against"),
    "max_seq_length": Kind(RECIPE, "prompt + completion budget: how long an answer may be"),
    "max_prompt_length": Kind(RECIPE, "prompts longer than this are cut"),
    "lora_rank": Kind(RECIPE, "the adapter's capacity"),
    "lora_alpha": Kind(RECIPE, "the adapter's scale (effective learning rate of the adapter)"),
    "lora_target_modules": Kind(RECIPE, "which layers learn"),
    "load_in_4bit": Kind(RECIPE, "NF4 base weights: the model the adapter learns on is quantised"),
    "learning_rate": Kind(RECIPE, "the optimiser's step size"),
    "beta": Kind(RECIPE, "the KL penalty's weight"),
    "trial.full_finetune": Kind(RECIPE, "every weight learns instead of a LoRA adapter"),
    "model": Kind(RECIPE, "the model that learns"),
    "task": Kind(RECIPE, "the prompts and rewards it learns from"),
}
# Sections that never change what is learned: how a trial is measured, launched and logged, the card it
# runs on, and how the backend generates (vLLM colocated or a server, its parallelism, Unsloth's engine).
KNOB_SECTIONS: tuple[str, ...] = ("trial", "logger", "gpu", "backend")


def kind_of(setting: str) -> str:
    """KNOB or RECIPE for a dotted setting (a lever, a companion, a section or one of its keys)."""
    if setting in KINDS:
        return KINDS[setting].kind
    return KNOB if setting.split(".")[0] in KNOB_SECTIONS else RECIPE


# The recipe settings a config states (top-level or dotted keys; groups such as `lora` set them).
RECIPE_SETTINGS: tuple[str, ...] = tuple(k for k, v in KINDS.items() if v.kind == RECIPE and k not in ("model", "task"))


def requested_levers(cfg) -> dict:
    """The levers as the user asked for them (plain Python values), for metrics.json and loggers."""
    out = {}
    for name in LEVER_NAMES + EXTRA_LEVER_NAMES:
        value = cfg[name] if isinstance(cfg, dict) else getattr(cfg, name)
        out[name] = list(value) if name == "lora_target_modules" else value
    return out


def recipe_of(cfg) -> dict:
    """The recipe a config trains (plain values): every recipe setting, completions_per_step as
    per_device_train_batch_size x gradient_accumulation_steps x trial.num_processes when it is null, the model and task by name.
    lora_alpha stays null when it is (2 x lora_rank: it follows a rank concession, not a change of its own)."""

    def get(key):
        node = cfg
        for part in key.split("."):
            node = node.get(part) if hasattr(node, "get") else None
            if node is None:
                return None
        return list(node) if key == "lora_target_modules" else node

    out = {key: get(key) for key in RECIPE_SETTINGS}
    if out["completions_per_step"] is None:
        # every rank's micro-batches: the completions of one optimiser step across the processes
        out["completions_per_step"] = (
            get("per_device_train_batch_size") * (get("gradient_accumulation_steps") or 1) * (get("trial.num_processes") or 1)
        )
    out["model"] = get("model.name")
    out["task"] = get("task.name")
    return {k: (bool(v) if k in ("load_in_4bit", "trial.full_finetune") and v is not None else v) for k, v in out.items()}
