"""TRL GRPOTrainer with vLLM in colocate mode: generation by vLLM in the training process.

This is what most people who hit the seed's OOM run. vLLM reserves `gpu_memory_utilization` of
the card up front for its weights and KV cache; training gets the rest. The lever is rescaled
when a smaller card is emulated (vllm_util.py). TRL builds `vllm.LLM(model=model.name_or_path)`,
so random-weight models are loaded from their saved checkpoint (models.materialize_random).
"""

from __future__ import annotations

from typing import Any

from ...units import budget_bytes
from . import trl as trl_backend
from .vllm_util import cuda_total_bytes, device_utilization, engine_utilization, target_equivalent


def vllm_args(cfg: Any, *, device_util: float) -> dict:
    """The GRPOConfig arguments vLLM colocate adds to `trl.grpo_args` (tested against GRPOConfig)."""
    return dict(
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=device_util,
        vllm_max_model_length=cfg.max_seq_length,
        vllm_enable_sleep_mode=bool(cfg.backend.vllm_enable_sleep_mode),
    )


def grpo_vllm_args(cfg: Any, *, on_cuda: bool, output_dir: str, device_util: float) -> dict:
    """The single lever translation (`trl.grpo_args`, vLLM sampler) plus the colocate arguments."""
    args = trl_backend.grpo_args(cfg, on_cuda=on_cuda, output_dir=output_dir, sampler="vllm")
    args.update(vllm_args(cfg, device_util=device_util))
    return args


def remember_budget(trainer, cfg: Any, device_util: float) -> None:
    """Keep what `effective` needs to express vLLM's fraction in target-card terms."""
    trainer.grpo_sweep_vllm = {
        "requested_device_util": device_util,
        "target_bytes": budget_bytes(cfg),
        "actual_bytes": cuda_total_bytes(),
        "sleep_mode": bool(cfg.backend.vllm_enable_sleep_mode),
    }


def build_trainer(cfg: Any, ctx: Any):
    from trl import GRPOConfig

    from ..models import load_model

    model = load_model(
        cfg,
        ctx.tokenizer,
        on_cuda=ctx.on_cuda,
        quantization_config=trl_backend.quantization_config(cfg),
        by_path=True,
    )
    util = device_utilization(cfg)
    print(
        f"[trial] vLLM colocate: gpu_memory_utilization {cfg.gpu_memory_utilization} on {cfg.gpu.name} "
        f"-> {util:.4f} of this card",
        flush=True,
    )
    args = GRPOConfig(**grpo_vllm_args(cfg, on_cuda=ctx.on_cuda, output_dir=str(ctx.run_dir / "trainer"), device_util=util))
    trainer = trl_backend.make_trainer(ctx, model, args, peft_config=trl_backend.lora_config(cfg))
    remember_budget(trainer, cfg, util)
    return trainer


def vllm_readback(trainer, llm) -> dict:
    """vLLM's reservation as it really is, in device terms and as the lever (target-card terms)."""
    info = getattr(trainer, "grpo_sweep_vllm", {})
    device = engine_utilization(llm) if llm is not None else None
    if device is None:
        device = info.get("requested_device_util")
    lever = None
    if device is not None:
        lever = target_equivalent(device, info.get("target_bytes"), info.get("actual_bytes"))
    actual = info.get("actual_bytes")
    return {
        "gpu_memory_utilization": lever,
        "vllm_gpu_memory_utilization_device": device,
        # vLLM's pool in this process: weights + KV cache + its activations, sized up front as util x card.
        "vllm_pool_bytes": int(device * actual) if device is not None and actual else None,
        "vllm_sleep_mode": info.get("sleep_mode"),
    }


def effective(trainer) -> dict:
    out = trl_backend.effective(trainer)
    generation = getattr(trainer, "vllm_generation", None)
    out.update(vllm_readback(trainer, getattr(generation, "llm", None)))
    return out
