"""Memory measured and enforced: the CPU tensor tracker, the simulated budget, metrics.json's keys.

Budgets come from measuring the tiny model (default levers, trial.steps=2): its tracked peak is
~60.0 MB (57.3 MiB), of which ~55.6 MB is the fused LM-head tile's temporaries in backward. A
30.72 MiB card (gpu.memory_gib=0.03) cannot hold the 47.5 MiB tile; a 102.4 MiB card (0.1) can.
"""

from __future__ import annotations

import pytest
import torch
from helpers.config import compose
from helpers.runners import FAST, load_metrics

from grpo_sweep.memory.oom_message import parse_oom_message
from grpo_sweep.metrics import REQUIRED_KEYS
from grpo_sweep.trial.backends.vllm_util import rescale_utilization
from grpo_sweep.trial.measure.enforce import capped_free_bytes, simulated_oom_error
from grpo_sweep.trial.measure.memory_meter import NvmlPeakSampler
from grpo_sweep.trial.measure.tracker import CATEGORIES, PHASES, TensorTracker
from grpo_sweep.trial.parent import run_trial
from grpo_sweep.units import budget_bytes

MIB = 2**20
TOO_SMALL, LARGE = "0.03", "0.1"


def test_tracker_counts_storages_not_views_and_frees_them():
    tracker = TensorTracker()
    with tracker:
        a = torch.empty(MIB, dtype=torch.uint8)
        view = a[: MIB // 2]  # same storage: no new bytes
        b = torch.zeros(2 * MIB, dtype=torch.uint8)
        assert tracker.live == 3 * MIB
        del a, view, b
        assert tracker.live == 0
        c = torch.ones(MIB, dtype=torch.uint8)
    assert tracker.peak == 3 * MIB and tracker.live == MIB
    assert sum(tracker.peak_breakdown.values()) == tracker.peak
    del c


def test_budget_raises_cuda_shaped_oom_and_releases_the_allocation():
    tracker = TensorTracker(budget_bytes=4 * MIB)
    with tracker:
        keep = torch.empty(3 * MIB, dtype=torch.uint8)
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(2 * MIB, dtype=torch.uint8)
        assert tracker.live == 3 * MIB  # the refused tensor is gone
        again = torch.empty(MIB, dtype=torch.uint8)  # what fits still fits
    parsed = parse_oom_message(str(info.value))
    assert parsed["requested_bytes"] == 2 * MIB and parsed["free_bytes"] == MIB
    assert parsed["deficit_bytes"] == MIB and parsed["total_bytes"] == 4 * MIB
    assert "simulated device" in str(info.value)
    assert tracker.peak == 4 * MIB  # the refused allocation is not part of the peak
    del keep, again


def test_budget_helpers():
    assert budget_bytes(compose(["gpu=l4_24g"])) == int(22.06 * 2**30)
    assert budget_bytes(compose(["gpu=cpu"])) is None
    assert rescale_utilization(0.6, 22 * 2**30, 88 * 2**30) == pytest.approx(0.15)
    assert rescale_utilization(0.6, None, 88 * 2**30) == 0.6
    assert rescale_utilization(0.6, 100 * 2**30, 80 * 2**30) == 0.6  # cannot emulate a bigger card
    err = simulated_oom_error(3 * 2**30, 20 * 2**30, 22 * 2**30, "backward", card="l4_24g")
    assert isinstance(err, torch.OutOfMemoryError)
    assert parse_oom_message(str(err))["deficit_bytes"] == pytest.approx(2**30, rel=0.01)

    assert capped_free_bytes(str(err)) is None  # no cap: the message's own free memory stands
    sampler = NvmlPeakSampler().start()  # no GPU here: a no-op, never an error
    sampler.stop()
    assert sampler.peak_bytes is None or torch.cuda.is_available()


def test_free_memory_on_a_capped_card_comes_from_the_allowance():
    """PyTorch's message under set_per_process_memory_fraction (an L4 budget on an H100)."""
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.01 GiB. GPU 0 has a total "
        "capacity of 79.11 GiB of which 57.20 GiB is free. Including non-PyTorch memory, this process "
        "has 21.90 GiB memory in use. 22.06 GiB allowed; Of the allocated memory 19.10 GiB is allocated "
        "by PyTorch, and 0.24 GiB is reserved by PyTorch but unallocated."
    )
    assert capped_free_bytes(text) == pytest.approx((22.06 - 19.10 - 0.24) * 2**30, abs=2**20)


def _tiny_arch():
    return compose([]).model.arch


def tiny_weight_bytes() -> int:
    """The tiny Llama's float32 weights, counted by hand from its architecture (conf/model/tiny.yaml:
    155,968 parameters today): embeddings, per layer q/k/v/o + gate/up/down + 2 norms, final norm,
    and an untied LM head only when the embeddings are not tied."""
    a = _tiny_arch()
    attn = a.hidden_size * a.num_attention_heads * a.head_dim * 2 + a.hidden_size * a.num_key_value_heads * a.head_dim * 2
    layer = attn + 3 * a.hidden_size * a.intermediate_size + 2 * a.hidden_size
    params = a.vocab_size * a.hidden_size * (1 if a.tie_word_embeddings else 2) + a.num_hidden_layers * layer + a.hidden_size
    return 4 * params


def tiny_lora_bytes(rank: int) -> int:
    """LoRA on q_proj and v_proj (the default targets), float32: A (rank x in) + B (out x rank)."""
    a = _tiny_arch()
    q = rank * a.hidden_size + a.num_attention_heads * a.head_dim * rank
    v = rank * a.hidden_size + a.num_key_value_heads * a.head_dim * rank
    return 4 * a.num_hidden_layers * (q + v)


def test_hand_counts_of_the_tiny_model():
    if (_tiny_arch().hidden_size, _tiny_arch().num_hidden_layers) == (64, 2):  # today's tiny.yaml
        assert tiny_weight_bytes() == 4 * 155_968 and tiny_lora_bytes(16) == 4 * 7_168


@pytest.fixture(scope="module")
def trials(tmp_path_factory):
    """Three real tiny trials: too small a card, a large card, and rank 32 without a budget."""
    runs = {
        "small": [*FAST, "gpu=cpu_sim", f"gpu.memory_gib={TOO_SMALL}"],
        "large": [*FAST, "gpu=cpu_sim", f"gpu.memory_gib={LARGE}"],
        "rank32": ["trial.steps=3", "lora_rank=32"],
    }
    out = {}
    for name, overrides in runs.items():
        run_dir = tmp_path_factory.mktemp(name)
        record = run_trial(compose(overrides), run_dir)  # returning at all: the parent survived
        out[name] = (record, load_metrics(run_dir))
    return out


@pytest.mark.slow
def test_too_small_card_ends_oom_with_parsed_deficit(trials):
    record, on_disk = trials["small"]
    assert record["status"] == "oom" and on_disk["status"] == "oom", record["error"]
    assert set(REQUIRED_KEYS) <= set(on_disk)
    assert on_disk["simulated_device"] is True and on_disk["memory_source"] == "cpu-tracker"
    assert on_disk["budget_bytes"] == int(float(TOO_SMALL) * 2**30)
    assert on_disk["oom_phase"] in PHASES and on_disk["oom_phase"] != "other"
    assert on_disk["requested_bytes"] > on_disk["free_bytes"] >= 0
    assert on_disk["deficit_bytes"] > 0
    # By hand: at the OOM the frozen weights and the LoRA parameters were live, so at most the budget
    # less those bytes was free.
    assert on_disk["free_bytes"] <= on_disk["budget_bytes"] - tiny_weight_bytes() - tiny_lora_bytes(16)
    assert on_disk["peak_memory_bytes"] <= on_disk["budget_bytes"]
    assert "CUDA out of memory" in on_disk["error"] and "simulated device" in on_disk["error"]


@pytest.mark.slow
def test_large_card_ends_ok_with_breakdown_summing_to_peak(trials):
    record, on_disk = trials["large"]
    assert record["status"] == "ok", record["error"]
    assert on_disk["simulated_device"] is True and on_disk["tracked_steps"] == "all"
    breakdown = on_disk["peak_memory_breakdown"]
    assert set(breakdown) == set(CATEGORIES)
    assert all(value >= 0 for value in breakdown.values())
    # Independent oracles: the weights and LoRA parameters counted by hand from the architecture ...
    # The tracker's weights also hold the rotary embedding's two buffers (transformers'
    # LlamaRotaryEmbedding: inv_freq and original_inv_freq, head_dim / 2 floats each).
    assert breakdown["weights"] == tiny_weight_bytes() + 2 * (_tiny_arch().head_dim // 2) * 4
    assert breakdown["trainable_params"] == tiny_lora_bytes(16)
    assert 0 < on_disk["peak_memory_bytes"] <= on_disk["budget_bytes"]
    # ... and the estimator's prediction against this measured peak, within its goal (worst case
    # <= 25 %, docs/performance.md "Estimator accuracy").
    predicted = on_disk["predicted_peak_bytes"]
    assert abs(predicted - on_disk["peak_memory_bytes"]) <= 0.25 * on_disk["peak_memory_bytes"], (
        predicted,
        on_disk["peak_memory_bytes"],
    )
    assert on_disk["peak_phase"] in PHASES
    assert breakdown["weights"] > 0 and breakdown["trainable_params"] > 0
    assert on_disk["category_peaks"]["gradients"] == breakdown["trainable_params"]  # fp32 grads
    assert on_disk["oom_phase"] is None and on_disk["deficit_bytes"] is None


def _trainable_bytes(metrics):
    """LoRA parameters + their gradients + AdamW state, as the tracker classed them."""
    peaks = metrics["category_peaks"]
    return peaks["trainable_params"] + peaks["gradients"] + peaks["optimizer_state"]


@pytest.mark.slow
def test_rank_32_has_twice_the_trainable_bytes_and_untracked_throughput(trials):
    _, m16 = trials["large"]
    record32, m32 = trials["rank32"]
    assert record32["status"] == "ok", record32["error"]
    assert m32["peak_memory_breakdown"]["trainable_params"] == 2 * m16["peak_memory_breakdown"]["trainable_params"]
    assert _trainable_bytes(m32) / _trainable_bytes(m16) == pytest.approx(2.0, rel=0.02)
    assert m32["trainable_params"] * 4 == m32["peak_memory_breakdown"]["trainable_params"] == tiny_lora_bytes(32)
    # No budget: only the first two steps are tracked; throughput comes from the untracked third.
    assert m32["budget_bytes"] is None and m32["simulated_device"] is False
    assert [row["tracked"] for row in m32["history"]] == [True, True, False]
    assert m32["tracked_steps"] == 2 and m32["throughput_tracked"] is False
