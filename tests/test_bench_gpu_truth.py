"""bench/gpu_truth.py on the H200's committed part a and landscape: the card's fitted overheads in
conf/gpu/h200_141g.yaml are what the landscape gives, and the tables say what the page says.

Seconds: composing a config per point and the arithmetic model, no trial.
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from helpers.runners import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import gpu_truth  # noqa: E402

H200 = ROOT / "src" / "grpo_sweep" / "conf" / "gpu" / "h200_141g.yaml"


@pytest.fixture(scope="module")
def landscape() -> dict:
    return json.loads(gpu_truth.LANDSCAPE.read_text())


def test_the_h200s_overheads_are_the_landscapes_fits(landscape):
    """eager_layer_s and microbatch_overhead_s in the H200's file are the medians the landscape's measured
    generation and training seconds give (each within 5 %), and both are far above the generic rates."""
    card = yaml.safe_load(H200.read_text())
    eager, micro = gpu_truth.fit_eager_layer_s(landscape), gpu_truth.fit_microbatch_s(landscape)
    assert eager["points"] == 17 and micro["points"] == 13
    assert card["eager_layer_s"] == pytest.approx(eager["eager_layer_s"], rel=0.05)
    assert card["microbatch_overhead_s"] == pytest.approx(micro["microbatch_overhead_s"], rel=0.05)
    assert eager["min"] > 5 * 0.00035  # every point: HF generate's host cost, not the generic 0.35 ms


def test_the_knob_table_prices_steps_per_generation_and_the_memory_table_reads_each_case(landscape):
    """steps_per_generation=1's model ratio, 1.00 when the landscape ran, is now within 20 % of the measured
    0.265; every part-a case has its estimate and three peaks."""
    rows = {r["knob"]: r for r in gpu_truth.knob_rows(landscape)}
    spg = rows["steps_per_generation=1"]
    assert spg["model ratio (recorded)"] == pytest.approx(1.0)
    assert spg["model ratio"] == pytest.approx(spg["measured ratio"], rel=0.2)
    memory = gpu_truth.memory_rows(json.loads(gpu_truth.CHECK.read_text()))
    assert {r["case"] for r in memory} == {"doctor", "oom", "seed_baseline", "seed_optimized"}
    for r in memory:
        assert 0.7 < r["allocator/estimate"] <= 1.0 and r["NVML GiB"] > r["reserved GiB"] > r["allocator GiB"] > 0
