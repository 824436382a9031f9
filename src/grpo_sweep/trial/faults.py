"""Faults injected into a trial for tests only (`trial.debug_fault`, `trial.debug_perturb`).

Nothing here runs unless a test sets one of those keys: an OOM or a crash at a chosen point, a torn
metrics.json, a perturbed loss.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

SLOW_STEP_S = 1.0  # trial.debug_fault=slow: added to every optimiser step


def inject_fault(kind: str | None) -> None:
    """Debug faults for containment tests (trial.debug_fault); never set in real runs."""
    if kind == "raise":
        raise RuntimeError("debug_fault=raise: injected failure")
    if kind == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        print("[trial] debug_fault=hang: hanging until stopped", flush=True)
        while True:
            time.sleep(3600)
    if kind == "oom":
        import torch

        # A real allocator failure: far more bytes than any machine has.
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda" if torch.cuda.is_available() else "cpu")


def hang_after_training(kind: str | None, status: str) -> None:
    """trial.debug_fault=hang_after_train: the trial trained its steps and has its status (`status`),
    then hangs until stopped, with everything it started still up (a vLLM server); the trial's log
    says which status it reached, since the stop that follows overwrites it."""
    if kind != "hang_after_train":
        return
    print(f"[trial] debug_fault=hang_after_train: trained (status {status}), hanging until stopped", flush=True)
    while True:
        time.sleep(3600)


def fault_callbacks(kind: str | None) -> list:
    """trial.debug_fault=slow: every optimiser step takes SLOW_STEP_S longer, inside its timed window
    (after the StepMeter's start): a trial that is certainly slower than its neighbours, for tests of
    the sweep's early stop (hydra.sweeper.stop_below) that must not depend on this machine's noise."""
    if kind != "slow":
        return []
    from transformers import TrainerCallback

    class SlowSteps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            time.sleep(SLOW_STEP_S)

    return [SlowSteps()]


def perturb_callbacks(scale: float | None, seed: int) -> list:
    """+trial.debug_perturb=<scale> (a hidden test switch, config.validate.DEBUG_KEYS): before the first
    step, every trainable weight gets Gaussian noise of that standard deviation, drawn from its own
    generator (the trial's sampling stream is untouched). A deliberately non-neutral knob: the learning
    check (report/learning.py) must flag the trial that carries it."""
    if not scale:
        return []
    from transformers import TrainerCallback

    class Perturb(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            import torch

            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for param in model.parameters():
                    if param.requires_grad:
                        noise = torch.randn(param.shape, generator=generator, dtype=torch.float32) * scale
                        param.add_(noise.to(device=param.device, dtype=param.dtype))
            print(f"[trial] debug_perturb={scale}: trainable weights nudged", flush=True)

    return [Perturb()]


def tear_metrics(kind: str | None, run_dir: Path) -> None:
    """trial.debug_fault=bad_metrics: leave metrics.json torn (its first half), as a crash or a full
    disk mid-write would, after the trial's record was written (the parent calls it last)."""
    if kind != "bad_metrics":
        return
    from ..metrics import METRICS_FILE

    path = Path(run_dir) / METRICS_FILE
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    print(f"[trial] debug_fault=bad_metrics: {path} torn", flush=True)
