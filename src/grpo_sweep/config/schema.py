"""The validated configuration: a typed schema for Hydra and the checks it cannot express.

Hydra's ConfigStore gives type checks (a string for `lora_rank` is rejected, unknown keys are
rejected). Ranges and cross-field rules (TRL's divisibility rule, prompt shorter than sequence)
live in :func:`validate`, which runs in the parent before any trial or model is started, so bad
input fails in a second with a message that names the key and what is allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from . import backends

MODEL_SOURCES = ("random", "hub")
LOGGERS = ("none", "wandb")
FAULTS = (None, "raise", "signal", "hang", "oom")
START_METHODS = ("auto", "forkserver", "spawn")


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the key and what is allowed."""


@dataclass
class ArchConfig:
    """Architecture numbers: enough to build a random-weight model and to estimate memory."""

    model_type: str = MISSING  # transformers' model_type: llama, qwen2, gemma3_text
    hidden_size: int = MISSING
    num_hidden_layers: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    head_dim: int = MISSING
    intermediate_size: int = MISSING
    vocab_size: int = MISSING
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 131072


@dataclass
class ModelConfig:
    name: str = MISSING
    source: str = "random"  # random: built from `arch` with random weights; hub: from_pretrained(hub_id)
    hub_id: str | None = None
    tokenizer: str = "local"  # local: trained on the task text with `tokenizers`; hub: from hub_id
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    arch: ArchConfig = field(default_factory=ArchConfig)


@dataclass
class GpuConfig:
    name: str = "cpu"
    memory_gib: float | None = None  # usable memory as the driver reports it; None: no budget
    simulated: bool = False
    # Peak dense bf16 TFLOP/s and memory bandwidth (GB/s) from the datasheet: the throughput model's
    # only card facts (memory.throughput). A card without them cannot be ranked for speed.
    tflops_bf16: float | None = None
    bandwidth_gbs: float | None = None


@dataclass
class BackendConfig:
    name: str = "auto"
    vllm_enable_sleep_mode: bool = False
    unsloth_standby: bool = False


@dataclass
class TaskConfig:
    # The task class, chosen by config (conf/task/*.yaml): a grpo_sweep.trial.tasks.base.Task subclass.
    _target_: str = "grpo_sweep.trial.tasks.arithmetic.ArithmeticTask"
    name: str = "arithmetic"
    num_prompts: int = 512
    max_operand: int = 99
    dataset: str | None = None  # hub dataset id, for hub tasks
    split: str = "train"


@dataclass
class LoggerConfig:
    name: str = "none"
    project: str = "grpo-sweep"
    entity: str | None = None
    mode: str = "auto"  # auto: online when an API key is configured, else offline
    group: str | None = None
    tags: list = field(default_factory=list)
    init_timeout_s: float = 30.0  # an unreachable W&B server falls back to offline after this long


@dataclass
class TrialConfig:
    steps: int = 3  # optimiser steps; the first is warm-up and is excluded from throughput
    timeout_s: float = 600.0
    worst_case_lengths: bool = True  # prompts at max_prompt_length, completions at the full budget
    start_method: str = "auto"  # forkserver on CPU, spawn with CUDA (backends.start_method)
    # CPU trials: torch intra-op threads. 1 by default: the tiny model's ops are too small to gain from
    # threads, and on a shared or loaded machine OpenMP threads contend (measured on 2 cores under
    # load: 0.11 s per step with 1 thread, 2-3 s with 2). null: torch's default (all cores).
    cpu_threads: int | None = 1
    debug_fault: str | None = None  # fault injection for tests: raise | signal | hang | oom
    study: str | None = None  # set by the sweeper: the Optuna study (W&B group)
    number: int | None = None  # set by the sweeper: the Optuna trial number


@dataclass
class TrainConfig:
    # The seven levers (levers.py) plus their companions, named as users type them.
    max_seq_length: int = 96
    gpu_memory_utilization: float = 0.6
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    num_generations: int = 4
    lora_rank: int = 16
    load_in_4bit: bool = False
    lora_target_modules: list = field(default_factory=lambda: ["q_proj", "v_proj"])
    lora_alpha: int | None = None  # None: 2 x lora_rank
    max_prompt_length: int = 32
    gradient_checkpointing: bool = False
    learning_rate: float = 5e-6
    beta: float = 0.0  # KL coefficient; 0 loads no reference model (TRL's default)
    seed: int = 0
    objective: str = "tokens_per_s"

    model: ModelConfig = field(default_factory=ModelConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    trial: TrialConfig = field(default_factory=TrialConfig)


def register() -> None:
    """Register the schema so conf/train.yaml can list `train_schema` first in its defaults."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def _positive(cfg: Any, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    if value is None or value <= 0:
        raise ConfigError(f"{key}={value}: must be a positive number (> 0)")


def _one_of(cfg: Any, key: str, allowed: tuple) -> None:
    value = OmegaConf.select(cfg, key)
    if value not in allowed:
        shown = ", ".join("null" if a is None else str(a) for a in allowed)
        raise ConfigError(f"{key}={value}: must be one of {shown}")


def generation_batch_size(cfg: Any) -> int:
    """Completions generated per optimiser step, as TRL derives it (steps_per_generation = grad-accum)."""
    return cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps


def validate(cfg: DictConfig, *, cuda: bool | None = None, installed: Callable[[str], bool] | None = None) -> DictConfig:
    """Check ranges and cross-field rules; raise ConfigError naming the key. Returns cfg unchanged.

    Pure: it knows nothing about this machine. The facts about where the trial will run are passed
    in: `cuda` (None: skip the CUDA-only rules) and `installed(package)` (None: skip the package
    check). `config.local.validate_here` passes this machine's facts; the estimator and the doctor
    pass the target card's (CUDA for a real card) and no package check.
    """
    for key in (
        "max_seq_length",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "lora_rank",
        "max_prompt_length",
        "trial.steps",
        "trial.timeout_s",
        "task.num_prompts",
    ):
        _positive(cfg, key)
    if cfg.lora_alpha is not None:
        _positive(cfg, "lora_alpha")
    if cfg.trial.get("cpu_threads") is not None:
        _positive(cfg, "trial.cpu_threads")
    _positive(cfg, "logger.init_timeout_s")
    if not 0.0 < cfg.gpu_memory_utilization < 1.0:
        raise ConfigError(f"gpu_memory_utilization={cfg.gpu_memory_utilization}: must be strictly between 0 and 1")
    if cfg.num_generations < 2:
        raise ConfigError(f"num_generations={cfg.num_generations}: must be >= 2 (GRPO needs a group to compare)")
    gen_batch = generation_batch_size(cfg)
    if gen_batch % cfg.num_generations:
        divisors = [n for n in range(2, gen_batch + 1) if gen_batch % n == 0]
        raise ConfigError(
            f"num_generations={cfg.num_generations} does not divide the generation batch "
            f"per_device_train_batch_size x gradient_accumulation_steps = {gen_batch} (TRL's rule); "
            f"allowed num_generations here: {divisors or 'none: raise the batch'}"
        )
    if cfg.max_prompt_length >= cfg.max_seq_length:
        raise ConfigError(
            f"max_prompt_length={cfg.max_prompt_length} must be < max_seq_length={cfg.max_seq_length} "
            "(max_seq_length is prompt + completion; the completion budget is the difference)"
        )
    if not cfg.lora_target_modules:
        raise ConfigError("lora_target_modules: must name at least one module (e.g. [q_proj, v_proj])")
    _one_of(cfg, "backend.name", backends.NAMES)
    _one_of(cfg, "model.source", MODEL_SOURCES)
    _one_of(cfg, "model.tokenizer", ("local", "hub"))
    _one_of(cfg, "model.dtype", ("auto", "float32", "bfloat16", "float16"))
    _one_of(cfg, "logger.name", LOGGERS)
    _one_of(cfg, "logger.mode", ("auto", "online", "offline", "disabled"))
    _one_of(cfg, "trial.debug_fault", FAULTS)
    _one_of(cfg, "trial.start_method", START_METHODS)
    if cfg.model.source == "hub" and not cfg.model.hub_id:
        raise ConfigError(f"model.hub_id: required when model.source=hub (model={cfg.model.name})")
    if cfg.model.tokenizer == "hub" and not cfg.model.hub_id:
        raise ConfigError(f"model.tokenizer=hub needs model.hub_id (model={cfg.model.name})")
    if cfg.gpu.memory_gib is not None and cfg.gpu.memory_gib <= 0:
        raise ConfigError(f"gpu.memory_gib={cfg.gpu.memory_gib}: must be > 0, or null for no budget")

    needs_cuda = []
    if cfg.load_in_4bit:
        needs_cuda.append("load_in_4bit=true (bitsandbytes 4-bit kernels run on CUDA only)")
    backend = cfg.backend.name
    if backend in backends.BACKENDS and backends.BACKENDS[backend].cuda_only:
        needs_cuda.append(f"backend={backend} (it runs on CUDA only)")
    if backend == "trl_vllm" and cfg.backend.get("vllm_enable_sleep_mode") and cuda is False:
        raise ConfigError(
            "backend.vllm_enable_sleep_mode=true: vLLM's CPU build refuses sleep mode "
            '("Sleep mode is not supported on current platform"); use false on CPU'
        )
    missing = []
    if installed is not None and backend in backends.BACKENDS:
        missing = [p for p in backends.packages_for(backend, cfg.load_in_4bit) if not installed(p)]
    elif installed is not None and cfg.load_in_4bit and not installed("bitsandbytes"):
        missing = ["bitsandbytes"]
    if needs_cuda and cuda is False:
        raise ConfigError(
            "; ".join(needs_cuda)
            + ": no CUDA device is available here"
            + (f" (and not installed: {', '.join(missing)})" if missing else "")
            + ". Use load_in_4bit=false and backend=trl (or auto) on CPU."
        )
    if missing:
        raise ConfigError(
            f"backend={backend}"
            + (" with load_in_4bit=true" if cfg.load_in_4bit else "")
            + f" needs packages that are not installed: {', '.join(missing)} "
            f"(on a CUDA machine: {backends.install_hint(backend, missing)}; or choose backend=trl or auto)"
        )
    return cfg
