"""Tasks supply prompts (a `datasets.Dataset` with a `prompt` column) and verifiable rewards."""

from __future__ import annotations

from typing import Any

from .base import Task


def get_task(cfg: Any) -> Task:
    name = cfg.task.name
    if name == "arithmetic":
        from .arithmetic import ArithmeticTask

        return ArithmeticTask(cfg)
    if name == "gsm8k":
        from .gsm8k import Gsm8kTask

        return Gsm8kTask(cfg)
    raise ValueError(f"task.name={name}: unknown task")


__all__ = ["Task", "get_task"]
