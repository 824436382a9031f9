"""The checks that need this machine: is there a CUDA device, which packages are installed.

Kept apart from the pure schema (validate.validate) so that a prediction for another machine
(`grpo-sweep estimate`, `doctor`) never depends on what happens to be installed here, and so that
nothing here imports torch: the sweep's parent process must never initialise CUDA (a CUDA context
in the parent would hold memory on the card the trials measure, and break forked trials).
"""

from __future__ import annotations

import importlib.util
import os
import shutil

from omegaconf import DictConfig

from .model_arch import check_hub_lora_targets
from .schema import ConfigError
from .user_task import check_user_task
from .validate import validate


def installed(module: str) -> bool:
    """Whether `module` can be imported here (found on the path; nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cuda_available() -> bool:
    """Whether a CUDA device is usable here, asked of the driver (NVML), never of torch.

    No `nvidia-smi` on the PATH: no driver, so no CUDA. `CUDA_VISIBLE_DEVICES` set to nothing (or
    -1) hides every device, as CUDA itself does.
    """
    if shutil.which("nvidia-smi") is None:
        return False
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML library or no driver loaded: no usable device
        return False


def check_task(cfg: DictConfig) -> None:
    """`task._target_` names an importable module (found, not imported) before any trial starts."""
    target = str(cfg.task.get("_target_") or "")
    module, _, name = target.rpartition(".")
    if not module or not name or not installed(module):
        raise ConfigError(
            f"task._target_={target or None}: must name a Task class as module.Class that can be imported "
            "(e.g. grpo_sweep.trial.tasks.arithmetic.ArithmeticTask; conf/task/*.yaml)"
        )


def validate_here(cfg: DictConfig, *, cuda: bool | None = None) -> DictConfig:
    """`validate.validate` with this machine's facts: CUDA (detected unless given) and installed packages."""
    validate(cfg, cuda=cuda_available() if cuda is None else cuda, installed=installed)
    check_hub_lora_targets(cfg)
    check_task(cfg)
    check_user_task(cfg)  # task=dataset's file and columns, task.reward_funcs' modules
    return cfg
