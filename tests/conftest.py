"""Shared helpers: compose the real Hydra config, run train.py as users do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAST = ["trial.steps=2", "task.num_prompts=64"]


def compose(overrides: list[str] | None = None):
    """The config train.py would see for these overrides (Hydra's compose API, same conf/)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from grpo_sweep.schema import register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("train", overrides=overrides or [])


def run_train(args: list[str], cwd: Path | None = None, timeout: float = 600, env: dict | None = None):
    """`python train.py ARGS` in a subprocess; returns CompletedProcess with text output."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout, env=full_env,
    )


def load_metrics(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


@pytest.fixture
def fast_overrides():
    return list(FAST)
