"""Shared helpers: compose the real Hydra config, run train.py as users do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAST = ["trial.steps=2"]  # the default task: its warm model (model.init=warm) is built once and shared


def compose(overrides: list[str] | None = None):
    """The config train.py would see for these overrides (Hydra's compose API, same conf/)."""
    from grpo_sweep.config.compose import compose_train_config

    return compose_train_config(overrides)


def run_train(args: list[str], cwd: Path | None = None, timeout: float = 600, env: dict | None = None):
    """`python train.py ARGS` in a subprocess; returns CompletedProcess with text output."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def load_metrics(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


@pytest.fixture
def fast_overrides():
    return list(FAST)
