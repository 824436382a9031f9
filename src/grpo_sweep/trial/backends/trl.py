"""Plain TRL: GRPOTrainer with a PEFT LoRA adapter and HF `generate` for sampling.

`grpo_args` is the single translation of our levers into GRPOConfig arguments; the other
backends start from it and add their own.
"""

from __future__ import annotations

from typing import Any

from ...config.split import generation_batch_size, processes_of, split_of
from .transformers_patches import keep_checkpointing_settings
from .trl_patches import time_generation


def lora_alpha(cfg: Any) -> int:
    return cfg.lora_alpha if cfg.lora_alpha is not None else 2 * cfg.lora_rank


def completion_budget(cfg: Any) -> int:
    """max_seq_length is prompt + completion (as in Unsloth); the completion gets the rest."""
    return cfg.max_seq_length - cfg.max_prompt_length


def grpo_fields() -> set[str]:
    """GRPOConfig's argument names (trial.grpo_config may set any that no lever sets)."""
    import dataclasses

    from trl import GRPOConfig

    return {f.name for f in dataclasses.fields(GRPOConfig)}


def grpo_args(cfg: Any, *, on_cuda: bool, output_dir: str, sampler: str = "hf") -> dict:
    """GRPOConfig keyword arguments for our levers (tested against GRPOConfig's real signature).

    `sampler` names what generates completions: "hf" (transformers `generate`, whose
    GenerationConfig calls the floor `min_new_tokens`) or "vllm" (`SamplingParams`: `min_tokens`).
    The vLLM backends add their own arguments on top of these (trl_vllm.vllm_args).

    Args:
        cfg: The composed train config.
        on_cuda: The trial runs on a CUDA device.
        output_dir: The trainer's output folder.
        sampler: "hf" or "vllm": what generates completions.

    Returns:
        GRPOConfig keyword arguments.
    """
    completion = completion_budget(cfg)
    args = dict(
        output_dir=output_dir,
        max_steps=cfg.trial.steps,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=split_of(cfg)[1],  # derived from completions_per_step when null
        num_generations=cfg.num_generations,
        # TRL's generation batch is global: every rank's per-device batch x grad-accum (steps_per_generation).
        generation_batch_size=generation_batch_size(cfg),
        max_completion_length=completion,
        gradient_checkpointing=cfg.gradient_checkpointing,
        optim=cfg.optim,
        torch_compile=cfg.torch_compile,
        use_transformers_continuous_batching=bool(cfg.get("use_transformers_continuous_batching", False)),
        cast_lm_head_to_fp32=bool(cfg.get("cast_lm_head_to_fp32", False)),
        learning_rate=cfg.learning_rate,
        beta=cfg.beta,
        loss_type=cfg.loss_type,
        vllm_importance_sampling_correction=cfg.vllm_importance_sampling_correction,  # applies only with use_vllm
        seed=cfg.seed,
        bf16=on_cuda and cfg.model.dtype in ("auto", "bfloat16"),
        use_cpu=not on_cuda,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        shuffle_dataset=True,
    )
    from omegaconf import OmegaConf

    if checkpointing_kwargs(cfg):
        args["gradient_checkpointing_kwargs"] = checkpointing_kwargs(cfg)
    for key in ("torch_empty_cache_steps", "pad_to_multiple_of"):  # null: upstream's default, not passed
        if cfg.get(key) is not None:
            args[key] = cfg[key]
    if cfg.get("ds3_gather_for_generation", True) is False:  # true is TRL's default: passed only when off
        args["ds3_gather_for_generation"] = False
    if cfg.task.get("reward_weights") is not None:  # task.reward_weights (config/user_task.py checks them)
        args["reward_weights"] = [float(w) for w in cfg.task.reward_weights]
    extra = cfg.trial.get("grpo_config") or {}
    extra = OmegaConf.to_container(extra, resolve=True) if OmegaConf.is_config(extra) else dict(extra)
    unknown = sorted(set(extra) - grpo_fields())
    if unknown:
        raise ValueError(f"trial.grpo_config: {unknown} are not GRPOConfig arguments (trl.GRPOConfig's fields)")
    levers = set(args) & set(extra)
    if levers:
        raise ValueError(f"trial.grpo_config: {sorted(levers)} are set by the levers; set them at the top level")
    args.update(strategy_args(cfg))
    args.update(extra)
    if cfg.trial.worst_case_lengths:
        # Force every completion to the full budget: the peak a trial measures is the worst case.
        floor = {"hf": "min_new_tokens", "vllm": "min_tokens"}[sampler]
        args["generation_kwargs"] = {floor: completion}
    return args


def checkpointing_kwargs(cfg: Any) -> dict:
    """TrainingArguments.gradient_checkpointing_kwargs for gradient_checkpointing_every_n_layers and
    gradient_checkpointing_offload, only with gradient_checkpointing on (transformers reads them only then) and
    only where they differ from transformers' defaults (every layer, no offload): {} leaves the arguments as
    before these settings existed."""
    if not cfg.gradient_checkpointing:
        return {}
    out: dict = {}
    every = cfg.get("gradient_checkpointing_every_n_layers", 1)
    if every != 1:
        out["every_n_layers"] = int(every)
    if cfg.get("gradient_checkpointing_offload"):
        out["offload"] = True
    return out


def checkpointed_layers(model) -> int:
    """Decoder layers whose activations are checkpointed now (transformers' GradientCheckpointingLayer)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return sum(
        bool(getattr(m, "gradient_checkpointing", False)) for m in model.modules() if isinstance(m, GradientCheckpointingLayer)
    )


def strategy_args(cfg: Any) -> dict:
    """GRPOConfig arguments for trial.strategy when the trial runs as N ranks (torchrun sets the
    ranks' environment; accelerate reads it: gloo on CPU, NCCL on CUDA). ddp needs none;
    fsdp: transformers' `fsdp` / `fsdp_config` (FSDP2 `fully_shard`, one unit per decoder layer,
    see docs/multi-gpu.md); zero2 / zero3: a DeepSpeed config dict with HF's "auto" values."""
    if processes_of(cfg) <= 1:
        return {}
    strategy = cfg.trial.get("strategy", "ddp")
    offload = bool(cfg.trial.get("offload", False))  # validated: only with fsdp, zero2 or zero3
    if strategy == "ddp":
        # LoRA trains every adapter each step: no unused parameters to search for (a full pass per step otherwise).
        return {"ddp_find_unused_parameters": False}
    if strategy == "fsdp":
        return {
            "fsdp": True,  # full shard: fsdp_config's reshard_after_forward
            "fsdp_config": {
                "version": 2,
                "reshard_after_forward": True,
                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "cpu_ram_efficient_loading": False,
                "state_dict_type": "FULL_STATE_DICT",
                "activation_checkpointing": False,
                # trial.offload: parameters, gradients and optimiser state in host memory (FSDP2 CPUOffloadPolicy)
                **({"cpu_offload": True} if offload else {}),
            },
        }
    stage = 2 if strategy == "zero2" else 3
    zero: dict = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": "auto"}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size="auto", stage3_param_persistence_threshold="auto")
    if offload:  # trial.offload: the optimiser state (and under ZeRO-3 the parameters) in pinned host memory
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "deepspeed": {
            "zero_optimization": zero,
            "bf16": {"enabled": "auto"},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto",
            "gradient_clipping": "auto",
        }
    }


def lora_config(cfg: Any):
    """The LoRA adapter for the levers; None with trial.full_finetune (every weight trains)."""
    if cfg.trial.get("full_finetune"):
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=lora_alpha(cfg),
        target_modules=list(cfg.lora_target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def quantization_config(cfg: Any):
    """bitsandbytes NF4 for `load_in_4bit` on CUDA (validated before we get here)."""
    if not cfg.load_in_4bit:
        return None
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


def build_trainer(cfg: Any, ctx: Any):
    """ctx carries what the worker prepared: tokenizer, dataset, reward_funcs, callbacks, run_dir."""
    from trl import GRPOConfig

    from ..models import load_model

    args = GRPOConfig(
        **grpo_args(cfg, on_cuda=ctx.on_cuda, output_dir=str(ctx.run_dir / "trainer"))
    )  # bad args: before the model loads
    model = load_model(cfg, ctx.tokenizer, on_cuda=ctx.on_cuda, quantization_config=quantization_config(cfg))
    return make_trainer(ctx, model, args, peft_config=lora_config(cfg))


def trainer_kwargs(ctx: Any, model, args, peft_config=None) -> dict:
    """GRPOTrainer keyword arguments shared by every backend (tested against its signature).

    Args:
        ctx: The trial's context (its dataset, tokenizer and callbacks).
        model: The model to train.
        args: The GRPOConfig.
        peft_config: The LoRA adapter's config, or None.

    Returns:
        GRPOTrainer keyword arguments.
    """
    return dict(
        model=model,
        reward_funcs=list(ctx.reward_funcs),
        args=args,
        train_dataset=ctx.dataset,
        processing_class=ctx.tokenizer,
        peft_config=peft_config,
        callbacks=list(ctx.callbacks),
    )


def make_trainer(ctx: Any, model, args, peft_config=None):
    """GRPOTrainer as imported now (Unsloth's patched class once Unsloth has been imported).

    Args:
        ctx: The trial's context (its dataset, tokenizer and callbacks).
        model: The model to train.
        args: The GRPOConfig.
        peft_config: The LoRA adapter's config, or None.

    Returns:
        The trainer, with our patches applied (trl_patches.py, transformers_patches.py).
    """
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    trainer = GRPOTrainer(**trainer_kwargs(ctx, model, args, peft_config))
    trainer.remove_callback(PrinterCallback)  # our meter prints one line per step instead
    keep_checkpointing_settings(trainer)
    time_generation(trainer)
    return trainer


def after_train(trainer, record: dict) -> None:
    """After `train()` (worker): the median generation time, steps after the first (warm-up)."""
    import statistics

    times = getattr(trainer, "grpo_sweep_generation_s", None) or []
    steady = times[1:] or times
    record["generation_time_s"] = statistics.median(steady) if steady else None
    record["generation_times_s"] = list(times)  # one per call, in order (throughput.speed_record pairs them with steps)
    if record.get("effective") is not None and trainer.args.gradient_checkpointing:
        # after the steps, so after every time TRL turned checkpointing off and on again around generation
        record["effective"]["checkpointed_layers_after_train"] = checkpointed_layers(trainer.model)
    if record.get("effective") is not None and trainer.args.torch_compile:
        # Frames TorchDynamo saw and compiled in this process, and the wrapper the Trainer built: measured on CPU,
        # TRL 1.16's GRPO steps never call the compiled wrapper (an OptimizedModule, 0 frames seen).
        from torch._dynamo.utils import counters

        record["effective"]["compiled_frames"] = int(counters["frames"]["ok"])
        record["effective"]["dynamo_frames_seen"] = int(counters["frames"]["total"])
        record["effective"]["compiled_model"] = type(getattr(trainer, "model_wrapped", None)).__name__


def effective(trainer) -> dict:
    """The levers as the trainer really runs them, read back from the built trainer."""
    args = trainer.args
    model = trainer.model
    peft_cfg = getattr(model, "peft_config", {}).get("default")
    quant = getattr(getattr(model, "config", None), "quantization_config", None)
    vllm_util = args.vllm_gpu_memory_utilization if getattr(args, "use_vllm", False) else None
    return {
        "strategy": strategy_of(trainer),
        "max_completion_length": trainer.max_completion_length,
        "gpu_memory_utilization": vllm_util,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "num_generations": trainer.num_generations,
        "generation_batch_size": args.generation_batch_size,
        "lora_rank": peft_cfg.r if peft_cfg else None,
        "lora_target_modules": sorted(peft_cfg.target_modules) if peft_cfg else None,
        "load_in_4bit": bool(quant and _get(quant, "load_in_4bit")) or _has_4bit_layers(model),
        # TRL can switch checkpointing on for k-bit models: read the model, not only the args.
        "gradient_checkpointing": bool(args.gradient_checkpointing) or bool(getattr(model, "is_gradient_checkpointing", False)),
    }


def strategy_of(trainer) -> str | None:
    """How accelerate really distributes the trainer: ddp | fsdp | zero2 | zero3, None for one process.
    (accelerate 1.x enables FSDP only on accelerators: on CPU an fsdp request becomes DDP.)"""
    state = getattr(getattr(trainer, "accelerator", None), "state", None)
    kind = str(getattr(state, "distributed_type", "NO")).split(".")[-1]
    if kind == "FSDP":
        return "fsdp"
    if kind == "DEEPSPEED":
        plugin = getattr(state, "deepspeed_plugin", None)
        return f"zero{getattr(plugin, 'zero_stage', '?')}"
    return "ddp" if kind.startswith("MULTI_") else None


def _get(obj, key):
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _has_4bit_layers(model) -> bool:
    """bitsandbytes' 4-bit linear layers present (whatever the config says)."""
    return any(type(m).__name__ == "Linear4bit" for m in model.modules())


# GRPOConfig fields the export writes (report/export.py), read back from the trainer that ran. Not the
# measuring-only ones (output_dir, max_steps, use_cpu, logging, save_strategy, report_to, the worst-case
# generation floor) nor what TRL derives (generation_batch_size = batch x accumulation).
EXPORTED_ARGS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "max_completion_length",
    "gradient_checkpointing",
    "steps_per_generation",  # TRL derives generation_batch_size from it (the two are mutually exclusive)
    "gradient_checkpointing_kwargs",  # every_n_layers, offload
    "optim",
    "torch_compile",
    "torch_empty_cache_steps",
    "pad_to_multiple_of",
    "use_transformers_continuous_batching",
    "cast_lm_head_to_fp32",
    "bf16",
    "learning_rate",
    "beta",
    "loss_type",
    "vllm_importance_sampling_correction",
    "seed",
    "reward_weights",
    "use_vllm",
    "vllm_mode",
    "vllm_gpu_memory_utilization",
    "vllm_max_model_length",
    "vllm_enable_sleep_mode",
    "vllm_tensor_parallel_size",
    "vllm_model_impl",
    "ds3_gather_for_generation",
)


# EXPORTED_ARGS left out of the export at TRL 1.16's default value (trl/trainer/grpo_config.py).
_UNWRITTEN_DEFAULTS = {"vllm_tensor_parallel_size": 1, "vllm_model_impl": "vllm", "ds3_gather_for_generation": True}


def settings(trainer, cfg: Any, effective: dict) -> dict:
    """metrics.json `trainer_settings`: what a TRL user needs to run this trial's configuration
    (GRPOConfig fields, the LoRA adapter, 4-bit loading, the model and the data), read back from the
    built trainer; `effective` gives the levers in target-card terms (vLLM's share of the card).

    Args:
        trainer: The built trainer.
        cfg: The composed train config.
        effective: The levers in target-card terms.

    Returns:
        The settings, by name.
    """
    import os

    from omegaconf import OmegaConf

    from ...config.user_task import load_args, reward_path

    args = trainer.args
    grpo = {k: getattr(args, k) for k in EXPORTED_ARGS if hasattr(args, k)}
    grpo["gradient_checkpointing"] = bool(effective.get("gradient_checkpointing", grpo.get("gradient_checkpointing")))
    if grpo.get("use_vllm"):
        grpo["vllm_gpu_memory_utilization"] = effective.get("gpu_memory_utilization") or cfg.gpu_memory_utilization
    else:
        grpo = {k: v for k, v in grpo.items() if not k.startswith("vllm_")}
    for key in ("reward_weights", "gradient_checkpointing_kwargs", "torch_empty_cache_steps", "pad_to_multiple_of"):
        if not grpo.get(key):  # unset: TRL's own default, not written (pad_to_multiple_of's "auto" read back as None)
            grpo.pop(key, None)
    for key, default in _UNWRITTEN_DEFAULTS.items():  # TRL's defaults: an exported config names only what differs
        if key in grpo and grpo[key] == default:
            grpo.pop(key)
    extra = cfg.trial.get("grpo_config") or {}
    extra = OmegaConf.to_container(extra, resolve=True) if OmegaConf.is_config(extra) else dict(extra)
    grpo.update({k: getattr(args, k, v) for k, v in extra.items()})
    model = trainer.model
    peft_cfg = getattr(model, "peft_config", {}).get("default")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    name = getattr(base, "name_or_path", "") or getattr(getattr(base, "config", None), "_name_or_path", "")
    dtype = str(getattr(base, "dtype", "")).replace("torch.", "") or None
    task = cfg.task
    return {
        "model_name_or_path": name or None,  # empty: random weights built in memory (no checkpoint to point at)
        "model": {"name": cfg.model.name, "source": cfg.model.source, "init": cfg.model.get("init")},
        "dtype": dtype,
        # the attention the model runs (transformers' config._attn_implementation)
        "attn_implementation": getattr(getattr(base, "config", None), "_attn_implementation", None),
        "grpo_config": grpo,
        "lora": None
        if peft_cfg is None
        else {
            "r": peft_cfg.r,
            "lora_alpha": peft_cfg.lora_alpha,
            "lora_dropout": peft_cfg.lora_dropout,
            "target_modules": sorted(peft_cfg.target_modules),
            "bias": peft_cfg.bias,
            "task_type": str(getattr(peft_cfg.task_type, "value", peft_cfg.task_type)),
        },
        "quantization": _quantization(base) if effective.get("load_in_4bit") else None,
        "dataset": {**load_args(task), "prompt_column": str(task.prompt_column)} if task.get("path") else None,
        "task": str(task.name),
        "reward_funcs": [reward_path(str(n)) for n in task.get("reward_funcs") or []] or None,
        "max_prompt_length": cfg.max_prompt_length,
        "worst_case_lengths": bool(cfg.trial.worst_case_lengths),
        "cwd": os.getcwd(),
    }


def _quantization(model) -> dict:
    """The 4-bit loading the model really got (its config's quantization_config)."""
    quant = getattr(getattr(model, "config", None), "quantization_config", None) or {}
    out = {"load_in_4bit": True}
    for key in ("bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "bnb_4bit_compute_dtype"):
        value = _get(quant, key)
        out[key] = str(value).replace("torch.", "") if key == "bnb_4bit_compute_dtype" and value is not None else value
    return out
