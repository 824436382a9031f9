"""Every patch grpo-sweep applies to TRL's trainer, each in the trial process only and on one trainer.

Each patch names the upstream version it targets and the condition for its removal.
tests/test_backends.py reads each target as the patch reads it, so an upgrade that moves one fails
there, in seconds. TRL's vLLM integration (trl.generation) is patched in vllm_patches.py, and
transformers in transformers_patches.py.
"""

from __future__ import annotations

from typing import Any


def time_generation(trainer) -> None:
    """Seconds of each call to TRL's `_generate_single_turn` (weight sync to vLLM + sampling, HF or
    vLLM), kept on the trainer for `trl.after_train` (metrics.json `generation_time_s`).

    Targets: TRL 1.16 `GRPOTrainer._generate_single_turn`, an instance method the trainer calls once
    per generation. Another TRL without it gets no generation timing. Remove once TRL logs its
    generation time per call."""
    import functools
    import time

    inner = getattr(trainer, "_generate_single_turn", None)
    if inner is None:  # another TRL version: no generation timing
        return
    trainer.grpo_sweep_generation_s = []

    @functools.wraps(inner)
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            trainer.grpo_sweep_generation_s.append(time.perf_counter() - started)

    trainer._generate_single_turn = timed


def phase_targets(trainer) -> list[tuple[Any, str, str]]:
    """The trainer's methods the CPU tensor tracker wraps to mark its phases (measure/tracker.py), as
    (owner, method name, phase). The tracker shadows each on this trainer only; a missing one leaves
    its phase reading `other`.

    Targets: TRL 1.16 `GRPOTrainer._generate_and_score_completions` and `compute_loss`; accelerate's
    `Accelerator.backward`; transformers 5.17 `Trainer._clip_grad_norm`. Remove once the trainer
    reports its phases to callbacks (TrainerCallback has no generation/forward/backward events)."""
    return [
        (trainer, "_generate_and_score_completions", "generation"),
        (trainer, "compute_loss", "forward"),
        (trainer.accelerator, "backward", "backward"),
        (trainer, "_clip_grad_norm", "optimiser"),
    ]
