"""Imported before transformers and TRL in every trial process (trial.parent.PRELOAD,
backends.prepare_imports, vllm_serve): the map of import packages to distributions is read once per
install, not twice per interpreter.

transformers (`utils/import_utils.py`) and TRL (`import_utils.py`) each set `PACKAGE_DISTRIBUTION_MAPPING
= importlib.metadata.packages_distributions()` when imported. That call reads the RECORD of every
installed distribution (46,000 paths in this project's environment), about 0.4 s of CPU on a 2-core
machine, and every forkserver, spawned trial, rank and vLLM server imports both. The answer changes
only when a distribution is installed or removed, and that changes the modification time of the
sys.path directory that holds it. So importing this module makes `packages_distributions` answer
from this process's memory, or from a file under $GRPO_SWEEP_CACHE/package-map/ keyed by sys.path's
entries and their modification times. A file that cannot be read is computed again; one that cannot
be written is skipped.

Targets: transformers 5.17 and TRL 1.16 (`PACKAGE_DISTRIBUTION_MAPPING`, read by
tests/test_package_map.py). Remove once both look up the distributions they need by name.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
from pathlib import Path

from ..files import write_atomic
from .models import cache_root

STOCK = getattr(importlib.metadata.packages_distributions, "grpo_sweep_stock", importlib.metadata.packages_distributions)
SUBDIR = "package-map"
KEEP = 32
_memo: dict[str, dict[str, list[str]]] = {}


def key() -> str:
    """What the map depends on: the interpreter, and each sys.path entry with its modification time."""
    parts = [sys.version]
    for entry in sys.path:
        try:
            parts.append(f"{entry}\0{os.stat(entry or '.').st_mtime_ns}")
        except OSError:
            parts.append(f"{entry}\0-")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _valid(mapping) -> bool:
    return isinstance(mapping, dict) and all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(d, str) for d in v) for k, v in mapping.items()
    )


def _read(path: Path) -> dict[str, list[str]] | None:
    try:
        mapping = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return mapping if _valid(mapping) else None


def _write(path: Path, mapping: dict[str, list[str]]) -> None:
    """Whole or not at all (files.write_atomic); a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(mapping))
        _prune(path.parent)
    except OSError:
        pass


def _prune(folder: Path) -> None:
    """Keeps the KEEP newest entries: one is written per install and sys.path seen, never read again
    once either changes."""
    entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in entries[KEEP:]:
        old.unlink(missing_ok=True)


def packages_distributions() -> dict[str, list[str]]:
    """`importlib.metadata.packages_distributions()`, from memory, the cache file, or computed."""
    k = key()
    mapping = _memo.get(k)
    if mapping is None:
        path = cache_root() / SUBDIR / f"{k}.json"
        mapping = _read(path)
        if mapping is None:
            mapping = STOCK()
            _write(path, mapping)
        _memo[k] = mapping
    return {name: list(dists) for name, dists in mapping.items()}  # a caller's own copy, as the stock call gives


packages_distributions.grpo_sweep_stock = STOCK  # type: ignore[attr-defined]
importlib.metadata.packages_distributions = packages_distributions
