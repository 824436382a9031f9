"""What ran is what was logged: compare the levers asked for with the values the trainer runs.

Backends can rewrite a lever behind the user's back: Unsloth sets `per_device_train_batch_size`
to `num_generations` when the generation batch is not a multiple of it (unsloth#3572), TRL derives
the generation batch, a backend may drop LoRA targets it does not know. The worker reads the
built trainer back into `effective`; `lever_mismatch` lists every lever whose effective value
differs, as `{key: [requested, effective]}`, for metrics.json, the console and (through the
metrics record) W&B. A sweep must never credit a throughput to a configuration that did not run.
"""

from __future__ import annotations

import math
from typing import Any

# Levers a backend can change; compared when the backend reports an effective value (not None).
COMPARED = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "lora_rank",
    "load_in_4bit",
    "gpu_memory_utilization",
    "lora_target_modules",
    "max_seq_length",
)


def _same(requested: Any, effective: Any) -> bool:
    if isinstance(requested, float) or isinstance(effective, float):
        return math.isclose(float(requested), float(effective), rel_tol=1e-3, abs_tol=1e-6)
    if isinstance(requested, (list, tuple)) and isinstance(effective, (list, tuple)):
        return sorted(map(str, requested)) == sorted(map(str, effective))
    return requested == effective


def lever_mismatch(levers: dict, effective: dict, *, worst_case_lengths: bool = True) -> dict:
    """`{lever: [requested, effective]}` for every compared lever that did not run as asked.

    `max_seq_length` is compared only with worst-case lengths (prompts padded to
    max_prompt_length): otherwise the real prompts are shorter by design, not by a rewrite.

    Args:
        levers: The levers the trial asked for.
        effective: What the built trainer runs with.
        worst_case_lengths: Prompts are padded to max_prompt_length, so max_seq_length is compared.

    Returns:
        The levers that did not run as asked.
    """
    out = {}
    for key in COMPARED:
        if key not in levers or effective.get(key) is None:
            continue
        if key == "max_seq_length" and not worst_case_lengths:
            continue
        if not _same(levers[key], effective[key]):
            out[key] = [levers[key], effective[key]]
    return out


def format_mismatch(mismatch: dict) -> str:
    """One console line, e.g. `per_device_train_batch_size 2 -> 4`."""
    return ", ".join(f"{k} {req} -> {eff}" for k, (req, eff) in mismatch.items())
