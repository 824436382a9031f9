"""Predict a GRPO trial's peak memory from the config alone: pure arithmetic, no torch, no GPU.

`estimate(cfg)` takes the composed train config (the same one train.py runs) and returns bytes per
component at the predicted peak, the budget of the target card (`gpu.memory_gib`) and the verdict.
Every term is derived from the model's `arch` numbers (conf/model/*.yaml) and the levers, following
what the code that really runs (TRL 1.16, transformers 5.x, PEFT, PyTorch autograd) allocates; each
function's docstring names its source. `bench/estimator_accuracy.py` measures the error against the
CPU tensor tracker, `bench/fake_trace.py` against a FakeTensorMode trace of Gemma 3 1B.

Two phases are modelled and the larger one is the peak:
- training (one micro-batch forward + backward, then AdamW): weights, LoRA parameters, their
  gradients and optimiser state, saved activations, the logits computation, inputs;
- generation (HF `generate` for `trl`, vLLM's pool for `trl_vllm` / `unsloth`).

Device: `gpu=cpu` / `gpu=cpu_sim` (or any `gpu.simulated=true`) is the CPU path (float32, TRL's
torch fallback for the fused LM head); every real card is CUDA (bfloat16, Triton fused LM head).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import backends
from ..config.backends import generates_with_vllm
from ..config.model_arch import sliding_layers
from ..config.split import processes_of
from ..units import GIB as GiB
from ..units import budget_bytes
from .ranks import rank_terms
from .shapes import (
    CUDA_CONTEXT_BYTES,
    Shapes,
    gradient_bytes,
    kv_bytes_per_token,
    lora_bytes,
    optimizer_bytes,
    param_counts,
    resolve_backend_for,
    shapes,
    target_device,
    trainable_param_count,
    weights_bytes,
)
from .vllm import (
    VLLM_CPU_BLOCK_TOKENS,
    VLLM_GPU_BLOCK_TOKENS,
    kv_cache_capacity,
    unsloth_utilization,
    vllm_cpu_plan,
    vllm_engine,
    vllm_fixed_kv_pool,
    vllm_kv_available,
    vllm_kv_element_bytes,
    vllm_non_kv_bytes,
    vllm_pool_bytes,
)

LOGITS_MODES = ("chunked", "full")
# TRL 1.16 trl/trainer/utils.py `_CHUNKED_LOGPROB_CHUNK_SIZE` (vocabulary columns per tile) and
# trl/kernels/chunked_logprob.py `TOKEN_CHUNK_SIZE` (tokens per tile).
VOCAB_TILE = 32768
TOKEN_TILE = 4096


@dataclass
class Estimate:
    """Bytes per component at the predicted peak; they sum to `total_bytes`."""

    components: dict[str, int]
    total_bytes: int
    budget_bytes: int | None
    headroom_bytes: int | None
    fits: bool
    kv_cache_ok: bool | None
    assumptions: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)  # phase -> total bytes
    peak_phase: str = "training"

    @property
    def dominant(self) -> str:
        return max(self.components, key=lambda k: self.components[k])

    def to_dict(self) -> dict:
        out = asdict(self)
        out["dominant"] = self.dominant
        return out


# ----------------------------------------------------------------------------- activations


def _norm_saved(width: int) -> int:
    """Bytes per token an RMSNorm saves when its input requires grad: the fp32 input (`x.float()` /
    `x.to(float32)`, a no-op copy in fp32 models) for pow/mul backward, plus the fp32 rsqrt scalar.
    Source: LlamaRMSNorm / Gemma3RMSNorm forward in transformers 5.x."""
    return 4 * width + 4


def layer_saved_bytes_per_token(s: Shapes, *, first: bool = False, masked: bool = False) -> int:
    """Bytes per token one decoder layer keeps for backward (autograd's saved tensors).

    Walks the layer's forward (transformers 5.x Llama/Qwen2/Gemma3 with PEFT LoRA, SDPA) and counts
    what each op saves when its inputs require grad; with frozen base weights a plain `F.linear`
    saves nothing (its weight gradient is not needed), so only LoRA inputs, norms, attention and the
    MLP's elementwise ops keep tensors. This is why the naive `hidden x layers x 2` is ~35x too low:
    the MLP alone keeps 3 x intermediate_size per token (gate, act(gate), up).

    - norms: `_norm_saved` (2 per Llama layer, 4 + q_norm/k_norm per Gemma 3 layer);
    - LoRA: each adapter's input in fp32 (PEFT `_cast_input_dtype` copies bf16 inputs per adapter,
      so adapters sharing an input share one tensor only in fp32 models) + lora_A's output r x fp32;
    - attention: SDPA saves q, k, v, the output and the fp32 logsumexp; rotary `q*cos + rot(q)*sin`
      saves only cos/sin (shared). With an attention mask and GQA, transformers' `repeat_kv` expands
      k and v to all heads first (`use_gqa_in_sdpa` is False with a mask);
    - MLP: act_fn saves gate, the product saves act(gate) and up: 3 x I;
    - `first`: layer 0's input (the frozen embedding) needs no grad, so its input norm saves nothing.
    """
    wb = s.wb
    n = 0
    norms = [s.H] * (4 if s.family == "gemma3" else 2)
    if first:
        norms = norms[1:]
    n += sum(_norm_saved(w) for w in norms)
    if s.family == "gemma3":
        n += _norm_saved(s.qd)  # q_norm over the heads (q requires grad once any adapter touches it)
        if not first or "k_proj" in s.targets or s.full:
            n += _norm_saved(s.kd)
    # LoRA inputs grouped by the tensor they read.
    groups = {
        "attn_in": ("q_proj", "k_proj", "v_proj"),
        "o_in": ("o_proj",),
        "mlp_in": ("gate_proj", "up_proj"),
        "down_in": ("down_proj",),
    }
    widths = {"attn_in": s.H, "o_in": s.qd, "mlp_in": s.H, "down_in": s.I}
    for group, modules in groups.items():
        if s.full:  # every projection's weight trains: F.linear saves its input (model dtype), once
            n += wb * widths[group]
            continue
        adapters = sum(1 for m in modules if m in s.targets)
        if adapters:
            copies = 1 if wb == 4 else adapters
            n += copies * 4 * widths[group]
            n += adapters * 4 * s.rank
    kv_width = s.qd if (masked and s.nkv != s.nh) else s.kd
    n += wb * (s.qd + 2 * kv_width + s.qd) + 4 * s.nh  # q, k, v, out, logsumexp
    n += 3 * wb * s.I
    return n


def masked_layers(s: Shapes) -> int:
    """Layers whose SDPA gets an explicit mask: Gemma 3's sliding-window layers (5 of every 6) when
    the sequence is longer than the window; without padding the full-attention layers use is_causal
    (worst-case lengths pad nothing)."""
    if s.family != "gemma3" or s.sliding_window is None or s.S <= s.sliding_window:
        return 0
    return sliding_layers(s.family, s.L)


def activation_bytes(s: Shapes) -> int:
    """Saved activations of one micro-batch (B x S tokens) at the end of the forward pass.

    Without checkpointing: every layer's `layer_saved_bytes_per_token`, plus rotary cos/sin
    (2 per rotary embedding, 2 embeddings in Gemma 3), the masks, the final norm and the hidden
    states handed to the LM head (a copy of `last_hidden_state[:, :-1]`).
    With checkpointing (HF `gradient_checkpointing_enable`, non-reentrant): each layer keeps only its
    input hidden state; backward recomputes one layer at a time, so one full layer is added.
    Unsloth's checkpointing offloads those inputs to CPU RAM: only the recomputed layer remains.
    """
    T = s.B * s.S
    masked = masked_layers(s)
    per_layer = []
    for i in range(s.L):
        # Full fine-tuning trains the embedding: layer 0's input requires grad like every other.
        first = i == 0 and not s.ckpt and not s.full
        per_layer.append(layer_saved_bytes_per_token(s, first=first, masked=i < masked))
    rotary = 2 * (2 if s.family == "gemma3" else 1) * s.hd * s.wb
    head_in = _norm_saved(s.H) + s.H * s.wb
    masks = (2 * s.S) if masked else 0  # bool [B, 1, S, S] for the sliding and the full pattern
    if s.ckpt:
        # checkpointed layers keep their input; the others (every_n_layers > 1) keep everything
        kept = sum(per_layer[i] for i in range(s.L) if i % s.ckpt_every)
        body = checkpointed_layers(s) * s.H * s.wb + kept + max(per_layer)
    else:
        body = sum(per_layer)
    return T * (body + rotary + head_in + masks)


def checkpointed_layers(s: Shapes) -> int:
    """Decoder layers checkpointed: every `ckpt_every`-th from the first (transformers 5.17 modeling_utils.py
    `_set_gradient_checkpointing`: `layer_index % every_n_layers == 0`); none without checkpointing."""
    return -(-s.L // max(1, s.ckpt_every)) if s.ckpt else 0


def offloaded_checkpoint_bytes(s: Shapes) -> int:
    """The checkpointed layers' inputs moved to host memory by offload (transformers 5.17 `offload`: torch
    `save_on_cpu`; Unsloth's "unsloth" checkpointing): off the card, so subtracted from the activations."""
    return s.B * s.S * checkpointed_layers(s) * s.H * s.wb if s.ckpt_offload else 0


def input_bytes(s: Shapes) -> int:
    """The generation batch's tensors the trainer keeps (prompt/completion ids and masks int64,
    sampling log-probs, advantages): about 5 int64/fp32 values per token."""
    return s.G * s.S * 8 * 5


def logits_bytes(s: Shapes, mode: str) -> int:
    """Memory for turning hidden states into per-token log-probabilities, at its own peak.

    chunked (TRL >= 1.16 `add_fused_lm_head` + trl/kernels/chunked_logprob.py, and Unsloth's chunked
    GRPO loss): a tile buffer `[min(N, 4096), 32768]` in the compute dtype, reused for every vocab
    slice, plus `grad_hidden` `[N, H]` fp32 in backward. On CUDA (Triton) only the completion
    positions are scored (N = B x C) and the fold is in-kernel; on CPU (torch fallback) every
    position is scored (N = B x (S-1)) and `_backward_tile` holds 7.25 tile-sized fp32 temporaries
    at once (y, z, log_p, p, grad, is_target.float(), the difference, the bool is_target; measured
    with bench/live_tensor_tracker.py on ChunkedLogProbFunction alone: 7.25 tiles besides the buffer).
    full (a plain causal-LM loss, as TRL < 1.16 and HF's ForCausalLMLoss): logits for every position,
    upcast to fp32, log-softmax saved, and its gradient: at log-softmax backward three fp32
    `[B x S, V]` tensors are alive (the seed's Gemma 3 1B OOM trace on an L4: 12 of 22 GiB). TRL < 1.16 kept only
    completion positions but also the model-dtype logits; we use the plain-loss form, an upper bound.
    """
    if mode == "full":
        return 3 * 4 * s.B * s.S * s.V
    if s.device == "cuda":
        N = s.B * s.C
        tile = min(N, TOKEN_TILE) * VOCAB_TILE * (4 if s.head_fp32 else s.wb)  # cast_lm_head_to_fp32: fp32 tiles
        return tile + N * s.H * 4 + N * 4 * 8
    N = s.B * (s.S - 1)
    n = min(N, TOKEN_TILE)
    tile = n * VOCAB_TILE * 4
    temps = int(7.25 * n * min(s.V, VOCAB_TILE) * 4)
    return tile + temps + N * s.H * 4 + N * 4 * 8


def hf_generation_bytes(s: Shapes) -> int:
    """HF `generate` (backend=trl): the DynamicCache for the whole generation batch (Gemma 3's
    sliding layers keep only the window), the prefill's largest transient (one layer's MLP on the
    prompt, no grad) and the fp32 next-token logits (`logits[:, -1, :].float()`), x2 for sampling."""
    sliding = sliding_layers(s.family, s.L)
    window = min(s.S, s.sliding_window or s.S)
    kv = s.G * s.kd * 2 * s.wb * ((s.L - sliding) * s.S + sliding * window)
    prefill = s.G * s.P * (3 * s.I + 4 * s.H) * s.wb
    return kv + prefill + 2 * s.G * s.V * 4


# TRL 1.16 grpo_trainer.py: ContinuousBatchingConfig(max_memory_percent=0.5) unless the user sets it.
CONTINUOUS_BATCHING_MEMORY_PERCENT = 0.5


def continuous_batching_bytes(cfg: Any, s: Shapes, budget: int | None, resident: int) -> int:
    """use_transformers_continuous_batching: transformers' paged KV cache takes `max_memory_percent` of the
    card's free memory when generation starts (transformers 5.17 generation/continuous_batching/cache.py
    `get_available_memory`: total - allocated after empty_cache; the batch's activations are solved for
    inside that share). Free = the budget less what is resident then. Without a budget (a CPU trial): the
    batch's own KV cache, as HF generate's (the pool would be a share of the host's RAM)."""
    if budget is None:
        return hf_generation_bytes(s)
    extra = (cfg.trial.get("grpo_config") or {}).get("transformers_continuous_batching_config") or {}
    percent = extra.get("max_memory_percent") or CONTINUOUS_BATCHING_MEMORY_PERCENT
    return int(max(budget - resident, 0) * percent)


# ----------------------------------------------------------------------------- estimate


def processes(cfg: Any) -> tuple[int, str]:
    """(trial.num_processes, trial.strategy): 1 and ddp when the config names neither."""
    trial = cfg.get("trial") or {}
    return processes_of(cfg), str(trial.get("strategy", "ddp") or "ddp")


@functools.lru_cache(maxsize=1)
def trl_version() -> str | None:
    """The installed TRL's version (None: not installed here). Read from the package metadata,
    never by importing TRL (the estimator does not import torch); once per process: reading the
    metadata cost a fifth of each estimate, and a sweep's start estimates hundreds of points."""
    try:
        from importlib.metadata import version

        return version("trl")
    except Exception:  # noqa: BLE001 - not installed
        return None


def default_logits_mode(backend: str) -> tuple[str, str]:
    """What the chosen backend really does, and why.

    trl / trl_vllm: TRL >= 1.16 patches the model with `add_fused_lm_head` (chunked); older TRL
    materialised full logits. unsloth: Unsloth's GRPO computes log-probs in chunks.
    """
    if backend == "unsloth":
        return "chunked", "Unsloth's chunked GRPO log-prob computation"
    installed = trl_version() or "unknown"
    try:
        parts = tuple(int(p) for p in installed.split(".")[:2])
    except ValueError:  # odd version string: assume the pinned range
        parts = (1, 16)
    if len(parts) < 2 or installed == "unknown":  # not installed here: assume the pinned range
        parts = (1, 16)
    if parts >= (1, 16):
        return "chunked", f"TRL {installed} >= 1.16 fused chunked LM head (add_fused_lm_head)"
    return "full", f"TRL {installed} < 1.16 materialises full-vocabulary logits"


@dataclass(frozen=True)
class _Modelled:
    """What one estimate models, resolved once from the config and read by every step."""

    s: Shapes
    device: str  # "cpu" | "cuda"
    backend: str  # the resolved backend
    logits_mode: str  # chunked | full
    why_mode: str  # where logits_mode came from
    budget: int | None  # the card's bytes (None: gpu.memory_gib is null)
    vllm: bool  # generation runs in vLLM
    sleep: bool  # vLLM sleeps (trl_vllm) or Unsloth stands by while training
    server: bool  # backend.vllm_mode=server: vLLM in its own process on its own devices
    world: int  # trial.num_processes
    strategy: str  # trial.strategy
    offload: bool  # trial.offload: sharded state in host memory (fsdp, zero2, zero3)
    gather: bool  # ds3_gather_for_generation: ZeRO-3 gathers the whole model for HF generation
    engine: dict  # backend.vllm_* engine settings as vLLM takes them (trl_vllm only; config/backends.py)
    vllm_engine: dict  # the settings vLLM's profile runs with: `engine` over the launcher's (`vllm_engine`)
    continuous_batching: bool  # use_transformers_continuous_batching: HF generation's paged pool


def _modelled(cfg: Any, logits_mode: str | None, device: str | None, backend: str | None) -> _Modelled:
    """Resolve the device, backend and logits mode; a logits mode not in LOGITS_MODES is an error."""
    device = device or target_device(cfg)
    backend = backend or resolve_backend_for(cfg, device)
    why_mode = "given on the command line"
    if logits_mode is None:
        logits_mode, why_mode = default_logits_mode(backend)
    if logits_mode not in LOGITS_MODES:
        raise ValueError(f"logits_mode={logits_mode}: must be one of {', '.join(LOGITS_MODES)}")
    vllm = generates_with_vllm(cfg, backend)
    s = shapes(cfg, backend, device)
    budget = budget_bytes(cfg)
    engine = backends.vllm_engine_settings(cfg) if backend == "trl_vllm" else {}
    server = vllm and backend == "trl_vllm" and cfg.backend.get("vllm_mode", "colocate") == "server"
    sleep_key = "vllm_enable_sleep_mode" if backend == "trl_vllm" else "unsloth_standby"
    world, strategy = processes(cfg)
    return _Modelled(
        s=s,
        device=device,
        backend=backend,
        logits_mode=logits_mode,
        why_mode=why_mode,
        budget=budget,
        vllm=vllm,
        sleep=bool(cfg.backend.get(sleep_key, False)),
        server=server,
        world=world,
        strategy=strategy,
        offload=bool((cfg.get("trial") or {}).get("offload", False)),
        gather=bool(cfg.get("ds3_gather_for_generation", True)),
        engine=engine,
        vllm_engine=(
            vllm_engine(s, backend, engine, budget=budget, utilization=cfg.gpu_memory_utilization, server=server) if vllm else {}
        ),
        continuous_batching=bool(cfg.get("use_transformers_continuous_batching")),
    )


def _vllm_pool(cfg: Any, m: _Modelled) -> tuple[int, dict | None]:
    """vLLM's pool in bytes (0 without vLLM or without a budget): util x card (Unsloth: the utilization it
    rescales, `unsloth_utilization`), and on vLLM-CPU (trl_vllm on the CPU) its plan: the share's weights
    plus whole KV blocks (`vllm_cpu_plan`), whose pool it is."""
    pool = 0
    if m.vllm and m.budget is not None:
        util = cfg.gpu_memory_utilization
        pool = vllm_pool_bytes(unsloth_utilization(util, m.budget) if m.backend == "unsloth" else util, m.budget)
    if m.vllm and m.device == "cpu" and m.backend == "trl_vllm":  # vLLM-CPU: the share's weights + whole KV blocks
        kv_bytes = m.engine.get("kv_cache_memory_bytes")
        cpu_plan = vllm_cpu_plan(m.s, pool if m.budget is not None else None, kv_cache_bytes=kv_bytes)
        return cpu_plan["pool_bytes"], cpu_plan
    if m.vllm and m.engine.get("kv_cache_memory_bytes"):  # a card: the KV bytes as given, not util x card
        return vllm_fixed_kv_pool(m.s, m.backend, m.vllm_engine), None
    return pool, None


def _single_process_phases(cfg: Any, m: _Modelled, pool: int) -> dict[str, dict[str, int]]:
    """Each phase's components in one process: training (forward + backward + AdamW) and generation
    (HF generate's KV cache and temporaries, or vLLM's pool)."""
    s = m.s
    weights = weights_bytes(s)
    act = activation_bytes(s) - offloaded_checkpoint_bytes(s)
    train = {
        "weights": 0 if (m.backend == "unsloth" and m.vllm) else weights,  # Unsloth with vLLM shares its weights
        "lora_params": lora_bytes(s),
        "gradients": gradient_bytes(s),
        "optimizer_state": optimizer_bytes(s),
        "activations": act + input_bytes(s),
        "logits": logits_bytes(s, m.logits_mode),
        "generation": 0,
        "vllm_pool": 0,
        "cuda_context": CUDA_CONTEXT_BYTES if m.device == "cuda" else 0,
    }
    gen = dict(train, activations=input_bytes(s), logits=0, gradients=0)
    # backend.vllm_mode=server: vLLM runs in its own process on its own devices (trial.vllm_devices);
    # the training card holds no pool and the trainer generates nothing itself.
    if m.vllm and not m.server:
        # Asleep while training, vLLM keeps nothing (trl_vllm) or the weights it shares (Unsloth's standby).
        train["vllm_pool"] = (weights if m.backend == "unsloth" else 0) if m.sleep else pool
        gen["vllm_pool"] = pool
    elif not m.vllm:  # HF generation: its paged pool (continuous batching) or generate's KV cache
        gen["generation"] = (
            continuous_batching_bytes(cfg, s, m.budget, sum(gen.values())) if m.continuous_batching else hf_generation_bytes(s)
        )
    return {"training": train, "generation": gen}


def _rank_phases(m: _Modelled, single: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Each phase's components on the largest rank (`rank_terms`); both phases list the same keys."""
    phases = {
        p: rank_terms(m.s, m.world, m.strategy, p, c, hf_generate=not m.vllm, offload=m.offload, gather=m.gather)
        for p, c in single.items()
    }
    train, gen = phases["training"], phases["generation"]
    for key in set(train) | set(gen):
        train.setdefault(key, 0)
        gen.setdefault(key, 0)
    return phases


def _kv_cache(cfg: Any, m: _Modelled, pool: int, cpu_plan: dict | None) -> tuple[bool | None, dict]:
    """Whether vLLM's KV cache holds one max_seq_length sequence (None: no vLLM, or no budget on a
    card), and the numbers behind it for the assumptions."""
    s = m.s
    if cpu_plan is not None:
        capacity = kv_cache_capacity(s, cpu_plan["kv_cache_bytes"], VLLM_CPU_BLOCK_TOKENS, 4, m.engine.get("max_num_seqs"))
        kv_info = {
            "kv_cache_available_bytes": cpu_plan["kv_cache_bytes"],
            "kv_cache_tokens": cpu_plan["kv_cache_bytes"] // kv_bytes_per_token(s, 4),
            "vllm_weights_bytes": cpu_plan["weights_bytes"],
            "vllm_share_bytes": None if m.budget is None else vllm_pool_bytes(cfg.gpu_memory_utilization, m.budget),
        }
    elif m.vllm and (m.budget is not None or m.engine.get("kv_cache_memory_bytes")):
        available = vllm_kv_available(s, pool, m.backend, m.vllm_engine)
        kv_elem = vllm_kv_element_bytes(m.engine, 2)
        capacity = kv_cache_capacity(s, available, VLLM_GPU_BLOCK_TOKENS, kv_elem, m.vllm_engine.get("max_num_seqs"))
        kv_info = {
            "vllm_non_kv_bytes": vllm_non_kv_bytes(s, m.backend, m.vllm_engine),
            "kv_cache_available_bytes": int(available),
            "kv_cache_tokens": max(int(available // kv_bytes_per_token(s, kv_elem)), 0),
        }
    else:
        return None, {}
    # Feasible when one max_seq_length sequence fits (vLLM's rule); fewer sequences than the
    # generation batch only means generation runs in waves.
    kv_ok = capacity["one_sequence_ok"]
    kv_info.update(
        kv_cache_needed_bytes=capacity["min_bytes"],
        kv_cache_batch_bytes=capacity["batch_bytes"],
        kv_cache_one_sequence_ok=kv_ok,
        kv_cache_block_tokens=capacity["block_tokens"],
        kv_cache_sequences=capacity["sequences"],
        generation_waves=capacity["waves"],
    )
    # server mode: the pool is on its own devices; no budget (kv_cache_memory_bytes alone): nothing to check
    if m.backend == "trl_vllm" and cpu_plan is None and not m.server and m.budget is not None:
        free_at_start = m.budget - weights_bytes(s) - CUDA_CONTEXT_BYTES
        kv_info["vllm_startup_ok"] = free_at_start >= pool
    return kv_ok, kv_info


def _assumptions(cfg: Any, m: _Modelled, pool: int, single: dict[str, dict[str, int]], kv_info: dict) -> dict:
    """What the estimate assumed, for the table's notes and metrics.json's `estimate`."""
    s = m.s
    assumptions = {
        "device": m.device,
        "dtype_bytes": s.wb,
        "backend": m.backend,
        "backend_requested": cfg.backend.name,
        "logits_mode": m.logits_mode,
        "logits_mode_source": m.why_mode,
        "logits_mode_trl_version": trl_version(),  # the TRL version the logits term was chosen for
        "gradient_checkpointing": s.ckpt,
        "checkpointed_layers": checkpointed_layers(s),
        "checkpoints_offloaded": s.ckpt and s.ckpt_offload,
        "worst_case_lengths": "prompt = max_prompt_length, completion = max_seq_length - max_prompt_length",
        "prompt_tokens": s.P,
        "completion_tokens": s.C,
        "micro_batch_tokens": s.B * s.S,
        "generation_batch": s.G,
        "per_device_train_batch_size_counts": "completions (TRL 1.x); num_generations only groups them",
        "trainable_params": trainable_param_count(s),
        "full_finetune": s.full,
        "world_size": m.world,
        "strategy": m.strategy,
        "params": param_counts(s)["total"],
        "vllm_sleep": m.sleep if m.vllm else None,
        "vllm_mode": (cfg.backend.get("vllm_mode", "colocate") if m.vllm else None),
        # server mode: the server's pool on its own devices, outside the training budget
        "vllm_server_bytes": int(pool) if m.server else None,
        "vllm_tensor_parallel_size": int(cfg.backend.get("vllm_tensor_parallel_size", 1)) if m.server else None,
        "vllm_engine_settings": m.engine or None,  # backend.vllm_* as vLLM takes them (config/backends.py)
        "vllm_engine_resolved": m.vllm_engine or None,  # what vLLM's profile runs with (`vllm_engine`)
        **kv_info,
    }
    if m.world > 1:  # the same config in one process, to show what the ranks save
        one = max(single.values(), key=lambda c: sum(c.values()))
        assumptions["single_process_components"] = {k: int(v) for k, v in one.items()}
        assumptions["single_process_bytes"] = int(sum(one.values()))
        assumptions["ranks"] = (
            f"{m.world} ranks, {m.strategy}: every rank holds the same shares (rank 0 the rounding); "
            "the table is the largest rank"
        )
    if m.backend == "unsloth":
        assumptions["fast_inference"] = m.vllm
        assumptions["weights"] = (
            "shared with vLLM (inside vllm_pool)"
            if m.vllm
            else "backend.fast_inference=false: HF generation, no vLLM pool (weights on the card once)"
        )
    if cfg.backend.name == "auto" and m.device == "cuda" and m.backend == "trl":
        assumptions["backend_note"] = (
            "backend=auto resolved to trl because neither unsloth nor vllm is installed here; "
            "pass backend=trl_vllm or backend=unsloth to model vLLM colocate"
        )
    return assumptions


def estimate(cfg: Any, logits_mode: str | None = None, *, device: str | None = None, backend: str | None = None) -> Estimate:
    """Predict the peak for `cfg` (a composed train config). `logits_mode`: chunked | full | None
    (None: what the backend really does, see `default_logits_mode`). `device` ("cpu" | "cuda")
    overrides the target card's device, and `backend` the resolved backend, for a trial predicting
    the process it runs in.

    The peak is the larger phase on the largest rank; it fits when it leaves headroom on the card
    and vLLM (if any) can start: its KV cache holds one sequence, its share is free at start."""
    m = _modelled(cfg, logits_mode, device, backend)
    pool, cpu_plan = _vllm_pool(cfg, m)
    single = _single_process_phases(cfg, m, pool)
    phases = _rank_phases(m, single)  # rank_terms copies: `single` stays one process's
    peak_phase = max(phases, key=lambda p: sum(phases[p].values()))
    components = {k: int(v) for k, v in phases[peak_phase].items()}
    total = sum(components.values())
    headroom = None if m.budget is None else m.budget - total
    kv_ok, kv_info = _kv_cache(cfg, m, pool, cpu_plan)
    fits = headroom is None or (headroom >= 0 and kv_ok is not False and kv_info.get("vllm_startup_ok", True))
    return Estimate(
        components=components,
        total_bytes=total,
        budget_bytes=m.budget,
        headroom_bytes=headroom,
        fits=bool(fits),
        kv_cache_ok=kv_ok,
        assumptions=_assumptions(cfg, m, pool, single, kv_info),
        phases={p: int(sum(c.values())) for p, c in phases.items()},
        peak_phase=peak_phase,
    )


def waves_note(est: Estimate) -> str | None:
    """'generation runs in about N waves ...' when vLLM's KV cache holds fewer sequences than the
    generation batch (feasible, slower: memory/throughput.py charges the waves); else None."""
    a = est.assumptions
    waves = a.get("generation_waves")
    if not waves or waves <= 1:
        return None
    return (
        f"generation runs in about {waves} waves (vLLM's KV cache holds {a['kv_cache_sequences']} of the "
        f"{a['generation_batch']} max_seq_length sequences at once; its scheduler queues the rest)"
    )


def verdict(est: Estimate) -> str:
    dom = f"dominant: {est.dominant} ({est.components[est.dominant] / GiB:.2f} GiB)"
    if est.budget_bytes is None:
        return f"no budget (gpu.memory_gib is null): needs {est.total_bytes / GiB:.2f} GiB; {dom}"
    extra = ""
    if est.kv_cache_ok is False and est.assumptions.get("vllm_weights_bytes") is not None:
        extra = "; vLLM would refuse to start: its share leaves no KV cache for one max_seq_length sequence"
    elif est.kv_cache_ok is False:
        extra = "; vLLM would refuse to start: its KV cache cannot hold one max_seq_length sequence"
    elif note := waves_note(est):
        extra = "; " + note
    if est.assumptions.get("vllm_startup_ok") is False:
        extra += "; vLLM would refuse to start (free memory < gpu_memory_utilization x total)"
    headroom = est.headroom_bytes
    assert headroom is not None  # set whenever the budget is
    if headroom >= 0:
        word = "fits" if est.fits else "memory fits but"
        return f"{word} with {headroom / GiB:.2f} GiB headroom{extra}; {dom}"
    return f"short by {-headroom / GiB:.2f} GiB{extra}; {dom}"
