"""A trial's shapes from its config, and the parameter counts and bytes they imply.

`shapes(cfg, backend)` reads the model's `arch` numbers and the levers once; every memory and speed
term reads a `Shapes`. Pure arithmetic: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import backends
from ..config.model_arch import GEMMA3_SLIDING_WINDOW, arch_of
from ..config.split import split_of
from ..units import MIB as MiB

# CUDA context + cuBLAS/cuDNN workspaces: outside PyTorch's allocator but inside the card's total
# capacity. 300-600 MiB on recent drivers (CUDA 12, torch 2.x); we take 512 MiB.
CUDA_CONTEXT_BYTES = 512 * MiB


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
    """The model's and the run's shapes the estimator and the throughput model read.

    Args:
        cfg: The composed train config.
        backend: The resolved backend.
        device: "cpu" or "cuda"; None: the target card's.

    Returns:
        The Shapes.
    """
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
        sliding_window=GEMMA3_SLIDING_WINDOW if family == "gemma3" else None,
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


def kv_bytes_per_token(s: Shapes, kv_bytes: int = 2) -> int:
    """K and V for every layer: 2 x L x num_kv_heads x head_dim x dtype bytes."""
    return 2 * s.L * s.kd * kv_bytes
