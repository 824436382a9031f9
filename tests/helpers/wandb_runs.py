"""An offline W&B run read back with W&B's own reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.runners import OFFLINE_ENV

WANDB_CLI = str(Path(sys.executable).with_name("wandb"))


def leet(path: str | Path, *args: str) -> str:
    """`wandb leet inspect` (wandb 0.31's reader of a run's .wandb transaction log)."""
    out = subprocess.run(
        [WANDB_CLI, "leet", "inspect", *args, str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **OFFLINE_ENV},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def read_run(path) -> tuple[dict, list[dict]]:
    """(summary view, all records) of an offline run directory."""
    summary = json.loads(leet(path, "--summary", "--json"))
    records = [json.loads(line) for line in leet(path, "--json").splitlines() if line.strip()]
    return summary, records
