"""`python train.py -m lora_rank=16,32` runs two real trials through Hydra's basic sweeper."""

from __future__ import annotations

import pytest
from conftest import FAST, load_metrics, run_train


@pytest.mark.slow
def test_multirun_two_ranks(tmp_path):
    result = run_train(["-m", "lora_rank=16,32", *FAST, f"hydra.sweep.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = load_metrics(tmp_path / "0"), load_metrics(tmp_path / "1")
    assert first["status"] == second["status"] == "ok"
    assert (first["levers"]["lora_rank"], second["levers"]["lora_rank"]) == (16, 32)
    assert (first["effective"]["lora_rank"], second["effective"]["lora_rank"]) == (16, 32)
    assert second["trainable_params"] == 2 * first["trainable_params"]
    assert result.stdout.count("trial ok") == 2
