"""`python train.py -m lora_rank=16,32` runs two real trials through Hydra's basic sweeper."""

from __future__ import annotations

import pytest
from helpers.config import compose
from helpers.runners import FAST, load_metrics, train_here


def test_the_basic_sweeper_makes_one_job_per_value_and_the_rank_doubles_the_adapters():
    """What the multirun below does, before anything runs: Hydra's basic sweeper turns `lora_rank=16,32`
    into two jobs, each composes to its rank, and the estimator counts twice the LoRA parameters at 32
    (the real trials' trainable_params must agree)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from grpo_sweep.memory.shapes import shapes, trainable_param_count

    overrides = OverridesParser.create().parse_overrides(["lora_rank=16,32", *FAST])
    [jobs] = BasicSweeper.split_arguments(overrides, max_batch_size=None)
    assert jobs == [["lora_rank=16", *FAST], ["lora_rank=32", *FAST]]
    cfgs = [compose(job) for job in jobs]
    assert [c.lora_rank for c in cfgs] == [16, 32]
    counts = [trainable_param_count(shapes(c, "trl", "cpu")) for c in cfgs]
    assert counts[0] > 0 and counts[1] == 2 * counts[0]


@pytest.mark.slow
def test_multirun_two_ranks(tmp_path):
    result = train_here(["-m", "lora_rank=16,32", *FAST, f"hydra.sweep.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = load_metrics(tmp_path / "0"), load_metrics(tmp_path / "1")
    assert first["status"] == second["status"] == "ok"
    assert (first["levers"]["lora_rank"], second["levers"]["lora_rank"]) == (16, 32)
    assert (first["effective"]["lora_rank"], second["effective"]["lora_rank"]) == (16, 32)
    assert second["trainable_params"] == 2 * first["trainable_params"]
    assert result.stdout.count("trial ok") == 2
