"""The training phase's activation terms of the estimate (memory/estimator.py): what autograd saves
per token and layer, the logits computation, the inputs, and the generation buffers of HF
`generate` and transformers' continuous batching. Pure arithmetic on the Shapes, like the estimator;
each function's docstring names its source."""

from __future__ import annotations

from typing import Any

from ..config.model_arch import sliding_layers
from .shapes import Shapes

# TRL 1.16 trl/trainer/utils.py `_CHUNKED_LOGPROB_CHUNK_SIZE` (vocabulary columns per tile) and
# trl/kernels/chunked_logprob.py `TOKEN_CHUNK_SIZE` (tokens per tile).
VOCAB_TILE = 32768
TOKEN_TILE = 4096


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

    Args:
        s: The model's and the run's shapes.
        first: The first decoder layer (its input comes from the embeddings).
        masked: SDPA gets an explicit mask (`masked_layers`): K and V are saved expanded to the query heads.

    Returns:
        Bytes per token.
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
    batch's own KV cache, as HF generate's (the pool would be a share of the host's RAM).

    Args:
        cfg: The composed train config.
        s: The model's and the run's shapes.
        budget: The card's usable bytes, or None.
        resident: Bytes resident when generation starts.

    Returns:
        The paged cache's bytes.
    """
    if budget is None:
        return hf_generation_bytes(s)
    extra = (cfg.trial.get("grpo_config") or {}).get("transformers_continuous_batching_config") or {}
    percent = extra.get("max_memory_percent") or CONTINUOUS_BATCHING_MEMORY_PERCENT
    return int(max(budget - resident, 0) * percent)
