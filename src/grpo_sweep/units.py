"""Units and the one conversion from a card's `gpu.memory_gib` to bytes (the bottom layer: no imports)."""

from __future__ import annotations

from typing import Any

KIB = 2**10
MIB = 2**20
GIB = 2**30
TIB = 2**40


def gib_to_bytes(gib: float | None) -> int | None:
    """GiB (as `conf/gpu/*.yaml` and torch's "total capacity" state them) to whole bytes; None stays None."""
    return None if gib is None else int(float(gib) * GIB)


def budget_bytes(cfg: Any) -> int | None:
    """The target card's usable bytes (`gpu.memory_gib`), or None when it is null (no budget).

    The one place this conversion lives: the estimator, the trial's enforcement, the sweeper's
    pre-screen and the report all call it, so a budget is the same number everywhere.
    """
    gpu = cfg["gpu"] if isinstance(cfg, dict) else getattr(cfg, "gpu", None)
    if gpu is None:
        return None
    gib = gpu.get("memory_gib") if hasattr(gpu, "get") else getattr(gpu, "memory_gib", None)
    return gib_to_bytes(gib)


def format_size(nbytes: float) -> str:
    """PyTorch's CUDA allocator formatting (2 decimals, KiB/MiB/GiB), never bare bytes."""
    if nbytes < MIB:
        return f"{nbytes / KIB:.2f} KiB"
    if nbytes < GIB:
        return f"{nbytes / MIB:.2f} MiB"
    return f"{nbytes / GIB:.2f} GiB"
