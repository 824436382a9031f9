"""metrics.json: the one record a trial leaves, read by the sweeper, W&B, the report and the doctor."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

STATUSES = ("ok", "oom", "failed", "timeout")
METRICS_FILE = "metrics.json"
REQUIRED_KEYS = (
    "status", "error", "levers", "effective", "steps", "tokens_per_s", "samples_per_s", "step_time_s",
    "reward_mean", "reward_std", "peak_memory_bytes", "memory_source", "trainable_params", "device",
    "backend", "versions", "lever_mismatch",
)
# Memory truth (issue 3): the peak by category and phase, the enforced budget, an OOM's numbers.
MEMORY_KEYS = (
    "peak_memory_breakdown", "peak_phase", "budget_bytes", "simulated_device",
    "oom_phase", "requested_bytes", "free_bytes", "deficit_bytes",
)
REQUIRED_KEYS = REQUIRED_KEYS + MEMORY_KEYS


def empty_metrics(status: str, error: str | None, levers: dict) -> dict:
    """A record with every required key, for trials that ended before measuring anything."""
    record: dict[str, Any] = {key: None for key in REQUIRED_KEYS}
    record.update(status=status, error=error, levers=levers, effective={}, steps=0, lever_mismatch={})
    return record


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_metrics(run_dir: Path, record: dict) -> Path:
    """Write atomically (tmp + rename) so a reader never sees half a file."""
    path = Path(run_dir) / METRICS_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(record), indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def read_metrics(run_dir: Path) -> dict | None:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "trl", "transformers", "peft", "vllm", "unsloth", "bitsandbytes"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            if name in ("torch", "trl", "transformers", "peft"):
                out[name] = None
    return out
