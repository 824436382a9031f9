"""Load the policy model and its tokenizer from a `model/` config.

`source=random` builds the architecture from its numbers with random weights (real architectures
on machines without hub access); with `model.init=warm` (the embedded default, model=tiny) those
weights get a short supervised warm-up on the task's text first (warmup.py), so rewards vary.
`source=hub` is the real `from_pretrained` path used on GPU machines. Random weights with
`load_in_4bit` (and the vLLM and Unsloth backends, which load by path) go through a saved
checkpoint: see `materialize_random`; warm weights always load from theirs (`model_path`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..config.model_arch import GEMMA3_SLIDING_WINDOW

# transformers config classes by model_type; any model_type AutoConfig knows also works.
_EXTRA_CONFIG = {
    "gemma3_text": {"query_pre_attn_scalar": None, "sliding_window": GEMMA3_SLIDING_WINDOW},
}


def torch_dtype(cfg: Any, on_cuda: bool):
    import torch

    name = cfg.model.dtype
    if name == "auto":
        return torch.bfloat16 if on_cuda else torch.float32
    return getattr(torch, name)


def build_config(arch: Any, max_seq_length: int):
    """A transformers config for `arch` (a conf/model/*.yaml `arch` block)."""
    from transformers import AutoConfig

    extra = {k: v for k, v in _EXTRA_CONFIG.get(arch.model_type, {}).items()}
    if extra.get("query_pre_attn_scalar", 0) is None:
        extra["query_pre_attn_scalar"] = arch.head_dim
    return AutoConfig.for_model(
        arch.model_type,
        hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim,
        intermediate_size=arch.intermediate_size,
        vocab_size=arch.vocab_size,
        tie_word_embeddings=arch.tie_word_embeddings,
        max_position_embeddings=max(arch.max_position_embeddings, max_seq_length),
        **extra,
    )


def load_tokenizer(cfg: Any, corpus):
    """The hub tokenizer for hub models, else one trained locally on the task's text."""
    if cfg.model.tokenizer == "hub":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(cfg.model.hub_id)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return tok
    from .tokenizer import train_local_tokenizer

    return train_local_tokenizer(corpus, vocab_size=min(cfg.model.arch.vocab_size, 512))


def load_model(cfg: Any, tokenizer, *, on_cuda: bool, quantization_config=None, by_path: bool = False):
    """The policy model: random weights from `arch`, or the hub checkpoint.

    `by_path`: load random weights from their saved checkpoint so `model.name_or_path` points at
    real files (vLLM colocate loads its own copy from there). 4-bit always loads from a checkpoint:
    bitsandbytes quantises while loading, giving the same layers a hub model gets.

    Args:
        cfg: The composed train config.
        tokenizer: The trial's tokenizer.
        on_cuda: The trial runs on a CUDA device.
        quantization_config: BitsAndBytesConfig for 4-bit loading, or None.
        by_path: Load random weights from their saved checkpoint.

    Returns:
        The model.
    """
    from transformers import AutoModelForCausalLM

    # attn_implementation: a knob (levers.KINDS), transformers' from_pretrained/from_config argument
    attn = {"attn_implementation": cfg.attn_implementation} if cfg.get("attn_implementation") else {}
    if loads_from_checkpoint(cfg, quantized=quantization_config is not None, by_path=by_path):
        return AutoModelForCausalLM.from_pretrained(
            model_path(cfg, tokenizer, on_cuda=on_cuda),
            dtype=torch_dtype(cfg, on_cuda),
            quantization_config=quantization_config,
            device_map={"": 0} if on_cuda else None,
            **attn,
        )
    return build_random(cfg, tokenizer, on_cuda=on_cuda, **attn)


def is_warm(cfg: Any) -> bool:
    """model.init=warm on an architecture built from its numbers (a hub model is never warmed)."""
    return cfg.model.source == "random" and cfg.model.get("init", "random") == "warm"


def build_random(cfg: Any, tokenizer, *, on_cuda: bool, dtype=None, **attn):
    """The architecture in `cfg.model.arch` with random weights (seeded), on CUDA or CPU, in
    `dtype` (default: model.dtype's, models.torch_dtype).

    Args:
        cfg: The composed train config.
        tokenizer: The trial's tokenizer (its vocabulary and special tokens).
        on_cuda: Build on the CUDA device.
        dtype: The weights' dtype; None: model.dtype's.
        **attn: Attention settings passed to the model's config (attn_implementation).

    Returns:
        The model.
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = build_config(cfg.model.arch, cfg.max_seq_length)
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.bos_token_id = tokenizer.bos_token_id
    torch.manual_seed(cfg.seed)
    with torch.device("cuda" if on_cuda else "cpu"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype or torch_dtype(cfg, on_cuda), **attn)


def cache_root() -> Path:
    """$GRPO_SWEEP_CACHE, default ~/.cache/grpo-sweep: saved random and warm checkpoints."""
    return Path(os.environ.get("GRPO_SWEEP_CACHE", Path.home() / ".cache" / "grpo-sweep"))


def random_model_dir(cfg: Any, tokenizer, on_cuda: bool) -> Path:
    """Cache directory for a saved random-weight model: one per architecture, seed, dtype, vocabulary.

    Under $GRPO_SWEEP_CACHE (default ~/.cache/grpo-sweep), not the run directory: a sweep reuses
    one copy instead of writing a checkpoint per trial.

    Args:
        cfg: The composed train config.
        tokenizer: The trial's tokenizer.
        on_cuda: The trial runs on a CUDA device (the dtype follows it).

    Returns:
        The entry's folder.
    """
    from omegaconf import OmegaConf

    arch = cfg.model.arch
    arch = OmegaConf.to_container(arch, resolve=True) if OmegaConf.is_config(arch) else dict(arch)
    key = json.dumps(
        {
            "arch": arch,
            "seed": cfg.seed,
            "dtype": str(torch_dtype(cfg, on_cuda)),
            # Only what reaches the config: a longer max_seq_length changes max_position_embeddings.
            "positions": max(arch["max_position_embeddings"], cfg.max_seq_length),
            "vocab": sorted(tokenizer.get_vocab().items()),
            "special": [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id],
        },
        sort_keys=True,
        default=str,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "random-models" / f"{cfg.model.name}-{digest}"


def materialize_random(cfg: Any, tokenizer, *, on_cuda: bool) -> Path:
    """Save the random-weight model and its tokenizer as a checkpoint directory; return its path.

    Needed wherever a library loads weights by path rather than taking a model object: vLLM
    (TRL colocate builds `LLM(model=model.name_or_path)`), Unsloth's `from_pretrained`, and
    bitsandbytes 4-bit quantisation at load time. A cache entry (cache_entry.ensure): one builder,
    visible only when complete, so concurrent trials never read half a checkpoint.

    Args:
        cfg: The composed train config.
        tokenizer: The trial's tokenizer.
        on_cuda: The trial runs on a CUDA device.

    Returns:
        The checkpoint's folder.
    """
    from .cache_entry import ensure

    def write(tmp: Path) -> None:
        model = build_random(cfg, tokenizer, on_cuda=False)  # CPU: no GPU memory spent on a copy
        model.to(torch_dtype(cfg, on_cuda))
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return ensure(random_model_dir(cfg, tokenizer, on_cuda), write)


def loads_from_checkpoint(cfg: Any, *, quantized: bool, by_path: bool) -> bool:
    """Whether the policy loads from a checkpoint directory (hub, warm, or the saved random one)
    rather than being built in memory: the one rule load_model and prepare_checkpoint share.

    Args:
        cfg: The composed train config.
        quantized: The weights load in 4-bit.
        by_path: A loader needs the weights by path (vLLM, Unsloth).

    Returns:
        Whether a checkpoint is loaded.
    """
    return cfg.model.source == "hub" or quantized or by_path or is_warm(cfg)


def prepare_checkpoint(cfg: Any, *, on_cuda: bool, by_path: bool, log=print) -> str | None:
    """Build the cached checkpoint the trial's ranks will load (warm or random weights), here,
    before they start: one process, no process group (cache_entry says why a rank must not).
    None when the ranks load none of ours (a hub model, or random weights built in memory).

    Args:
        cfg: The composed train config.
        on_cuda: The trial runs on a CUDA device.
        by_path: A loader needs the weights by path.
        log: Prints a line about what happens.

    Returns:
        The checkpoint's folder, or None.
    """
    if cfg.model.source == "hub" or not loads_from_checkpoint(cfg, quantized=bool(cfg.load_in_4bit), by_path=by_path):
        return None
    from .tasks import get_task

    path = model_path(cfg, load_tokenizer(cfg, get_task(cfg).corpus()), on_cuda=on_cuda)
    log(f"[trial] model checkpoint for the ranks: {path}")
    return path


def model_path(cfg: Any, tokenizer, *, on_cuda: bool) -> str:
    """What to hand a loader that takes a name: the hub id, the warm checkpoint (model.init=warm,
    float32; loaders cast to their dtype) or the saved random-weight checkpoint.

    Args:
        cfg: The composed train config.
        tokenizer: The trial's tokenizer.
        on_cuda: The trial runs on a CUDA device.

    Returns:
        The name or folder.
    """
    if cfg.model.source == "hub":
        return cfg.model.hub_id
    if is_warm(cfg):
        import torch

        from .warmup import materialize_warm

        build = lambda: build_random(cfg, tokenizer, on_cuda=False, dtype=torch.float32)  # noqa: E731 - whatever the card
        return str(materialize_warm(cfg, tokenizer, build=build, root=cache_root()))
    return str(materialize_random(cfg, tokenizer, on_cuda=on_cuda))


def warmup_record(cfg: Any, tokenizer) -> dict | None:
    """What metrics.json keeps of the warm-up (steps, loss, seconds); None for other weights."""
    if not is_warm(cfg):
        return None
    from .warmup import warm_info

    return warm_info(Path(model_path(cfg, tokenizer, on_cuda=False)))
