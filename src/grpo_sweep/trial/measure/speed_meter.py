"""Measure a trial's speed: wall time and tokens per optimiser step, and the trainer's logs.

Memory is measured by memory_meter.MemoryMeter; StepMeter only reads its peak for the progress line.

Throughput counts prompt + completion tokens trained per second in steady state: the first step
(CUDA/kernel warm-up, lazy allocations) is excluded when more than one step ran. Where one generation
feeds several optimiser steps (TRL's num_iterations; steps_per_generation above the accumulation),
only the steps that generated count tokens: the steady state is then the whole generation cycles
after the first one, and a run whose only generation was its first step has no timed step
(`unmeasured`, the worker's status `failed`).

Early stop (trial.stop_below, set by the sweeper to a fraction of the best feasible throughput so
far): after the first timed step that comes once the peak is measured (`first_timed_step`: step 2
with worst-case lengths, after the CPU tracker's measuring steps when it stops early), a trial below
the threshold stops training; the worker then ends it with status `slow`, its peak and partial
throughput kept. It never stops before that step, so a stopped trial's peak is a real peak.
"""

from __future__ import annotations

import math
import statistics
import time

from transformers import TrainerCallback

from ...units import MIB

# Keys of TRL's GRPO logs we keep per step (TRL names on the left).
LOG_KEYS = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "reward": "reward",
    "reward_std": "reward_std",
    "kl": "kl",
    "entropy": "entropy",
    "completions/mean_length": "completion_length",
    "completions/max_length": "completion_length_max",
    # vLLM generated (TRL 1.16 _compute_loss, with its importance-sampling correction): the trainer/vLLM
    # log-prob gap and the ratio the loss is reweighted by; part of a trial's fingerprint (report/learning.py)
    "sampling/sampling_logp_difference/mean": "sampling_logp_diff",
    "sampling/importance_sampling_ratio/mean": "is_ratio",
}


def reward_change(rewards: list[float]) -> float:
    """Mean reward of the last quarter of steps minus the first quarter's (NaN under 2 steps)."""
    if len(rewards) < 2:
        return math.nan
    q = max(1, len(rewards) // 4)
    return statistics.fmean(rewards[-q:]) - statistics.fmean(rewards[:q])


class StepMeter(TrainerCallback):
    """Records one row per optimiser step and prints a progress line for it."""

    def __init__(
        self,
        total_steps: int,
        samples_per_step: int,
        memory_probe=None,
        on_step=None,
        tracking=None,
        stop_below: float | None = None,
        first_timed_step: int = 2,
        step_probe=None,
    ):
        """A meter for a run of `total_steps` steps.

        Args:
            total_steps: The steps the trial runs.
            samples_per_step: Completions per optimiser step.
            memory_probe: () -> (peak bytes, source); None: no memory column.
            on_step: Called with each step's row (the loggers); None: nothing.
            tracking: () -> whether the CPU tensor tracker slows this step; None: never.
            stop_below: Tokens/s under which training stops early; None: never.
            first_timed_step: The first step that may stop the trial (never before step 2).
            step_probe: () -> the step's own peak bytes (trial.soak); None: not recorded.
        """
        self.step_probe = step_probe  # () -> the step's own peak bytes (trial.soak); None: not recorded
        self.stop_below = stop_below  # tokens/s; None: never stop early
        self.first_timed_step = max(2, first_timed_step)  # never before the peak is measured
        self.stopped: str | None = None  # why training was stopped early (the worker's status `slow`)
        self.total_steps = total_steps
        self.tracking = tracking  # optional () -> bool: is the CPU tensor tracker slowing this step?
        self.samples_per_step = samples_per_step
        self.memory_probe = memory_probe  # () -> (peak_bytes, source)
        self.on_step = on_step  # optional hook(row) for loggers
        self.rows: list[dict] = []
        self._t0 = 0.0
        self._tokens0 = 0
        self._pending: dict = {}
        self.first_step_begin_unix: float | None = None  # for trial start latency (bench/)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.first_step_begin_unix is None:
            self.first_step_begin_unix = time.time()
        self._t0 = time.perf_counter()
        self._tokens0 = state.num_input_tokens_seen

    def on_step_end(self, args, state, control, **kwargs):
        self._pending = {
            "step": state.global_step,
            "step_time_s": time.perf_counter() - self._t0,
            "tokens": state.num_input_tokens_seen - self._tokens0,
            "samples": self.samples_per_step,
        }
        if self.tracking is not None:
            self._pending["tracked"] = bool(self.tracking())

    def on_log(self, args, state, control, logs=None, **kwargs):
        # Every optimiser step's log has its loss; the rewards only a step that generated (TRL reuses a
        # generation for num_iterations x steps_per_generation micro-steps). The end-of-training log has neither.
        if not self._pending or logs is None or ("loss" not in logs and "reward" not in logs):
            return
        row = dict(self._pending)
        self._pending = {}
        for trl_key, key in LOG_KEYS.items():
            if logs.get(trl_key) is not None:  # TRL logs None for a metric it could not compute
                row[key] = float(logs[trl_key])
        for key, value in logs.items():
            if key.startswith("rewards/") and key.endswith("/mean") and value is not None:
                row["reward/" + key.split("/")[1]] = float(value)
        row["tokens_per_s"] = row["tokens"] / row["step_time_s"] if row["step_time_s"] > 0 else 0.0
        if self.memory_probe is not None:
            row["peak_memory_bytes"] = self.memory_probe()[0]
        if self.step_probe is not None:
            row["step_peak_memory_bytes"] = self.step_probe()
        self.rows.append(row)
        print(
            f"[trial] step {row['step']}/{self.total_steps}  {row['step_time_s']:.2f} s  "
            f"{row['tokens_per_s']:.0f} tok/s  reward {row.get('reward', float('nan')):.3f}"
            + (f"  peak {row['peak_memory_bytes'] / MIB:.0f} MiB" if "peak_memory_bytes" in row else ""),
            flush=True,
        )
        if self.on_step is not None:
            self.on_step(row)
        reused = row["tokens"] == 0 and any(r["tokens"] for r in self.rows)  # trained a generation again
        if self.stop_below is not None and not self.stopped and row["step"] >= self.first_timed_step and not reused:
            if row["tokens_per_s"] < self.stop_below and row["step"] < self.total_steps:
                self.stopped = (
                    f"stopped early after step {row['step']}: {row['tokens_per_s']:.1f} tokens/s < "
                    f"trial.stop_below={self.stop_below:.1f}"
                )
                print(f"[trial] {self.stopped}", flush=True)
                control.should_training_stop = True

    def timed_rows(self) -> list[dict]:
        """The steady-state steps: every step after the first; where only some steps generate (their
        `tokens`), the whole generation cycles after the first cycle; none when only the first generated."""
        rows = self.rows
        if len(rows) <= 1:
            return rows
        starts = [i for i, r in enumerate(rows) if r.get("tokens")]
        if not starts or len(starts) == len(rows):
            return [r for r in rows[1:] if not r.get("tracked")] or rows[1:]
        if len(starts) < 2:
            return []
        size = starts[1] - starts[0]
        # the last cycle only when no whole one ran after the first
        cycles = [rows[i : i + size] for i in range(starts[1], len(rows) - size + 1, size)] or [rows[starts[1] :]]
        clean = [c for c in cycles if not any(r.get("tracked") for r in c)] or cycles
        return [r for c in clean for r in c]

    def unmeasured(self) -> str | None:
        """Why no step was timed (None when one was): only the untimed first step generated."""
        if len(self.rows) <= 1 or self.timed_rows():
            return None
        return (
            f"only step 1, the untimed warm-up, generated completions in its {len(self.rows)} steps (one generation "
            "feeds several optimiser steps: num_iterations or steps_per_generation): no timed step measured the "
            "throughput; raise trial.steps to cover a second generation"
        )

    def summary(self) -> dict:
        """Steady-state throughput over steps after the first (all steps when only one ran).

        Steps the CPU tensor tracker slowed (`tracked`) are left out when untracked ones exist (whole
        generation cycles of them: timed_rows); `throughput_tracked` says whether the throughput includes
        the tracker's overhead.
        """
        if not self.rows:
            return {"steps": 0}
        rows = self.timed_rows()
        if not rows:
            return {"steps": len(self.rows), "measured_steps": 0}
        time_s = sum(r["step_time_s"] for r in rows)
        tokens = sum(r["tokens"] for r in rows)
        samples = sum(r.get("samples", 0) for r in rows)
        rewards = [r["reward"] for r in self.rows if "reward" in r]
        stds = [r["reward_std"] for r in self.rows if "reward_std" in r]
        return {
            "steps": len(self.rows),
            "measured_steps": len(rows),
            "tokens_per_s": tokens / time_s if time_s > 0 else 0.0,
            "samples_per_s": samples / time_s if time_s > 0 else 0.0,
            "step_time_s": statistics.median(r["step_time_s"] for r in rows),
            "tokens_per_step": tokens / len(rows),
            "reward_mean": statistics.fmean(rewards) if rewards else math.nan,
            "reward_std": statistics.fmean(stds) if stds else math.nan,
            "reward_first": rewards[0] if rewards else math.nan,
            "reward_last": rewards[-1] if rewards else math.nan,
            "reward_change": reward_change(rewards),
            "throughput_tracked": any(r.get("tracked") for r in rows),
        }
