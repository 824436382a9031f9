"""Backends translate the levers into a trainer. `auto` picks the fastest stack that is installed.

Order for `auto`: Unsloth (CUDA + unsloth installed), else TRL with vLLM colocate (CUDA + vllm),
else plain TRL. The choice is printed by the worker and recorded in metrics.json.
"""

from __future__ import annotations

import importlib.util
from typing import Any


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def resolve_backend(name: str, cuda: bool) -> str:
    if name != "auto":
        return name
    if cuda and installed("unsloth"):
        return "unsloth"
    if cuda and installed("vllm"):
        return "trl_vllm"
    return "trl"


def get_backend(name: str):
    """The module implementing `build_trainer(cfg, ctx)` and `effective(trainer)` for `name`."""
    from . import trl as trl_backend

    if name == "trl":
        return trl_backend
    raise ValueError(f"backend={name}: not available in this build (choose trl or auto)")


def missing_for(name: str) -> list[str]:
    """Packages a backend needs that are not installed (checked before any model loads)."""
    need = {"trl": ["trl"], "trl_vllm": ["trl", "vllm"], "unsloth": ["unsloth", "vllm"]}.get(name, [])
    return [m for m in need if not installed(m)]


__all__ = ["resolve_backend", "get_backend", "missing_for", "installed", "Any"]
