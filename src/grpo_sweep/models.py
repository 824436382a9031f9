"""Load the policy model and its tokenizer from a `model/` config.

`source=random` builds the architecture from its numbers with random weights (the embedded
default, and real architectures on machines without hub access); `source=hub` is the real
`from_pretrained` path used on GPU machines.
"""

from __future__ import annotations

from typing import Any

# transformers config classes by model_type; any model_type AutoConfig knows also works.
_EXTRA_CONFIG = {
    "gemma3_text": {"query_pre_attn_scalar": None, "sliding_window": 512},
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


def load_model(cfg: Any, tokenizer, *, on_cuda: bool, quantization_config=None):
    """The policy model: random weights from `arch`, or the hub checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch_dtype(cfg, on_cuda)
    if cfg.model.source == "hub":
        return AutoModelForCausalLM.from_pretrained(
            cfg.model.hub_id,
            dtype=dtype,
            quantization_config=quantization_config,
            device_map={"": 0} if on_cuda else None,
        )
    config = build_config(cfg.model.arch, cfg.max_seq_length)
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.bos_token_id = tokenizer.bos_token_id
    torch.manual_seed(cfg.seed)
    with torch.device("cuda" if on_cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if quantization_config is not None:
        raise NotImplementedError("4-bit quantisation of a random-weight model: use model.source=hub")
    return model
