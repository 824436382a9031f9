"""The split of completions_per_step across micro-batches, accumulation and processes: the one rule.

`split_of(cfg)` gives (per_device_train_batch_size, gradient_accumulation_steps) as TRL runs them;
every memory term, the sweeper and the export read it here.
"""

from __future__ import annotations

from typing import Any

from omegaconf import open_dict, read_write

from .schema import ConfigError


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
