"""Backends translate the levers into a trainer. `auto` picks the fastest stack that is installed.

Order for `auto`: Unsloth (CUDA + unsloth installed), else TRL with vLLM colocate (CUDA + vllm),
else plain TRL. The choice is printed by the worker and recorded in metrics.json (`backend`).

| backend    | module        | generation                         | needs                      |
| ---------- | ------------- | ---------------------------------- | -------------------------- |
| `trl`      | trl.py        | HF `generate`                      | trl (CPU or CUDA)          |
| `trl_vllm` | trl_vllm.py   | vLLM colocate, same process        | CUDA, trl, vllm            |
| `unsloth`  | unsloth.py    | vLLM through Unsloth fast_inference | CUDA, unsloth, vllm        |
"""

from __future__ import annotations

import importlib
import importlib.util
import os

BACKEND_MODULES = {"trl": "trl", "trl_vllm": "trl_vllm", "unsloth": "unsloth"}
# pip extras that bring each backend's packages (pyproject.toml).
EXTRAS = {"trl_vllm": "vllm", "unsloth": "unsloth"}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def resolve_backend(name: str, cuda: bool) -> str:
    if name != "auto":
        return name
    if cuda and installed("unsloth") and installed("vllm"):
        return "unsloth"
    if cuda and installed("vllm"):
        return "trl_vllm"
    return "trl"


def get_backend(name: str):
    """The module implementing `build_trainer(cfg, ctx)` and `effective(trainer)` for `name`."""
    if name not in BACKEND_MODULES:
        raise ValueError(f"backend={name}: unknown (choose one of auto, {', '.join(BACKEND_MODULES)})")
    return importlib.import_module(f"{__name__}.{BACKEND_MODULES[name]}")


def missing_for(name: str, load_in_4bit: bool = False) -> list[str]:
    """Packages a backend needs that are not installed (checked before any model loads)."""
    need = {"trl": ["trl"], "trl_vllm": ["trl", "vllm"], "unsloth": ["unsloth", "vllm"]}.get(name, [])
    if load_in_4bit:
        need = [*need, "bitsandbytes"]
    return [m for m in need if not installed(m)]


def install_hint(name: str, missing: list[str] | None = None) -> str:
    """How to get a backend's packages: its pip extra, or the missing packages themselves."""
    extra = EXTRAS.get(name)
    if extra:
        return f"pip install -e '.[{extra}]'"
    return "pip install " + " ".join(missing or ["-e ."])


def start_method(backend_name: str, requested: str, cuda: bool) -> str:
    """The multiprocessing start method for a trial of `backend_name` (already resolved).

    `auto` (the default) is forkserver without CUDA: the server has imported transformers and TRL
    once (trial.PRELOAD), so later trials start in about a second. With CUDA it is spawn: those
    imports can initialise CUDA in the server (bitsandbytes does when peft imports it), and a
    process forked after that cannot use CUDA at all (seen on an H200: every trial failed with
    "Cannot re-initialize CUDA in forked subprocess"); a few seconds of imports are small next to
    a GPU trial. Unsloth must be imported *before* transformers/TRL/peft and queries the GPU on
    import, so its trials always spawn and import it first (`prepare_imports`).
    """
    if backend_name == "unsloth":
        return "spawn"
    if requested == "auto":
        return "spawn" if cuda else "forkserver"
    return requested


def prepare_imports(backend_name: str, cfg) -> None:
    """Run in the trial process before anything imports transformers/TRL (worker.main).

    Unsloth's standby mode (vLLM and training share the weights' memory; vLLM sleeps while
    training) is switched on by the environment variable UNSLOTH_VLLM_STANDBY=1, read when
    Unsloth is imported, so it is set here, before the import.
    """
    if backend_name != "unsloth":
        return
    if cfg.backend.unsloth_standby:
        os.environ["UNSLOTH_VLLM_STANDBY"] = "1"
    import unsloth  # noqa: F401  (must precede transformers/trl: it patches them on import)


__all__ = [
    "BACKEND_MODULES",
    "get_backend",
    "install_hint",
    "installed",
    "missing_for",
    "prepare_imports",
    "resolve_backend",
    "start_method",
]
