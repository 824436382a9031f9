"""The validated configuration: a typed schema for Hydra and the checks it cannot express.

Hydra's ConfigStore gives type checks (a string for `lora_rank` is rejected, unknown keys are
rejected). Ranges and cross-field rules (TRL's divisibility rule, prompt shorter than sequence)
live in :func:`validate`, which runs in the parent before any trial or model is started, so bad
input fails in a second with a message that names the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field

from omegaconf import MISSING

MODEL_SOURCES = ("random", "hub")
MODEL_INITS = ("random", "warm")
LOGGERS = ("none", "wandb")
FAULTS = (None, "raise", "signal", "hang", "hang_after_train", "oom", "bad_metrics", "slow")
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
    dequant_bandwidth_fraction: float | None = None
    microbatch_overhead_s: float | None = None
    step_overhead_s: float | None = None
    vllm_pool_s_per_gib: float | None = None
    eager_layer_s: float | None = None


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
    debug_fault: str | None = None  # fault injection for tests: one of FAULTS (trial/faults.py)
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
