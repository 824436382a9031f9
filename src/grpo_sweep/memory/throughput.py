"""A coarse throughput model: seconds per GRPO step on the target card, for ranking memory fixes.

Pure arithmetic like the estimator (no torch). The card's speed comes from its own
`conf/gpu/*.yaml` (`tflops_bf16`, `bandwidth_gbs`) and nowhere else: a card without them is an
error that names the file to fix, never another card's numbers.
"""

from __future__ import annotations

from typing import Any

from ..config.backends import vllm_engine_settings
from ..config.schema import ConfigError, processes_of
from .estimator import checkpointed_layers, estimate, generates_with_vllm
from .shapes import kv_bytes_per_token, param_counts, resolve_backend_for, shapes, target_device, weights_bytes
from .vllm import vllm_kv_element_bytes

# vLLM's per-decode-step overhead (scheduler, sampler, CUDA graph replay) and, under enforce_eager, the kernel
# launches per layer a graph replay saves, at HF generate's measured rate (both eager PyTorch).
VLLM_STEP_S = 0.003
EAGER_LAYER_S = 0.00035


def vllm_step_overhead(s, engine: dict, device: str) -> float:
    """Seconds of overhead per vLLM decode step: VLLM_STEP_S, or with backend.vllm_enforce_eager=true on a card
    (no CUDA graphs: vllm/config/model.py enforce_eager) the per-layer launches, whichever is larger."""
    if engine.get("enforce_eager") and device == "cuda":
        return max(VLLM_STEP_S, EAGER_LAYER_S * s.L)
    return VLLM_STEP_S


def card_speed(cfg: Any) -> tuple[float, float]:
    """(peak dense bf16 TFLOP/s, memory bandwidth GB/s) of the target card, from its config."""
    gpu = cfg.gpu
    tflops, gbs = gpu.get("tflops_bf16"), gpu.get("bandwidth_gbs")
    if not tflops or not gbs or tflops <= 0 or gbs <= 0:
        raise ConfigError(
            f"gpu={gpu.name}: gpu.tflops_bf16={tflops} and gpu.bandwidth_gbs={gbs}: both must be positive numbers "
            f"to model throughput (add them to conf/gpu/{gpu.name}.yaml from the card's datasheet, "
            "or pass gpu.tflops_bf16=... gpu.bandwidth_gbs=...)"
        )
    return float(tflops), float(gbs)


def recompute_passes(s) -> float:
    """Extra forward passes checkpointing costs: the share of layers checkpointed (all, or every n-th with
    gradient_checkpointing_every_n_layers), each recomputed once in backward.

    The other trainer settings have no term here, each for a reason: gradient_checkpointing_offload's
    host copies run at the host link's speed, which is not among a card's numbers (conf/gpu);
    torch_empty_cache_steps costs allocator calls, not FLOPs or bytes; cast_lm_head_to_fp32 runs the head
    at the card's fp32 rate, also not among its numbers; use_transformers_continuous_batching changes the
    decode scheduler's overhead, not measured on a card yet. pad_to_multiple_of enters through the padded
    lengths (shapes.shapes)."""
    return checkpointed_layers(s) / s.L if s.L else 0.0


def relative_step_time(cfg: Any, logits_mode: str | None = None) -> dict:
    """A coarse time-per-step model (seconds on the target card) for ranking memory fixes.

    training: FLOPs per micro-batch (TRL's compute_flops_per_token, with LoRA's backward ~ one
    forward since base-weight gradients are not needed, +1 forward with checkpointing, + the chunked
    head's recompute) at 40 % of peak, scaled by a micro-batch efficiency `tokens / (tokens + 2048)`;
    4-bit adds the dequantisation traffic (bitsandbytes dequantises each projection to bf16 before
    the matmul: +4.5 bytes per weight per pass, training and decode alike). generation: one decode
    step per completion token, bound by reading the weights and the KV cache at 60 % of bandwidth,
    plus a per-step overhead (HF generate ~0.35 ms per layer, vLLM 3 ms: `vllm_step_overhead`; an fp8 KV cache
    halves the KV reads). When vLLM's KV cache (or backend.vllm_max_num_seqs) holds
    fewer sequences than the generation batch (the estimator's `generation_waves`, vLLM's scheduler
    queueing the rest), each wave decodes its share of the batch for the full completion length: the
    weights are read and the per-step overhead paid once per wave, the KV reads stay the batch's.
    Sources: NVIDIA datasheets (`tflops_bf16`, `bandwidth_gbs` in conf/gpu/*.yaml), TRL
    `compute_flops_per_token`. Only ratios between configs are used. Seconds are one rank's (the
    ranks step together); tokens/s is the trial's, over its trial.num_processes ranks.
    """
    device = target_device(cfg)
    backend = resolve_backend_for(cfg, device)
    s = shapes(cfg, backend)
    tflops, gbs = card_speed(cfg)
    peak, bw = tflops * 1e12 * 0.4, gbs * 1e9 * 0.6
    n = param_counts(s)
    tokens = s.B * s.S
    layer_flops = 2 * n["linear"] + 4 * s.nh * s.hd * s.S * s.L  # per token, forward
    head_flops = 2 * s.V * s.H
    passes = 2 + recompute_passes(s)
    flops = tokens * (layer_flops * passes + head_flops * (2 if logits_mode == "full" else 4))
    eff = tokens / (tokens + 2048)
    train = flops / (peak * eff)
    dequant = n["linear"] * 4.5 if s.four_bit else 0  # read NF4, write + read a bf16 copy per pass
    train += passes * dequant / bw
    train *= s.GA
    weight_read = weights_bytes(s) + dequant
    vllm = generates_with_vllm(cfg, backend)
    engine = vllm_engine_settings(cfg) if backend == "trl_vllm" else {}
    kv_read = s.G * (s.P + s.C / 2) * kv_bytes_per_token(s, vllm_kv_element_bytes(engine, s.wb) if vllm else s.wb)
    overhead = vllm_step_overhead(s, engine, device) if vllm else EAGER_LAYER_S * s.L
    waves = (estimate(cfg, logits_mode, device=device, backend=backend).assumptions.get("generation_waves") or 1) if vllm else 1
    gen = s.C * ((waves * weight_read + kv_read) / bw + waves * overhead)
    return {
        "training_s": train,
        "generation_s": gen,
        "generation_waves": waves,
        "step_s": train + gen,
        # every rank trains its own G completions in the same step time: the trial's tokens/s is N ranks'
        "tokens_per_s": processes_of(cfg) * s.G * s.S / (train + gen),
        "rank_tokens_per_s": s.G * s.S / (train + gen),
    }
