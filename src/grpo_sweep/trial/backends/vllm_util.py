"""vLLM's `gpu_memory_utilization` on an emulated card; a free port for a vLLM process to listen on.

vLLM reserves `gpu_memory_utilization x total_memory` of the *physical* card up front. When a
sweep emulates a smaller target card (`gpu=l4_24g` on an H100), the same lever value would hand
vLLM far more bytes than the target card has, so the value passed to vLLM is rescaled to reserve
the bytes the target card would reserve: util x target_bytes / actual_bytes. The lever recorded in
metrics.json stays in target-card terms (see `target_equivalent`).

The utilisation functions are pure on purpose (no torch import): tested on CPU; the CUDA total is
passed in.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from ...units import budget_bytes


def rescale_utilization(util: float, target_bytes: float | None, actual_bytes: float | None) -> float:
    """The fraction of the physical card that reserves what `util` reserves on the target card.

    No rescale without a target, or when the target is not smaller than the card (a budget can
    only shrink what vLLM gets: emulating a bigger card than the one present is not possible).

    Args:
        util: gpu_memory_utilization on the target card.
        target_bytes: The target card's bytes, or None.
        actual_bytes: The physical card's bytes, or None.

    Returns:
        The fraction of the physical card.
    """
    if not target_bytes or not actual_bytes or target_bytes >= actual_bytes:
        return float(util)
    return float(util) * float(target_bytes) / float(actual_bytes)


def target_equivalent(device_util: float, target_bytes: float | None, actual_bytes: float | None) -> float:
    """Inverse of `rescale_utilization`: the lever value a device-level fraction stands for.

    Args:
        device_util: A fraction of the physical card.
        target_bytes: The target card's bytes, or None.
        actual_bytes: The physical card's bytes, or None.

    Returns:
        The fraction of the target card.
    """
    if not target_bytes or not actual_bytes or target_bytes >= actual_bytes:
        return float(device_util)
    return float(device_util) * float(actual_bytes) / float(target_bytes)


def cuda_total_bytes() -> int | None:
    """Total memory of CUDA device 0 as torch reports it (None without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(0).total_memory)


def device_utilization(cfg: Any, actual_bytes: float | None = None) -> float:
    """The `gpu_memory_utilization` to hand vLLM on this machine for `cfg`'s target card."""
    actual = cuda_total_bytes() if actual_bytes is None else actual_bytes
    return rescale_utilization(cfg.gpu_memory_utilization, budget_bytes(cfg), actual)


def engine_utilization(llm: Any) -> float | None:
    """The fraction a built vLLM engine really reserved (read back from its cache config)."""
    for path in (
        ("llm_engine", "vllm_config", "cache_config", "gpu_memory_utilization"),
        ("llm_engine", "cache_config", "gpu_memory_utilization"),
    ):
        obj = llm
        for name in path:
            obj = getattr(obj, name, None)
            if obj is None:
                break
        if isinstance(obj, (int, float)):
            return float(obj)
    return None


def free_port() -> int:
    """A TCP port nobody listens on now, from the kernel's ephemeral range (bind to port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def own_rendezvous_port(environ: Any = os.environ) -> str | None:
    """Give a one-process colocate trial a torch.distributed rendezvous port of its own.

    vLLM in colocate mode joins a process group of one (TRL sets RANK/WORLD_SIZE, vLLM's
    external_launcher opens a TCPStore on MASTER_ADDR:MASTER_PORT). Without MASTER_PORT, TRL's
    `ensure_master_addr_port` takes the first of 29500, 23456, ... that is free *when it looks*: two
    trials starting together on one host (joblib's parallel trials, several sweep workers, one per
    card) both take 29500 and the later one fails with EADDRINUSE; a MASTER_PORT exported in the
    shell that started the sweep does the same. So a trial that is a world of one takes a port from
    the ephemeral range whatever it inherited; the ranks of a multi-process trial run under torchrun
    (TORCHELASTIC_RUN_ID set) and keep the port torchrun gave them. Returns the port set, or None."""
    if environ.get("TORCHELASTIC_RUN_ID"):
        return None
    environ["MASTER_PORT"] = str(free_port())
    return environ["MASTER_PORT"]
