"""Parse out-of-memory messages into numbers (bytes), for metrics.json and `grpo-sweep doctor`.

Covers PyTorch 2.x's CUDA message (and the simulated-device message the CPU tracker raises in
the same shape). The memory issue extends this to PyTorch 1.x and vLLM's start-up errors.
"""

from __future__ import annotations

import re

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = r"([\d.]+)\s*(B|KiB|MiB|GiB|TiB)"


def to_bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def parse_oom_message(text: str) -> dict:
    """Extract whatever sizes the message states; `deficit_bytes` = requested - free when both known."""
    flat = " ".join(text.split())
    out: dict = {}
    patterns = {
        "requested_bytes": r"Tried to allocate " + _SIZE,
        "total_bytes": r"total capacity of " + _SIZE,
        "free_bytes": r"of which " + _SIZE + r" is free",
    }
    for key, pattern in patterns.items():
        match = re.search(pattern, flat)
        if match:
            out[key] = to_bytes(*match.groups())
    if "requested_bytes" in out and "free_bytes" in out:
        out["deficit_bytes"] = max(out["requested_bytes"] - out["free_bytes"], 0)
    return out
