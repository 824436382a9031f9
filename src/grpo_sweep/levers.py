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


# The kind of every lever and companion (and of the backend settings a sweep may search). A dotted
# setting takes the kind of its nearest listed parent (`trial.grpo_config.temperature`: recipe); one
# neither listed nor under a KNOB_SECTIONS section counts as recipe: a sweep must name it in
# hydra.sweeper.concessions, since nothing says it leaves the training unchanged.
KINDS: dict[str, Kind] = {
    "completions_per_step": Kind(RECIPE, "completions per optimiser step: the effective batch the gradient averages"),
    "per_device_train_batch_size": Kind(
        KNOB,
        "the micro-batch of a fixed completions_per_step: the same gradient, accumulated in fewer or more pieces "
        "(a knob for globally normalised loss types; recipe under loss_type=bnpo: CONDITIONS)",
    ),
    "gradient_accumulation_steps": Kind(
        KNOB, "completions_per_step / (per_device_train_batch_size x trial.num_processes): the other half of the split"
    ),
    "steps_per_generation": Kind(
        KNOB,
        "micro-batches generated at once (TRL's generation batch): at or below the accumulation the same policy "
        "samples them (recipe above it: CONDITIONS)",
    ),
    "optim": Kind(
        KNOB, "the optimiser's implementation (adamw_torch, adamw_torch_fused: same AdamW update; 8-bit ones are recipe)"
    ),
    "attn_implementation": Kind(KNOB, "the attention kernel (eager, sdpa): the same softmax attention, other memory and speed"),
    "torch_compile": Kind(KNOB, "compiles the model's forward and backward: same maths, other kernels"),
    "loss_type": Kind(RECIPE, "how token losses are aggregated into the loss (TRL GRPOConfig.loss_type, default dapo)"),
    "vllm_importance_sampling_correction": Kind(
        RECIPE,
        "reweights each token's loss by the trainer/vLLM probability ratio when vLLM generates "
        "(TRL 1.16 trl/trainer/grpo_config.py, default True; trl/trainer/grpo_trainer.py _compute_loss)",
    ),
    "gpu_memory_utilization": Kind(KNOB, "vLLM's share of the card: how generation is scheduled, not what is sampled"),
    "gradient_checkpointing": Kind(KNOB, "recomputes activations in the backward pass: same gradients, less memory, more time"),
    "gradient_checkpointing_every_n_layers": Kind(
        KNOB,
        "checkpoints every n-th decoder layer only, the others keep their activations: the same gradients "
        "(transformers 5.17 modeling_utils.py gradient_checkpointing_enable(every_n_layers))",
    ),
    "gradient_checkpointing_offload": Kind(
        KNOB,
        "keeps the checkpointed layer inputs in host memory: the same tensors copied off the card and back "
        "(transformers 5.17 modeling_utils.py gradient_checkpointing_enable(offload); Unsloth "
        'get_peft_model(use_gradient_checkpointing="unsloth"))',
    ),
    "torch_empty_cache_steps": Kind(
        KNOB,
        "returns the allocator's cached blocks to the device every n steps: the same tensors "
        "(transformers 5.17 training_args.py torch_empty_cache_steps, trainer.py training_step)",
    ),
    "pad_to_multiple_of": Kind(
        KNOB,
        "pads prompt and completion ids to a multiple: the padding is masked out of attention and the loss "
        "(TRL 1.16 trl/trainer/grpo_config.py pad_to_multiple_of, grpo_trainer.py _generate_and_score_completions)",
    ),
    "use_transformers_continuous_batching": Kind(
        KNOB,
        "HF generation through transformers' paged continuous-batching engine: the same model and sampling "
        "settings, another scheduler (TRL 1.16 trl/trainer/grpo_trainer.py _generate_single_turn, generate_batch)",
    ),
    "cast_lm_head_to_fp32": Kind(
        RECIPE,
        "the LM head and its logits in float32 (the ScaleRL recipe): other log-probabilities, another loss "
        "(TRL 1.16 trl/trainer/grpo_config.py cast_lm_head_to_fp32, grpo_trainer.py _cast_lm_head_to_fp32)",
    ),
    "expandable_segments": Kind(KNOB, "the CUDA allocator's strategy: same tensors, less fragmentation"),
    "backend.vllm_enable_sleep_mode": Kind(KNOB, "vLLM frees its pool while training runs: same samples, wake-up time"),
    "backend.unsloth_standby": Kind(KNOB, "vLLM and training share the weights: same samples, less memory"),
    # vLLM engine settings (config/backends.py VLLM_ENGINE_SETTINGS; vLLM 0.31 vllm/engine/arg_utils.py EngineArgs)
    "backend.vllm_max_num_seqs": Kind(
        RECIPE,
        "sequences vLLM's scheduler runs at once (vllm/config/scheduler.py): another batch draws other samples, "
        "since TRL seeds the engine once, not each request (TRL 1.16 trl/generation/vllm_generation.py "
        "LLM(seed=...), SamplingParams without a seed), and vLLM's outputs depend on the batch unless "
        "VLLM_BATCH_INVARIANT=1 (docs.vllm.ai features/batch_invariance)",
    ),
    "backend.vllm_max_num_batched_tokens": Kind(
        KNOB, "tokens per engine step (vllm/config/scheduler.py; chunked prefill): how prefill is split, same samples"
    ),
    "backend.vllm_enable_prefix_caching": Kind(
        KNOB, "reuses the KV blocks of a prompt already computed (vllm/config/cache.py): the group's shared prompt once"
    ),
    "backend.vllm_enforce_eager": Kind(
        KNOB, "eager kernels instead of CUDA graphs (vllm/config/model.py enforce_eager): the same forward, no graph memory"
    ),
    "backend.vllm_kv_cache_memory_bytes": Kind(
        KNOB, "the KV cache in bytes instead of what gpu_memory_utilization leaves (vllm/config/cache.py): other waves"
    ),
    "backend.vllm_kv_cache_dtype": Kind(
        RECIPE,
        "fp8 stores the keys and values attention reads quantised (vllm/config/cache.py cache_dtype): the "
        "sampled distribution changes",
    ),
    "backend.vllm_model_impl": Kind(
        KNOB,
        "the model code vLLM runs (its own, or transformers' modeling code inside vLLM): the same weights and "
        "maths, other kernels (vLLM 0.31 vllm/config/model.py model_impl; TRL 1.16 trl/trainer/grpo_config.py "
        "vllm_model_impl)",
    ),
    "backend.vllm_mode": Kind(
        KNOB,
        "vLLM inside the training processes (colocate) or in its own on other devices (server): the same engine "
        "and sampling settings (TRL 1.16 trl/trainer/grpo_config.py vllm_mode)",
    ),
    "backend.vllm_tensor_parallel_size": Kind(
        KNOB,
        "vLLM shards each layer's weights over N devices: the same model and samples (vLLM 0.31 "
        "vllm/config/parallel.py tensor_parallel_size; TRL 1.16 trl/scripts/vllm_serve.py tensor_parallel_size)",
    ),
    "backend.unsloth_grpo_mini_batch": Kind(
        KNOB,
        "rows per chunk when Unsloth computes the hidden states of the loss: the same per-token losses, summed "
        "the same way, a lower peak (unsloth/models/rl.py UnslothGRPOConfig; unsloth_zoo/rl_replacements.py "
        "grpo_accumulated_loss)",
    ),
    "backend.unsloth_logit_chunk_multiplier": Kind(
        KNOB,
        "chunks of the vocabulary the loss's log-softmax runs in: the same log-probabilities, a lower peak "
        "(unsloth/models/rl.py UnslothGRPOConfig; unsloth_zoo/rl_replacements.py grpo_accumulated_loss)",
    ),
    "trial.num_processes": Kind(
        KNOB,
        "ranks one optimiser step is split across: completions_per_step is held and each rank's accumulation "
        "derived (config.split.split_of), the same gradient all-reduced",
    ),
    "trial.strategy": Kind(
        KNOB,
        "how the ranks hold the model (DDP replicas, FSDP or DeepSpeed ZeRO shards): the same update "
        "(transformers 5.17 training_args.py fsdp, deepspeed)",
    ),
    "trial.offload": Kind(
        KNOB,
        "optimiser state (zero2) and parameters too (zero3, fsdp) kept in host memory: the same AdamW update, run "
        "on the host (DeepSpeed zero offload_optimizer/offload_param, DeepSpeedCPUAdam; torch FSDP2 "
        "CPUOffloadPolicy)",
    ),
    "ds3_gather_for_generation": Kind(
        KNOB,
        "under ZeRO-3, gather the whole model for HF generation (true) or generate from the shards (false): the "
        "same model samples, slower without the gather (TRL 1.16 trl/trainer/grpo_config.py "
        "ds3_gather_for_generation)",
    ),
    "backend": Kind(
        KNOB,
        "the generation engine (HF generate or vLLM): same sampling settings, other speed "
        "(recipe between trl and a vLLM backend while TRL's importance-sampling correction is on: CONDITIONS)",
    ),
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
    "seed": Kind(RECIPE, "the seed of the adapter's initialisation and of sampling: other completions, other steps"),
    "trial.grpo_config": Kind(
        RECIPE, "any other GRPOConfig argument (temperature, num_iterations, ...): TRL's own recipe settings"
    ),
    "trial.grpo_config.transformers_continuous_batching_config": Kind(
        KNOB,
        "the paged engine's blocks and batch tokens under use_transformers_continuous_batching: how generation is "
        "scheduled (TRL 1.16 trl/trainer/grpo_config.py transformers_continuous_batching_config)",
    ),
}
# Sections that never change what is learned: how a trial is measured, launched and logged, the card it
# runs on, and how the backend generates (vLLM colocated or a server, its parallelism, Unsloth's engine).
KNOB_SECTIONS: tuple[str, ...] = ("trial", "logger", "gpu", "backend")


@dataclass(frozen=True)
class Condition:
    """A setting whose kind depends on the recipe: `kind` holds when `applies(recipe)` is true, else its KINDS kind."""

    kind: str  # the kind while the condition holds
    when: str  # the condition, in words (README and docs/levers.md)
    why: str  # why the kind changes there
    source: str  # upstream, where the behaviour is defined
    applies: object  # (recipe: dict) -> bool


# TRL 1.16 trl/trainer/grpo_trainer.py `_compute_loss`: "bnpo" divides by the active tokens of the
# local micro-batch; dapo/cispo/luspo by the tokens of the whole accumulated batch, dr_grpo by a
# constant, grpo/sapo per sequence and then the mean over the accumulated batch's sequences.
PER_MICRO_BATCH_LOSSES: tuple[str, ...] = ("bnpo",)
# luspo (needs importance_sampling_level=sequence) and vespo (refused with vLLM's correction) are left out:
# neither runs at the other settings a trial uses.
GLOBAL_LOSSES: tuple[str, ...] = ("dapo", "grpo", "dr_grpo", "cispo", "sapo")
LOSS_TYPES: tuple[str, ...] = (*GLOBAL_LOSSES, *PER_MICRO_BATCH_LOSSES)
# transformers 5.17 training_args.OptimizerNames: the AdamW implementations that run the same update
# (knobs). The 8-bit and paged optimisers keep quantised state: another update, recipe (RECIPE_OPTIMS).
KNOB_OPTIMS: tuple[str, ...] = ("adamw_torch", "adamw_torch_fused")
RECIPE_OPTIMS: tuple[str, ...] = ("adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit")
OPTIMS: tuple[str, ...] = (*KNOB_OPTIMS, *RECIPE_OPTIMS)


def optimiser_steps_per_generation(steps_per_generation: int | None, accumulation: int) -> int:
    """Optimiser steps one generation batch feeds (TRL 1.16 GRPOTrainer: a buffer of steps_per_generation
    micro-batches, one generation per buffer): 1 at or below the accumulation; above it, rollouts reused."""
    spg = steps_per_generation or accumulation
    return max(1, -(-spg // max(1, accumulation)))


_SPLIT_UNDER_BNPO = Condition(
    RECIPE,
    "loss_type=bnpo",
    "bnpo normalises each micro-batch by its own token count: the split changes the gradient",
    "TRL 1.16 trl/trainer/grpo_config.py (loss_type docstring: 'results may slightly vary depending on the "
    "local batch size'), trl/trainer/grpo_trainer.py _compute_loss",
    lambda recipe: recipe.get("loss_type") in PER_MICRO_BATCH_LOSSES,
)
# The settings whose kind has a condition, each rule once: the sweeper's recipe hold (concessions.py
# and recipe_of below) and the docs read it.
CONDITIONS: dict[str, Condition] = {
    "per_device_train_batch_size": _SPLIT_UNDER_BNPO,
    "gradient_accumulation_steps": _SPLIT_UNDER_BNPO,
    "steps_per_generation": Condition(
        RECIPE,
        "steps_per_generation > gradient_accumulation_steps",
        "one generation batch then feeds several optimiser steps: rollouts from an older policy are reused",
        "TRL 1.16 trl/trainer/grpo_config.py steps_per_generation, trl/trainer/grpo_trainer.py _prepare_inputs "
        "(a new generation every steps_per_generation x num_iterations micro-steps)",
        lambda recipe: (recipe.get("optimiser_steps_per_generation") or 1) > 1,
    ),
    "optim": Condition(
        RECIPE,
        "an 8-bit or paged optimiser (RECIPE_OPTIMS)",
        "quantised optimiser state: another update than AdamW's",
        "transformers 5.17 transformers/training_args.py OptimizerNames; bitsandbytes 8-bit optimisers",
        lambda recipe: recipe.get("optim") in RECIPE_OPTIMS,
    ),
    "backend": Condition(
        RECIPE,
        "while vllm_importance_sampling_correction is on (TRL's default; a vLLM backend applies it, trl cannot)",
        "the correction reweights each token's loss by the trainer/vLLM probability ratio: a vLLM backend trains "
        "another loss than HF generate",
        "TRL 1.16 trl/trainer/grpo_config.py vllm_importance_sampling_correction (default True), "
        "trl/trainer/grpo_trainer.py _compute_loss (importance_sampling_ratio)",
        lambda recipe: bool(recipe.get("vllm_importance_sampling_correction")),
    ),
}


def kind_in(setting: str, recipe: dict | None) -> str:
    """The kind of `setting` under a recipe (recipe_of's dict): its CONDITIONS kind where one applies."""
    cond = CONDITIONS.get(setting)
    if cond is not None and recipe is not None and cond.applies(recipe):
        return cond.kind
    return kind_of(setting)


def why_in(setting: str, recipe: dict | None) -> str:
    """Why `setting` has the kind kind_in gives it."""
    cond = CONDITIONS.get(setting)
    if cond is not None and recipe is not None and cond.applies(recipe):
        return f"{cond.why} ({cond.when}; {cond.source})"
    return KINDS[setting].why if setting in KINDS else ""


def listed_as(setting: str) -> str:
    """The KINDS entry a dotted setting falls under: itself, else its nearest listed parent, else itself
    (an override's `+`/`~` left off)."""
    setting = setting.lstrip("+~")
    parts = setting.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in KINDS), setting)


def kind_of(setting: str) -> str:
    """KNOB or RECIPE for a dotted setting (a lever, a companion, a section or one of its keys)."""
    listed = listed_as(setting)
    if listed in KINDS:
        return KINDS[listed].kind
    return KNOB if listed.split(".")[0] in KNOB_SECTIONS else RECIPE


# The recipe settings a config states (top-level or dotted keys; groups such as `lora` set them).
# The seed is not one of them: the learning check groups trials by it, and a study's identity never held it.
RECIPE_SETTINGS: tuple[str, ...] = tuple(k for k, v in KINDS.items() if v.kind == RECIPE and k not in ("model", "task", "seed"))
# Recipe settings recorded as plain booleans (a YAML 0/1 or a flag's truthy value compares equal across studies).
_BOOLEAN_RECIPE: tuple[str, ...] = (
    "load_in_4bit",
    "trial.full_finetune",
    "vllm_importance_sampling_correction",
    "cast_lm_head_to_fp32",
)
# Recipe settings recorded only when turned on: off is the upstream default every existing study trained, so a
# study recorded before the setting existed keeps its identity (study identity compares the recipe key by key).
_RECORDED_WHEN_ON: tuple[str, ...] = ("cast_lm_head_to_fp32", "trial.grpo_config")


def _plain(value):
    """A config value as plain Python (mappings and sequences of an OmegaConf node copied)."""
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


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
        if key == "trial.grpo_config":  # its recipe arguments as plain values, sorted: {} when none is set
            return {k: _plain(node[k]) for k in sorted(node) if kind_of(f"{key}.{k}") == RECIPE}
        return list(node) if key == "lora_target_modules" else node

    out = {key: get(key) for key in RECIPE_SETTINGS}
    if out["completions_per_step"] is None:
        # every rank's micro-batches: the completions of one optimiser step across the processes
        out["completions_per_step"] = (
            get("per_device_train_batch_size") * (get("gradient_accumulation_steps") or 1) * (get("trial.num_processes") or 1)
        )
    out["model"] = get("model.name")
    out["task"] = get("task.name")
    if out.get("loss_type") is None:
        out["loss_type"] = "dapo"  # TRL's default
    if CONDITIONS["per_device_train_batch_size"].applies(out):
        # bnpo: the micro-batch each loss is normalised over is part of what is learned
        out["per_device_train_batch_size"] = get("per_device_train_batch_size")
    accum = get("gradient_accumulation_steps") or max(
        1, (out["completions_per_step"] or 1) // ((get("per_device_train_batch_size") or 1) * (get("trial.num_processes") or 1))
    )
    out["optimiser_steps_per_generation"] = optimiser_steps_per_generation(get("steps_per_generation"), accum)
    # the optimiser's update: "adamw" for every AdamW implementation (knobs), an 8-bit/paged one by name (recipe)
    out["optim"] = get("optim") if get("optim") in RECIPE_OPTIMS else "adamw"
    if out.get("vllm_importance_sampling_correction") is None:
        # TRL's default: while it is on, choosing the engine (HF generate or vLLM) is recipe (CONDITIONS["backend"])
        out["vllm_importance_sampling_correction"] = True
    for key in _RECORDED_WHEN_ON:
        if not out.get(key):
            out.pop(key, None)
    return {k: (bool(v) if k in _BOOLEAN_RECIPE and v is not None else v) for k, v in out.items()}
