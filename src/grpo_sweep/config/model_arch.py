"""A model's architecture numbers from its own config.json (`model=hub model.hub_id=<id or dir>`).

The estimator, the doctor and the trial read `model.arch` through `arch_of`: the numbers a
conf/model/*.yaml gives win; every one it leaves out (`model=hub` gives none) is read from the
model's config.json: `<hub_id>/config.json` for a local directory, else the hub's file through
huggingface_hub's cache (offline with HF_HUB_OFFLINE=1 once cached). Plain JSON, as transformers'
AutoConfig reads it, with its defaults: never imports torch or transformers, so `grpo-sweep
estimate` and the sweep's pre-screen stay light. Multimodal configs (Gemma 3 4B+) nest the language
model under `text_config`; `head_dim` defaults to hidden_size / num_attention_heads and
`num_key_value_heads` to num_attention_heads, as in transformers' Llama/Qwen2 configs.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .schema import ArchConfig, ConfigError
from .validate import check_fp32_head, check_lora_modules

ARCH_KEYS: tuple[str, ...] = tuple(ArchConfig.__dataclass_fields__)
REQUIRED = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
# transformers' config classes default tie_word_embeddings per family (Gemma: tied; Llama, Qwen2: not).
DEFAULT_POSITIONS = 131072  # when config.json does not say
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text")
# Gemma 3's local attention: a 512-token window, every 6th layer global (transformers Gemma3TextConfig:
# sliding_window=512, layer_types "sliding_attention" unless (i + 1) % 6 == 0).
GEMMA3_SLIDING_WINDOW = 512
GEMMA3_GLOBAL_EVERY = 6


def sliding_layers(family: str, layers: int) -> int:
    """How many of a model's decoder layers attend within a sliding window (Gemma 3: 5 of every 6)."""
    return layers - layers // GEMMA3_GLOBAL_EVERY if family == "gemma3" else 0


def config_json_path(hub_id: str) -> Path:
    """The model's config.json: in the directory `hub_id`, or fetched/cached from the hub."""
    local = Path(hub_id).expanduser()
    if local.is_dir():
        path = local / "config.json"
        if not path.is_file():
            raise ConfigError(f"model.hub_id={hub_id}: the directory holds no config.json")
        return path
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id=hub_id, filename="config.json"))
    except Exception as exc:  # noqa: BLE001 - offline, gated, unknown id: say what to do
        raise ConfigError(
            f"model.hub_id={hub_id}: could not read its config.json ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}). "
            "Give a local directory holding config.json, log in for a gated model (HF_TOKEN), "
            "or set the numbers with model.arch.*"
        ) from None


def arch_from_config(data: dict) -> dict[str, Any]:
    """ArchConfig's fields from a config.json's content (a language model's, or its text_config)."""
    text = data.get("text_config") or data
    missing = [k for k in REQUIRED if text.get(k) is None]
    if missing:
        raise ConfigError(f"config.json has no {', '.join(missing)} (model_type={text.get('model_type')}): set model.arch.*")
    model_type = str(text["model_type"])

    def number(key: str, default: int | None = None) -> int:
        """A size the file must give (no default), or one it may leave out or set to 0/null (the default)."""
        value = text[key] if default is None else (text.get(key) or default)
        return _positive_int(value, key, model_type)

    heads = number("num_attention_heads")
    hidden = number("hidden_size")
    tied = data.get("tie_word_embeddings", text.get("tie_word_embeddings"))
    return {
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": number("num_hidden_layers"),
        "num_attention_heads": heads,
        "num_key_value_heads": number("num_key_value_heads", heads),
        "head_dim": number("head_dim", hidden // heads),
        "intermediate_size": number("intermediate_size"),
        "vocab_size": number("vocab_size"),
        "tie_word_embeddings": bool(model_type in TIED_BY_DEFAULT if tied is None else tied),
        "max_position_embeddings": number("max_position_embeddings", DEFAULT_POSITIONS),
    }


def _positive_int(value: Any, key: str, model_type: str) -> int:
    """A config.json size as an integer >= 1 (a whole float such as 2048.0 too); anything else is
    refused in one line naming the key, so no ZeroDivisionError or int() error comes later.

    Args:
        value: The size as config.json states it.
        key: Its key, for the message.
        model_type: The model's type, for the message.

    Returns:
        The size as an int.
    """
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"config.json {key}={value!r} (model_type={model_type}): must be an integer >= 1; "
            f"fix the file or set model.arch.{key}"
        )
    return value


@functools.lru_cache(maxsize=32)
def _read(hub_id: str) -> dict[str, Any]:
    path = config_json_path(hub_id)
    try:
        return arch_from_config(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.hub_id={hub_id}: cannot read {path}: {exc}") from None


def arch_of(cfg: Any) -> DictConfig:
    """`cfg.model.arch` complete: what the config sets, the rest from the model's config.json."""
    arch = cfg.model.arch
    given = _given(cfg)
    if len(given) == len(ARCH_KEYS):
        return arch if isinstance(arch, DictConfig) else OmegaConf.create(dict(arch))
    if not cfg.model.get("hub_id"):
        absent = [k for k in ARCH_KEYS if k not in given]
        raise ConfigError(f"model.arch: {', '.join(absent)} missing and no model.hub_id to read a config.json from")
    return OmegaConf.create({**_read(str(cfg.model.hub_id)), **given})


def _given(cfg: Any) -> dict[str, Any]:
    """The architecture numbers the config itself sets (they win over config.json's)."""
    arch = cfg.model.arch
    return {k: arch[k] for k in ARCH_KEYS if k in arch and not OmegaConf.is_missing(arch, k)}


def fill_arch(cfg: Any) -> None:
    """Write the complete architecture into `cfg.model.arch` (so config.yaml records the numbers)."""
    full = arch_of(cfg)
    for key in ARCH_KEYS:
        cfg.model.arch[key] = full[key]


def cached_config_json(hub_id: str) -> Path | None:
    """The model's config.json when it is here without a download: in the directory `hub_id`, or
    in huggingface_hub's cache (`try_to_load_from_cache`); None otherwise (nothing is fetched)."""
    local = Path(hub_id).expanduser()
    if local.is_dir():
        path = local / "config.json"
        return path if path.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id=hub_id, filename="config.json")
    except Exception:  # noqa: BLE001 - not a valid repo id: the trial's download says why
        return None
    return Path(found) if isinstance(found, str) else None


def check_hub_lora_targets(cfg: Any) -> None:
    """`model=hub`: check lora_target_modules against the model_type its config.json names (the one
    table, schema.LORA_MODULES), and cast_lm_head_to_fp32 against its tied embeddings
    (validate.check_fp32_head), and its architecture numbers (arch_from_config: each present, an
    integer >= 1), before anything downloads, where that config.json is local or cached. A model
    whose config is not here yet is checked by PEFT and TRL when it loads."""
    arch = cfg.model.get("arch")
    if isinstance(arch, DictConfig) and "model_type" in arch and not OmegaConf.is_missing(arch, "model_type"):
        return  # given in the config: validate.validate checked it
    hub_id = cfg.model.get("hub_id")
    path = cached_config_json(str(hub_id)) if hub_id else None
    if path is None:
        return
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # unreadable: arch_of says so with its own message
    model_type = (data.get("text_config") or data).get("model_type")
    if model_type:
        check_lora_modules(cfg, model_type=str(model_type))
    # The numbers as arch_of reads them (the config's win): a missing or impossible one is refused
    # here, before anything loads.
    given = _given(cfg)
    text = {**(data.get("text_config") or data), **given}
    tied = bool({**arch_from_config({**data, "text_config": text}), **given}["tie_word_embeddings"])
    if model_type:
        check_fp32_head(cfg, tied=tied)
