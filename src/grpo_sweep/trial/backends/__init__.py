"""Backends translate the levers into a trainer: one module per backend, each with
`build_trainer(cfg, ctx)` and `effective(trainer)`.

Which backends exist, what they need, where they run and how their trials start is the table in
grpo_sweep.config.backends (one copy, read by the schema and the estimator too); this package only
holds the implementations and the one thing that must happen before transformers is imported.
"""

from __future__ import annotations

import importlib
import os

from ...config import backends as table


def get_backend(name: str):
    """The module implementing `build_trainer(cfg, ctx)` and `effective(trainer)` for `name`."""
    return importlib.import_module(table.get(name).module)


def prepare_imports(backend_name: str, cfg) -> None:
    """Run in the trial process before anything imports transformers/TRL (worker.main).

    A backend that holds no vLLM pool loads TRL without vLLM (trial/without_vllm.py): the forkserver
    does it for its trials already, and so do a spawned trial (every trial on CUDA) and each rank of
    a multi-process trial here, which would otherwise spend ~3.7 s importing vLLM for nothing. The
    map of packages to distributions is read from the cache first (trial/package_map.py).

    Unsloth's standby mode (vLLM and training share the weights' memory; vLLM sleeps while
    training) is switched on by the environment variable UNSLOTH_VLLM_STANDBY=1, read when
    Unsloth is imported, so it is set here, before the import.
    """
    from .. import package_map  # noqa: F401  (transformers and TRL each map every distribution otherwise)

    if not table.runs_vllm(backend_name):
        from .. import without_vllm  # noqa: F401
    if backend_name != "unsloth":
        return
    if cfg.backend.unsloth_standby:
        os.environ["UNSLOTH_VLLM_STANDBY"] = "1"
    import unsloth  # noqa: F401  (must precede transformers/trl: it patches them on import)


__all__ = ["get_backend", "prepare_imports"]
