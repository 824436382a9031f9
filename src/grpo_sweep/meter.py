"""Measure a trial: wall time and tokens per optimiser step, the trainer's logs, and peak memory.

Throughput counts prompt + completion tokens trained per second in steady state: the first step
(CUDA/kernel warm-up, lazy allocations) is excluded when more than one step ran.
"""

from __future__ import annotations

import math
import resource
import statistics
import sys
import time

from transformers import TrainerCallback

# Keys of TRL's GRPO logs we keep per step (TRL names on the left).
LOG_KEYS = {
    "loss": "loss",
    "reward": "reward",
    "reward_std": "reward_std",
    "kl": "kl",
    "entropy": "entropy",
    "completions/mean_length": "completion_length",
}


class StepMeter(TrainerCallback):
    """Records one row per optimiser step and prints a progress line for it."""

    def __init__(self, total_steps: int, samples_per_step: int, memory_probe=None, on_step=None, tracking=None):
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
        if not self._pending or logs is None or "reward" not in logs:
            return
        row = dict(self._pending)
        self._pending = {}
        for trl_key, key in LOG_KEYS.items():
            if trl_key in logs:
                row[key] = float(logs[trl_key])
        for key, value in logs.items():
            if key.startswith("rewards/") and key.endswith("/mean"):
                row["reward/" + key.split("/")[1]] = float(value)
        row["tokens_per_s"] = row["tokens"] / row["step_time_s"] if row["step_time_s"] > 0 else 0.0
        if self.memory_probe is not None:
            row["peak_memory_bytes"] = self.memory_probe()[0]
        self.rows.append(row)
        print(
            f"[trial] step {row['step']}/{self.total_steps}  {row['step_time_s']:.2f} s  "
            f"{row['tokens_per_s']:.0f} tok/s  reward {row.get('reward', float('nan')):.3f}"
            + (f"  peak {row['peak_memory_bytes'] / 2**20:.0f} MiB" if "peak_memory_bytes" in row else ""),
            flush=True,
        )
        if self.on_step is not None:
            self.on_step(row)

    def summary(self) -> dict:
        """Steady-state throughput over steps after the first (all steps when only one ran).

        Steps the CPU tensor tracker slowed (`tracked`) are left out when untracked ones exist;
        `throughput_tracked` says whether the throughput includes the tracker's overhead.
        """
        rows = self.rows[1:] if len(self.rows) > 1 else self.rows
        if not rows:
            return {"steps": 0}
        clean = [r for r in rows if not r.get("tracked")]
        rows = clean or rows
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
            "_measured_time_s": time_s,
            "throughput_tracked": any(r.get("tracked") for r in rows),
        }


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def cuda_peak_bytes() -> int:
    import torch

    return int(torch.cuda.max_memory_allocated())


def memory_probe(on_cuda: bool):
    """The peak-memory reader for this device: the CUDA allocator's peak, or the process's peak RSS."""
    if on_cuda:
        return lambda: (cuda_peak_bytes(), "cuda")
    return lambda: (peak_rss_bytes(), "cpu-rss")


class NvmlPeakSampler:
    """Peak GPU memory of this process and its children as the driver sees it, sampled on a thread.

    WHY: the allocator's peak misses the CUDA context, cuBLAS workspaces and vLLM's pool when vLLM
    allocates outside PyTorch; NVML sees all of it. When NVML cannot attribute memory to our pids
    (containers with their own pid namespace), the device's used memory is sampled instead and
    `source` says so. Does nothing when nvidia-ml-py is not importable or no GPU is visible.
    """

    def __init__(self, interval_s: float = 0.05, device_index: int = 0):
        self.interval_s, self.device_index = interval_s, device_index
        self.peak_bytes: int | None = None
        self.source: str | None = None
        self._stop = None
        self._thread = None

    def start(self) -> NvmlPeakSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = _nvml_handle(pynvml, self.device_index)
        except Exception:  # noqa: BLE001 - no NVML, no driver, no GPU: nothing to sample
            return self
        import threading

        self._nvml = pynvml
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-peak", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> tuple[int, str]:
        import os

        import psutil

        nvml = self._nvml
        me = psutil.Process(os.getpid())
        pids = {me.pid, *(child.pid for child in me.children(recursive=True))}
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        ours = [p.usedGpuMemory for p in procs if p.pid in pids and p.usedGpuMemory is not None]
        if ours:
            return int(sum(ours)), "nvml-process"
        return int(nvml.nvmlDeviceGetMemoryInfo(self._handle).used), "nvml-device"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                used, source = self._sample()
            except Exception:  # noqa: BLE001 - a failed sample is skipped, not fatal
                used, source = None, None
            if used is not None and (self.peak_bytes is None or used > self.peak_bytes):
                self.peak_bytes, self.source = used, source
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=2)
            self._thread = None


MEASURE_STEPS = 2  # tracked steps when the tracker need not run on every step


def _nvml_handle(pynvml, device_index: int):
    """NVML's handle for torch's CUDA device (NVML ignores CUDA_VISIBLE_DEVICES: match by UUID)."""
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
    except Exception:  # noqa: BLE001 - older torch without .uuid, MIG: fall back to the index
        return pynvml.nvmlDeviceGetHandleByIndex(device_index)


class MemoryMeter:
    """Everything memory for one trial: the budget, how it is enforced, the peak and its breakdown.

    CPU: the tensor tracker (memtracker.TensorTracker) measures (`memory_source: cpu-tracker`) and,
    with a budget, enforces it by raising a simulated CUDA OOM. Its overhead (~2.5x a tiny step)
    is paid only where needed: with a budget, or with `trial.worst_case_lengths=false` (lengths,
    hence the peak, vary step to step), it tracks every step, because an untracked step could
    neither OOM nor be measured; otherwise every step has the same shapes and it tracks the first
    `MEASURE_STEPS` (step 1 creates the optimiser state, step 2 runs with it: the steady-state
    peak) and then leaves, so the throughput steps run untracked. CUDA: the allocator is capped to the budget,
    the allocator's peaks (allocated, reserved) and NVML's process peak are recorded, and the phase
    in which the allocator's peak rose is read at every phase transition.
    """

    def __init__(self, cfg, on_cuda: bool):
        from .budget import budget_bytes, cap_cuda_process
        from .memtracker import Phases, TensorTracker

        self.on_cuda = on_cuda
        self.budget = budget_bytes(cfg)
        self.phases = Phases()
        self.tracker = None
        self.track_steps: int | None = None  # None: every step (or no tracker)
        self.cap = None
        self.nvml = None
        self._cuda_peak_phase = None
        self._cuda_seen = 0
        if on_cuda:
            import torch

            if self.budget is not None:
                self.cap = cap_cuda_process(self.budget)
            torch.cuda.reset_peak_memory_stats()
            self.phases.listeners.append(self._cuda_phase_ended)
            self.nvml = NvmlPeakSampler().start()
        else:
            import functools

            from .budget import simulated_oom_error

            self.tracker = TensorTracker(
                self.budget, self.phases, functools.partial(simulated_oom_error, card=cfg.gpu.name)
            )
            every_step = self.budget is not None or not cfg.trial.worst_case_lengths
            self.track_steps = None if every_step else MEASURE_STEPS

    def tracking(self) -> bool:
        return self.tracker is not None and getattr(self.tracker, "active", False)

    def callback(self):
        """A TrainerCallback that stops the tracker before the first step past the measuring ones."""
        meter = self

        class _StopTracking(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                limit = meter.track_steps
                if limit is not None and state.global_step >= limit and meter.tracking():
                    meter.tracker.stop()

        return _StopTracking()

    @property
    def simulated(self) -> bool:
        return self.tracker is not None and self.budget is not None

    def _cuda_phase_ended(self, phase: str) -> None:
        peak = cuda_peak_bytes()
        if peak > self._cuda_seen:
            self._cuda_seen, self._cuda_peak_phase = peak, phase

    def attach(self, trainer) -> None:
        if self.tracker is not None:
            self.tracker.attach(trainer)  # also marks the phases
        else:
            self.phases.attach(trainer)

    def running(self):
        """Context for `trainer.train()`: the tracker's dispatch mode on CPU, nothing on CUDA."""
        import contextlib

        return self.tracker if self.tracker is not None else contextlib.nullcontext()

    def probe(self) -> tuple[int, str]:
        """(peak bytes so far, source): the per-step reader StepMeter prints."""
        if self.tracker is not None:
            return self.tracker.peak, "cpu-tracker"
        return cuda_peak_bytes(), "cuda"

    def result(self, oom_text: str | None = None) -> dict:
        """The memory keys of metrics.json; given an OOM's message, its phase and parsed numbers."""
        from .budget import capped_free_bytes
        from .oom_message import parse_oom_message

        out = {
            "budget_bytes": self.budget,
            "simulated_device": self.simulated,
            "peak_rss_bytes": peak_rss_bytes(),
            "peak_memory_breakdown": None,
            "peak_phase": None,
        }
        if self.tracker is not None:
            self.tracker.detach()
            out.update(self.tracker.result(), memory_source="cpu-tracker")
            out["tracked_steps"] = "all" if self.track_steps is None else self.track_steps
        else:
            import torch

            self.phases.detach()
            self._cuda_phase_ended(self.phases.current)
            if self.nvml is not None:
                self.nvml.stop()
            out.update(
                peak_memory_bytes=cuda_peak_bytes(),
                peak_allocated_bytes=cuda_peak_bytes(),
                peak_reserved_bytes=int(torch.cuda.max_memory_reserved()),
                peak_phase=self._cuda_peak_phase,
                nvml_peak_bytes=self.nvml.peak_bytes if self.nvml else None,
                nvml_source=self.nvml.source if self.nvml else None,
                memory_cap=self.cap,
                memory_source="cuda",
            )
        if oom_text is not None:
            parsed = parse_oom_message(oom_text)
            refused = self.tracker.oom if self.tracker is not None else None
            out["oom_phase"] = refused["phase"] if refused else self.phases.oom_phase()
            capped_free = capped_free_bytes(oom_text)
            if capped_free is not None:  # CUDA under a fraction cap: free on the target, not the real card
                parsed["free_bytes"] = capped_free
                if "requested_bytes" in parsed:
                    parsed["deficit_bytes"] = max(parsed["requested_bytes"] - capped_free, 0)
            for key in ("requested_bytes", "free_bytes", "deficit_bytes"):
                out[key] = parsed.get(key)
        return out
