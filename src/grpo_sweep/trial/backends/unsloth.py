"""Unsloth: FastLanguageModel with vLLM fast inference (colocated) when `backend.fast_inference` is
true (the default), else HF generation; 4-bit weights and its GRPO patches.

Unsloth patches transformers, peft and TRL when it is imported, so it must be imported first:
trials of this backend start in a fresh interpreter (`config.backends.start_method` -> spawn) and import
Unsloth before anything else (`backends.prepare_imports`, which also sets UNSLOTH_VLLM_STANDBY
for standby mode). After that, `from trl import GRPOConfig, GRPOTrainer` returns Unsloth's
patched classes; the lever translation is still `trl.grpo_args`.

Unsloth builds its own vLLM engine inside `from_pretrained(fast_inference=True)` with
`gpu_memory_utilization` (rescaled for an emulated card, as for trl_vllm) and
`max_lora_rank=lora_rank`; its GRPO trainer then samples with it (use_vllm, colocate).
Unsloth may rewrite `per_device_train_batch_size` (unsloth#3572): `effective` reads it back.

`backend.fast_inference=false`: Unsloth keeps no engine, generation is transformers `generate` on
the training model (Unsloth's patched fast path), the trainer runs with `use_vllm=False`, and
`gpu_memory_utilization` reserves nothing (effective: None, as for `trl`). The estimator reads the
same key (memory/estimator.py `generates_with_vllm`): no pool, HF generation's KV cache. Unsloth
itself refuses `fast_inference=True` without vLLM; validate.validate says so before the trial starts.
"""

from __future__ import annotations

from typing import Any

from . import trl as trl_backend
from .trl_vllm import remember_budget, vllm_readback
from .vllm_util import device_utilization


def fast_inference(cfg: Any) -> bool:
    """`backend.fast_inference` (default true): vLLM generation inside Unsloth, else HF generation."""
    return bool(cfg.backend.get("fast_inference", True))


def from_pretrained_kwargs(cfg: Any, model_name: str, *, device_util: float, dtype=None, fast_inference: bool = True) -> dict:
    """FastLanguageModel.from_pretrained arguments (tested against its signature where installed).
    The vLLM arguments (pool fraction, LoRA rank cap, standby) only with `fast_inference`.

    Args:
        cfg: The composed train config.
        model_name: The model's name or path.
        device_util: vLLM's share of the physical card.
        dtype: The weights' dtype; None: Unsloth's choice.
        fast_inference: Unsloth runs vLLM for generation.

    Returns:
        The keyword arguments.
    """
    kwargs = dict(
        model_name=model_name,
        max_seq_length=cfg.max_seq_length,
        dtype=dtype,
        load_in_4bit=bool(cfg.load_in_4bit),
        fast_inference=fast_inference,
        random_state=cfg.seed,
    )
    if fast_inference:
        kwargs.update(
            max_lora_rank=cfg.lora_rank,
            gpu_memory_utilization=device_util,
            unsloth_vllm_standby=bool(cfg.backend.unsloth_standby),
        )
    return kwargs


def peft_kwargs(cfg: Any) -> dict:
    """FastLanguageModel.get_peft_model arguments.

    With the `gradient_checkpointing` lever on: `use_gradient_checkpointing="unsloth"` (Unsloth's
    checkpointing offloaded to host memory, its default) unless gradient_checkpointing_offload=false asks for
    plain checkpointing (True); False when the lever is off. The lever means the same in every backend, so the
    sweep can trade it like the others.
    """
    offload = cfg.get("gradient_checkpointing_offload")
    checkpointing = ("unsloth" if offload is None or offload else True) if cfg.gradient_checkpointing else False
    return dict(
        r=cfg.lora_rank,
        target_modules=list(cfg.lora_target_modules),
        lora_alpha=trl_backend.lora_alpha(cfg),
        lora_dropout=0.0,
        bias="none",
        use_gradient_checkpointing=checkpointing,
        random_state=cfg.seed,
    )


def grpo_unsloth_args(cfg: Any, *, on_cuda: bool, output_dir: str, fast_inference: bool = True) -> dict:
    """`trl.grpo_args` for a vLLM sampler; Unsloth's trainer turns on use_vllm/colocate itself
    when the model carries an engine, we set them too so the config says what runs. Without fast
    inference: the HF sampler (`min_new_tokens`) and use_vllm=False. gradient_checkpointing is
    Unsloth's (above).

    Args:
        cfg: The composed train config.
        on_cuda: The trial runs on a CUDA device.
        output_dir: The trainer's output folder.
        fast_inference: Unsloth runs vLLM for generation.

    Returns:
        GRPOConfig keyword arguments.
    """
    sampler = "vllm" if fast_inference else "hf"
    args = trl_backend.grpo_args(cfg, on_cuda=on_cuda, output_dir=output_dir, sampler=sampler)
    if fast_inference:
        args.update(use_vllm=True, vllm_mode="colocate")
    else:
        args.update(use_vllm=False)
    args.update(gradient_checkpointing=False)
    args.pop("gradient_checkpointing_kwargs", None)  # Unsloth's own, through get_peft_model
    for key in UNSLOTH_LOSS_SETTINGS:  # UnslothGRPOConfig fields; null: Unsloth sizes them from the free memory
        if cfg.backend.get(key) is not None:
            args[key] = int(cfg.backend[key])
    return args


# backend.* settings passed by name to Unsloth's GRPOConfig (unsloth/models/rl.py UnslothGRPOConfig; read by
# unsloth_zoo/rl_replacements.py grpo_accumulated_loss).
UNSLOTH_LOSS_SETTINGS = ("unsloth_grpo_mini_batch", "unsloth_logit_chunk_multiplier")


def build_trainer(cfg: Any, ctx: Any):
    import unsloth  # noqa: F401  (already imported first by prepare_imports; kept for direct callers)
    from unsloth import FastLanguageModel

    from ..models import model_path, torch_dtype

    fast = fast_inference(cfg)
    util = device_utilization(cfg) if fast else 0.0
    name = model_path(cfg, ctx.tokenizer, on_cuda=ctx.on_cuda)
    if fast:
        print(
            f"[trial] Unsloth + vLLM: gpu_memory_utilization {cfg.gpu_memory_utilization} on {cfg.gpu.name} "
            f"-> {util:.4f} of this card; standby={bool(cfg.backend.unsloth_standby)}",
            flush=True,
        )
    else:
        print(
            "[trial] Unsloth with backend.fast_inference=false: HF generation, no vLLM engine; "
            f"gpu_memory_utilization={cfg.gpu_memory_utilization} reserves nothing",
            flush=True,
        )
    load_kwargs = from_pretrained_kwargs(cfg, name, device_util=util, dtype=torch_dtype(cfg, ctx.on_cuda), fast_inference=fast)
    model, _unsloth_tokenizer = FastLanguageModel.from_pretrained(**load_kwargs)
    model = FastLanguageModel.get_peft_model(model, **peft_kwargs(cfg))
    from trl import GRPOConfig  # Unsloth's patched config (imported after unsloth)

    out_dir = str(ctx.run_dir / "trainer")
    args = GRPOConfig(**grpo_unsloth_args(cfg, on_cuda=ctx.on_cuda, output_dir=out_dir, fast_inference=fast))
    trainer = trl_backend.make_trainer(ctx, model, args)
    if fast:
        remember_budget(trainer, cfg, util)
        trainer.grpo_sweep_vllm["sleep_mode"] = bool(cfg.backend.unsloth_standby)
    trainer.grpo_sweep_fast_inference = fast
    trainer.grpo_sweep_unsloth = unsloth_settings(cfg, load_kwargs)
    trainer.grpo_sweep_gradient_checkpointing = bool(cfg.gradient_checkpointing)
    return trainer


def unsloth_settings(cfg: Any, load_kwargs: dict) -> dict:
    """The Unsloth calls as this trial made them, for the export's best_unsloth.py (report/export.py):
    from_pretrained with gpu_memory_utilization as the lever (the target card's share; the trial may
    have rescaled it for an emulated card) and dtype by name."""
    loaded = dict(load_kwargs)
    loaded["dtype"] = str(loaded["dtype"]).replace("torch.", "") if loaded.get("dtype") is not None else None
    if loaded.get("fast_inference"):
        loaded["gpu_memory_utilization"] = float(cfg.gpu_memory_utilization)
    return {"from_pretrained": loaded, "get_peft_model": peft_kwargs(cfg)}


def settings(trainer, cfg: Any, effective: dict) -> dict:
    """`trl.settings` plus Unsloth's own calls (metrics.json trainer_settings).

    Args:
        trainer: The built trainer.
        cfg: The composed train config.
        effective: The levers in target-card terms.

    Returns:
        The settings, by name.
    """
    out = trl_backend.settings(trainer, cfg, effective)
    out["unsloth"] = getattr(trainer, "grpo_sweep_unsloth", None)
    return out


def find_engine(model) -> Any:
    """Unsloth hangs its vLLM engine on the base model as `vllm_engine`; PEFT wraps it."""
    seen = set()
    while model is not None and id(model) not in seen:
        seen.add(id(model))
        engine = getattr(model, "vllm_engine", None)
        if engine is not None:
            return engine
        model = getattr(model, "base_model", None) or getattr(model, "model", None)
    return None


def effective(trainer) -> dict:
    out = trl_backend.effective(trainer)
    fast = getattr(trainer, "grpo_sweep_fast_inference", True)
    if fast:
        out.update(vllm_readback(trainer, find_engine(trainer.model)))
    else:  # no engine: nothing reserved up front, generation is HF's (gpu_memory_utilization None, as for trl)
        out.update(gpu_memory_utilization=None, vllm_pool_bytes=0)
    out["fast_inference"] = fast
    # Unsloth checkpoints inside the model (get_peft_model), not through TrainingArguments.
    out["gradient_checkpointing"] = getattr(trainer, "grpo_sweep_gradient_checkpointing", out["gradient_checkpointing"])
    return out
