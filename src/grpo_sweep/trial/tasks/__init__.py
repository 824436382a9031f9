"""Tasks supply prompts (a `datasets.Dataset` with a `prompt` column) and verifiable rewards.

A task is chosen by config: `task._target_` names its class (conf/task/*.yaml), so a new task is a
new module with a `Task` subclass and one YAML file; nothing here lists them.
"""

from __future__ import annotations

from typing import Any

from .base import Task


def get_task(cfg: Any) -> Task:
    from hydra.utils import get_class

    cls = get_class(cfg.task._target_)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"task._target_={cfg.task._target_}: not a grpo_sweep Task subclass")
    return cls(cfg)


__all__ = ["Task", "get_task"]
