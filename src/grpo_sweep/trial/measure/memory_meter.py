"""Measure and enforce a trial's memory: the budget, the peak, its breakdown and the phase it fell in.

CPU: the tensor tracker (tracker.py). CUDA: the allocator's peaks, a cap to the target card,
and the driver's view (NVML) of the whole process.
"""

from __future__ import annotations

import resource
import sys

from transformers import TrainerCallback

from ...units import KIB


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * KIB)


def cuda_peak_bytes() -> int:
    import torch

    return int(torch.cuda.max_memory_allocated())


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

    CPU: the tensor tracker (tracker.TensorTracker) measures (`memory_source: cpu-tracker`) and,
    with a budget, enforces it by raising a simulated CUDA OOM. Its overhead (~2.5x a tiny step)
    is paid only where needed: with a budget, or with `trial.worst_case_lengths=false` (lengths,
    hence the peak, vary step to step), it tracks every step, because an untracked step could
    neither OOM nor be measured; otherwise every step has the same shapes and it tracks the first
    `MEASURE_STEPS` (step 1 creates the optimiser state, step 2 runs with it: the steady-state
    peak) and then leaves, so the throughput steps run untracked. CUDA: the allocator is capped to the budget,
    the allocator's peaks (allocated, reserved) and NVML's process peak are recorded, and the phase
    in which the allocator's peak rose is read at every phase transition.
    """

    def __init__(self, cfg, on_cuda: bool, vllm: bool = False):
        """Set up the meter for the trial's device: the tracker on CPU, the capped allocator on CUDA.

        Args:
            cfg: The composed train config (its budget).
            on_cuda: The trial runs on a CUDA device.
            vllm: The trial holds a vLLM pool, charged to the card as one block on CPU.
        """
        from ...units import budget_bytes
        from .enforce import cap_cuda_process
        from .tracker import Phases, TensorTracker

        self.on_cuda = on_cuda
        self.budget = budget_bytes(cfg)
        # vLLM colocate on CPU: its share of the card (util x card) is gone for training, as on a GPU;
        # `charge_pool` adds what vLLM really allocated to the peak and its breakdown.
        self.vllm_share = None
        self.vllm_pool: int | None = None
        if vllm and not on_cuda and self.budget is not None:
            from ...memory.vllm import vllm_pool_bytes

            self.vllm_share = vllm_pool_bytes(cfg.gpu_memory_utilization, self.budget)
        self.phases = Phases()
        self.tracker = None
        self.track_steps: int | None = None  # None: every step (or no tracker)
        self.cap = None
        self.nvml = None
        self._cuda_peak_phase = None
        self._cuda_seen = 0
        # trial.soak: each step's own peak (step_peak). CUDA restarts the allocator's peak at each step,
        # so the trial's peak is kept here across the restarts.
        self.per_step = bool(cfg.trial.get("soak"))
        self._cuda_before = 0  # the allocator's peak before the last restart
        self._cuda_reserved_before = 0
        if on_cuda:
            import torch

            if self.budget is not None:
                self.cap = cap_cuda_process(self.budget)
            torch.cuda.reset_peak_memory_stats()
            self.phases.listeners.append(self._cuda_phase_ended)
            self.nvml = NvmlPeakSampler().start()
        else:
            import functools

            from .enforce import simulated_oom_error

            oom_error = functools.partial(simulated_oom_error, card=cfg.gpu.name)
            training_budget = self.budget
            if self.vllm_share is not None:
                training_budget = self.budget - self.vllm_share
                oom_error = functools.partial(_with_vllm_share, share=self.vllm_share, card=cfg.gpu.name)
            self.tracker = TensorTracker(training_budget, self.phases, oom_error)
            every_step = self.budget is not None or not cfg.trial.worst_case_lengths or self.per_step
            self.track_steps = None if every_step else MEASURE_STEPS

    def charge_pool(self, pool_bytes: int | None) -> None:
        """vLLM's pool as its engine allocated it (CPU): shown beside training in the peak's breakdown."""
        if self.tracker is not None and pool_bytes:
            self.vllm_pool = int(pool_bytes)

    def tracking(self) -> bool:
        return self.tracker is not None and getattr(self.tracker, "active", False)

    def callback(self):
        """A TrainerCallback that stops the tracker before the first step past the measuring ones, and
        (trial.soak) restarts the step's own peak at each step's start."""
        meter = self

        class _StopTracking(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                limit = meter.track_steps
                if limit is not None and state.global_step >= limit and meter.tracking():
                    meter.tracker.stop()
                if meter.per_step:
                    meter._restart_step_peak()

        return _StopTracking()

    def _restart_step_peak(self) -> None:
        if self.tracker is not None:
            self.tracker.step_peak = self.tracker.live
            return
        import torch

        self._cuda_before = max(self._cuda_before, cuda_peak_bytes())
        self._cuda_reserved_before = max(self._cuda_reserved_before, int(torch.cuda.max_memory_reserved()))
        torch.cuda.reset_peak_memory_stats()

    def step_peak(self) -> int:
        """The peak since the current step began (trial.soak; StepMeter's step_peak_memory_bytes)."""
        if self.tracker is not None:
            return self.tracker.step_peak + (self.vllm_pool or 0)
        return cuda_peak_bytes()

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
        return max(self._cuda_before, cuda_peak_bytes()), "cuda"

    def result(self, oom_text: str | None = None) -> dict:
        """The memory keys of metrics.json; given an OOM's message, its phase and parsed numbers."""
        from ...memory.oom_message import parse_oom_message
        from .enforce import capped_free_bytes

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
            if self.vllm_pool is not None:  # the card holds vLLM's pool beside the training tensors
                out["peak_memory_bytes"] += self.vllm_pool
                out["peak_memory_breakdown"]["vllm_pool"] = self.vllm_pool
            out["tracked_steps"] = "all" if self.track_steps is None else self.track_steps
        else:
            import torch

            self.phases.detach()
            self._cuda_phase_ended(self.phases.current)
            if self.nvml is not None:
                self.nvml.stop()
            peak = max(self._cuda_before, cuda_peak_bytes())  # across trial.soak's per-step restarts
            out.update(
                peak_memory_bytes=peak,
                peak_allocated_bytes=peak,
                peak_reserved_bytes=max(self._cuda_reserved_before, int(torch.cuda.max_memory_reserved())),
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


def _with_vllm_share(requested: int, live: int, budget: int, phase: str, *, share: int, card: str):
    """The simulated OOM as the whole card would report it: vLLM's share counts as in use.

    Args:
        requested: The allocation's bytes.
        live: Training's bytes in use.
        budget: Training's bytes (the card less vLLM's share).
        phase: The phase the allocation fell in.
        share: vLLM's share in bytes.
        card: The card's name.

    Returns:
        The simulated OOM.
    """
    from .enforce import simulated_oom_error

    return simulated_oom_error(requested, live + share, budget + share, phase, card=card)
