"""A `trl grpo --config` YAML (or a GRPOConfig's fields) as the recipe: Hydra overrides, read exactly.

Each setting is mapped to the lever or config key it sets (MAPPED, and the few read together below),
ignored because it says how a run is logged or saved rather than what it learns or holds in memory
(MEASURING), or passed on to the trainer as `trial.grpo_config.<field>` when it is another GRPOConfig
field of the installed TRL. Anything else is refused in one line naming it. Pure of torch and TRL:
the names TRL takes come from trl_fields.json (scripts/trl_fields.py regenerates it from the wheels).
"""

from __future__ import annotations

import enum
import functools
import importlib.metadata
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .schema import ConfigError, TrainConfig

FIELDS_FILE = Path(__file__).with_name("trl_fields.json")
# Newer TRL name -> the name an older TRL takes for the same setting.
RENAMES = {
    "dtype": "torch_dtype",
    "log_unique_prompts": "wandb_log_unique_prompts",
    "vllm_structured_outputs_regex": "vllm_guided_decoding_regex",
}
# `trl grpo` setting -> the config key it sets (the same meaning, the same value).
MAPPED = {
    **{
        k: k
        for k in (
            "num_generations",
            "max_prompt_length",
            "gradient_checkpointing",
            "optim",
            "torch_compile",
            "torch_empty_cache_steps",
            "pad_to_multiple_of",
            "use_transformers_continuous_batching",
            "cast_lm_head_to_fp32",
            "learning_rate",
            "beta",
            "loss_type",
            "vllm_importance_sampling_correction",
            "seed",
            "steps_per_generation",
            "ds3_gather_for_generation",
            "attn_implementation",
            "load_in_4bit",
            "lora_alpha",
            "lora_target_modules",
        )
    },
    "lora_r": "lora_rank",
    "vllm_gpu_memory_utilization": "gpu_memory_utilization",
    "vllm_mode": "backend.vllm_mode",
    "dtype": "model.dtype",
    "torch_dtype": "model.dtype",
    "dataset_train_split": "task.split",
    "reward_funcs": "task.reward_funcs",
    "reward_weights": "task.reward_weights",
}
# Read together with others below (the batch split, the lengths, the model, the data, the adapter).
READ_BELOW = {
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_completion_length",
    "gradient_checkpointing_kwargs",
    "model_name_or_path",
    "dataset_name",
    "datasets",
    "use_peft",
    "use_vllm",
    "dataset_config",
}
# How a run is logged, saved, evaluated or placed: the sweep sets these itself for each trial.
MEASURING = {
    "output_dir",
    "overwrite_output_dir",
    "max_steps",
    "num_train_epochs",
    "logging_steps",
    "logging_strategy",
    "logging_first_step",
    "logging_dir",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "save_only_model",
    "report_to",
    "run_name",
    "push_to_hub",
    "hub_model_id",
    "hub_strategy",
    "hub_private_repo",
    "disable_tqdm",
    "log_completions",
    "num_completions_to_print",
    "eval_strategy",
    "eval_steps",
    "per_device_eval_batch_size",
    "do_train",
    "do_eval",
    "bf16",
    "fp16",
    "tf32",
    "use_cpu",
    "dataloader_num_workers",
    "shuffle_dataset",
    "generation_batch_size",
    "dataset_test_split",
    "model_revision",
    "use_bnb_nested_quant",
    "bnb_4bit_quant_storage",
}
# Accepted only at the value grpo-sweep trains with (trial/backends/trl.py).
FIXED = {"lora_dropout": 0.0, "lora_task_type": "CAUSAL_LM", "bnb_4bit_quant_type": "nf4", "trust_remote_code": False}
# The `trl` launcher's own keys (TRL's CLI docs, docs/source/clis.md): processes, and accelerate's profiles
# that are one of trial.strategy's (a path to an accelerate config, fsdp1/fsdp2 and zero1 are refused).
LAUNCHER = {"num_processes": "trial.num_processes", "accelerate_config": "trial.strategy"}
ACCELERATE_PROFILES = {"single_gpu": "ddp", "multi_gpu": "ddp", "zero2": "zero2", "zero3": "zero3"}
# The gradient_checkpointing_kwargs keys that are levers; use_reentrant is the backend's choice.
CHECKPOINTING_KWARGS = {"every_n_layers": "gradient_checkpointing_every_n_layers", "offload": "gradient_checkpointing_offload"}


@functools.lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(FIELDS_FILE.read_text())


def versions() -> list[str]:
    """The TRL versions whose names are recorded (major.minor)."""
    return sorted(_table())


def source(version: str) -> str:
    """Where the names of TRL `version` were read from."""
    return str(_table()[version]["source"]) if version in _table() else "?"


def installed_version() -> str | None:
    """The installed TRL's major.minor, read from its metadata (TRL is not imported)."""
    try:
        return ".".join(importlib.metadata.version("trl").split(".")[:2])
    except importlib.metadata.PackageNotFoundError:
        return None


def fields(version: str, *, grpo_only: bool = False) -> set[str]:
    """The setting names `trl grpo --config` takes in TRL `version` (GRPOConfig's with grpo_only)."""
    table = _table().get(version)
    if table is None:
        raise ConfigError(f"TRL {version}: no field list recorded (recorded: {', '.join(versions())}); run scripts/trl_fields.py")
    classes = ("GRPOConfig", "TrainingArguments") if grpo_only else [k for k in table if k != "source"]
    return {name for cls in classes for name in table[cls]}


def adapt(settings: dict, version: str, *, grpo_only: bool = False, known: set[str] | None = None) -> tuple[dict, list[str]]:
    """`settings` with the names TRL `version` takes (or the names `known`): a renamed field under its
    name there, a field it lacks dropped; one note for each change.

    Args:
        settings: GRPOConfig fields by name.
        version: The TRL version the settings are for.
        grpo_only: Only GRPOConfig's fields (TrainingArguments' included), not ModelConfig's or the script's.
        known: The field names to keep; None: the fields of TRL `version`.

    Returns:
        (the adapted settings, one note per change).
    """
    known = fields(version, grpo_only=grpo_only) if known is None else known
    back = {old: new for new, old in RENAMES.items()}
    out, notes = {}, []
    for key, value in settings.items():
        if key in known:
            out[key] = value
        elif RENAMES.get(key) in known or back.get(key) in known:
            name = RENAMES.get(key) if RENAMES.get(key) in known else back[key]
            out[name] = value
            notes.append(f"{key}: named {name} in TRL {version}")
        else:
            notes.append(f"{key}={value!r}: dropped, TRL {version} has no such setting")
    return out, notes


def value_text(value: Any) -> str:
    """A Python value in Hydra's override grammar (an enum, such as transformers' OptimizerNames, by its value)."""
    value = value.value if isinstance(value, enum.Enum) else value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{value_text(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./:\-]+", text) and text not in ("null", "true", "false"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def to_overrides(settings: dict, where: str, *, version: str | None = None) -> list[str]:
    """Hydra overrides for `trl grpo` settings (a YAML's keys, or a GRPOConfig's fields). Refuses a
    setting it cannot map, in one line naming it and what to do.

    Args:
        settings: The `trl grpo` settings by name.
        where: The source's name, for an error.
        version: The TRL version they are for; None: the installed one.

    Returns:
        The Hydra overrides.
    """
    version = version or installed_version() or "?"
    known = fields(version) if version in _table() else None  # a TRL without a recorded list: passed on unchecked
    grpo_known = fields(version, grpo_only=True) if version in _table() else set()
    out: dict[str, Any] = {}
    s = {k: v for k, v in settings.items() if v is not None or k in MAPPED}

    def refuse(key: str, why: str) -> ConfigError:
        return ConfigError(f"{where}: {key}={s.get(key)!r}: {why}")

    for key, value in s.items():
        if key in MAPPED or key in READ_BELOW or key in MEASURING:
            continue
        if key in LAUNCHER:
            if key == "accelerate_config" and value not in ACCELERATE_PROFILES:
                raise refuse(key, f"grpo-sweep takes the profiles {', '.join(ACCELERATE_PROFILES)}; else give trial.strategy")
            out[LAUNCHER[key]] = ACCELERATE_PROFILES.get(value, value) if key == "accelerate_config" else value
            continue
        if key in FIXED:
            if value != FIXED[key]:
                raise refuse(key, f"grpo-sweep trains with {key}={FIXED[key]!r}; set it so, or remove it")
        elif key in grpo_known:
            out[f"++trial.grpo_config.{key}"] = value  # another GRPOConfig field: the trainer gets it as given
        elif known is not None and key in known:
            raise refuse(key, "a `trl grpo` setting grpo-sweep cannot map; remove it, or give its effect in overrides=[...]")
        else:
            raise refuse(
                key,
                f"not a `trl grpo` setting of TRL {version} (ModelConfig, GRPOConfig, script or dataset arguments); "
                "check its spelling, or remove it",
            )
    for key, target in MAPPED.items():
        if key in s:
            out[target] = list(s[key]) if isinstance(s[key], tuple) else s[key]
    if "model_name_or_path" in s:
        out["model"] = "hub"
        out["model.hub_id"] = s["model_name_or_path"]
    out.update(_dataset_overrides(s, refuse))
    if s.get("use_peft") is False:
        out["trial.full_finetune"] = True
    if s.get("use_vllm"):
        out["backend"] = "trl_vllm"
    batch, accum = s.get("per_device_train_batch_size"), s.get("gradient_accumulation_steps")
    if batch is not None:
        # the effective batch is the recipe; its split into micro-batch x accumulation is a knob
        out["completions_per_step"] = int(batch) * int(accum or 1)
        out["per_device_train_batch_size"] = int(batch)
        out["gradient_accumulation_steps"] = None
    elif accum is not None:
        raise refuse("gradient_accumulation_steps", "given without per_device_train_batch_size; give both")
    if s.get("max_completion_length") is not None:
        prompt = int(s.get("max_prompt_length") or TrainConfig.max_prompt_length)
        out["max_prompt_length"] = prompt
        out["max_seq_length"] = prompt + int(s["max_completion_length"])
    if s.get("steps_per_generation") is not None and s.get("steps_per_generation") == accum:
        out["steps_per_generation"] = None  # TRL's own default (the accumulation), so it follows the split
    for key, value in (s.get("gradient_checkpointing_kwargs") or {}).items():
        if key in CHECKPOINTING_KWARGS:
            out[CHECKPOINTING_KWARGS[key]] = value
        elif key != "use_reentrant":
            raise refuse(
                "gradient_checkpointing_kwargs", f"{key}: not a setting grpo-sweep maps ({', '.join(CHECKPOINTING_KWARGS)})"
            )
    return [f"{k}={value_text(v)}" for k, v in out.items()]


def _dataset_overrides(s: dict, refuse: Callable[[str, str], ConfigError]) -> dict[str, Any]:
    """`datasets` or `dataset_name` -> the dataset task: one dataset, by its files or its path."""
    datasets = s.get("datasets") or []
    if len(datasets) > 1:
        raise refuse("datasets", "a mixture of several datasets; give one (grpo-sweep measures one task)")
    if datasets and s.get("dataset_name"):
        raise refuse("datasets", "both datasets and dataset_name; give one")
    if s.get("dataset_config"):
        raise refuse(
            "dataset_config", "a dataset configuration name is not supported; give its files as datasets: [{path, data_files}]"
        )
    if not (datasets or s.get("dataset_name")):
        return {}
    entry = datasets[0] if datasets else {"path": s["dataset_name"]}
    out = {"task": "dataset", "task.path": entry.get("data_files") or entry.get("path")}
    if entry.get("split"):
        out["task.split"] = entry["split"]
    return out


def read(path: str | Path) -> list[str]:
    """A `trl grpo --config` YAML file as Hydra overrides."""
    import yaml

    file = Path(path).expanduser()
    where = f"trl_config={path}"
    try:
        settings = yaml.safe_load(file.read_text())
    except OSError as err:
        raise ConfigError(f"{where}: cannot be read ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(settings, dict):
        raise ConfigError(f"{where}: a mapping of `trl grpo` settings is needed, not a {type(settings).__name__}")
    return to_overrides(settings, where)


def expand(argv: list[str]) -> list[str]:
    """argv with each `trl_config=PATH` replaced by its overrides, which come first: the ones after
    it on the command line win."""
    given = [a for a in argv if a.startswith("trl_config=")]
    rest = [a for a in argv if not a.startswith("trl_config=")]
    return [o for a in given for o in read(a.split("=", 1)[1])] + rest
