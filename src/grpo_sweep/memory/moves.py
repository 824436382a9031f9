"""The doctor's candidate moves: each a set of overrides on one lever (or more hardware), with the
label the report prints. memory/doctor.py scores them and picks the smallest set that fits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from ..config.split import processes_of, split_of
from ..levers import RECIPE, kind_of
from . import estimator as est_mod


@dataclass
class Move:
    group: str
    overrides: dict
    label: str
    # More hardware (GPUs for the ranks, a GPU for vLLM): offered only when no change on one card fits
    needs_hardware: bool = False

    @property
    def changes_experiment(self) -> bool:
        """Whether the move changes the recipe (what is learned: levers.KINDS), not only a knob."""
        return any(kind_of(key) == RECIPE for key in self.overrides)


def with_overrides(cfg: Any, overrides: dict):
    new = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    for key, value in overrides.items():
        OmegaConf.update(new, key, value, merge=False)
    return new


def candidate_moves(cfg: Any, backend: str, device: str) -> list[Move]:
    """Every move of the levers the doctor may weigh from `cfg` (the search picks among them).

    Args:
        cfg: The composed train config.
        backend: The resolved backend.
        device: "cpu" or "cuda".

    Returns:
        The moves.
    """
    moves: list[Move] = []
    if not cfg.gradient_checkpointing and backend != "unsloth":
        moves.append(Move("checkpointing", {"gradient_checkpointing": True}, "gradient checkpointing on"))
    B, GA = split_of(cfg)
    factor = 2
    while B // factor >= 1 and B % factor == 0:
        moves.append(
            Move(
                "micro_batch",
                {"per_device_train_batch_size": B // factor, "gradient_accumulation_steps": GA * factor},
                f"micro-batch {B} -> {B // factor} (grad-accum x{factor}: same generation batch)",
            )
        )
        factor *= 2
    if device == "cuda" and not cfg.load_in_4bit:
        moves.append(Move("4bit", {"load_in_4bit": True}, "4-bit NF4 base weights"))
    moves += vllm_share_moves(cfg, backend)
    moves += hardware_moves(cfg, backend, device)
    if cfg.lora_rank >= 8:
        moves.append(Move("rank", {"lora_rank": cfg.lora_rank // 2}, f"LoRA rank {cfg.lora_rank} -> {cfg.lora_rank // 2}"))
    completion = cfg.max_seq_length - cfg.max_prompt_length
    if completion >= 32:
        shorter = cfg.max_prompt_length + completion // 2
        moves.append(
            Move(
                "sequence",
                {"max_seq_length": shorter},
                f"max_seq_length {cfg.max_seq_length} -> {shorter} (halves the completion budget)",
            )
        )
    return moves


def vllm_share_moves(cfg: Any, backend: str) -> list[Move]:
    """vLLM's share of the card, moved: up to the least share that holds one max_seq_length sequence
    when vLLM cannot start, else down as far as the whole batch, and as far as one sequence, still fits."""
    if not (est_mod.generates_with_vllm(cfg, backend) and cfg.gpu.get("memory_gib")):
        return []
    moves: list[Move] = []
    if est_mod.estimate(cfg).kv_cache_ok is False:
        # vLLM's KV cache cannot hold ONE max_seq_length sequence: vLLM refuses to start, so the fix
        # is a larger share (never merely to hold the whole batch: that is speed, `speed_advice`).
        util = round(cfg.gpu_memory_utilization + 0.05, 2)
        while util <= 0.95:
            if est_mod.estimate(with_overrides(cfg, {"gpu_memory_utilization": util})).kv_cache_ok:
                moves.append(
                    Move(
                        "vllm_share",
                        {"gpu_memory_utilization": util},
                        f"vLLM share {cfg.gpu_memory_utilization} -> {util} (room for one max_seq_length sequence)",
                    )
                )
                break
            util = round(util + 0.05, 2)
        return moves
    # Lower the share: as far as the whole batch still fits at once (no speed cost), and as far
    # as one sequence fits (feasible; generation then runs in waves, which the score charges).
    util = round(cfg.gpu_memory_utilization - 0.05, 2)
    whole = one = None
    while util >= 0.1:
        e = est_mod.estimate(with_overrides(cfg, {"gpu_memory_utilization": util}))
        if not e.kv_cache_ok:
            break
        one = util
        if (e.assumptions.get("generation_waves") or 1) <= 1:
            whole = util
        util = round(util - 0.05, 2)
    if whole is not None:
        moves.append(
            Move(
                "vllm_share",
                {"gpu_memory_utilization": whole},
                f"vLLM share {cfg.gpu_memory_utilization} -> {whole} (KV cache still holds the batch)",
            )
        )
    if one is not None and one != whole:
        moves.append(
            Move(
                "vllm_share",
                {"gpu_memory_utilization": one},
                f"vLLM share {cfg.gpu_memory_utilization} -> {one} (KV cache holds one sequence: generation in waves)",
            )
        )
    return moves


def hardware_moves(cfg: Any, backend: str, device: str) -> list[Move]:
    """On a card (CUDA): spread the trial over N GPUs with FSDP (parameters, gradients and optimiser
    state sharded: the estimator's largest rank), or move vLLM off the training card to its own GPU
    (backend.vllm_mode=server). Offered only when nothing on one card fits (docs/multi-gpu.md).

    Args:
        cfg: The composed train config.
        backend: The resolved backend.
        device: "cpu" or "cuda"; on "cpu" there are none.

    Returns:
        The moves.
    """
    if device != "cuda":
        return []
    moves = []
    if processes_of(cfg) == 1 and backend != "unsloth":
        for n in (2, 4, 8):
            moves.append(
                Move(
                    "gpus",
                    {"trial.num_processes": n, "trial.strategy": "fsdp"},
                    f"use {n} GPUs with FSDP (each rank holds 1/{n} of the weights, gradients and optimiser state)",
                    needs_hardware=True,
                )
            )
    if backend == "trl_vllm" and cfg.backend.get("vllm_mode", "colocate") == "colocate":
        ranks = processes_of(cfg)
        moves.append(
            Move(
                "vllm_server",
                {"backend.vllm_mode": "server", "trial.vllm_devices": [ranks]},
                f"move vLLM to its own GPU (backend.vllm_mode=server on GPU {ranks}: no vLLM pool on the training card)",
                needs_hardware=True,
            )
        )
    return moves
