"""vLLM for real on CPU (vLLM's CPU build, installed by `make install`): backend=trl_vllm trials on a
simulated card, where vLLM's share (gpu_memory_utilization x card) and training compete as on a GPU.

One multirun of three real trials (one warm forkserver) covers the trade-off end to end: a share too
small (vLLM refuses to start: oom, numbers parsed), one that fits (vLLM generates, TRL trains, the
weights reach vLLM, the sync check and the pool are recorded, the estimator predicts the peak), and
a share too large (training runs out: the tracker's torch.OutOfMemoryError).
"""

from __future__ import annotations

import pytest
from helpers.config import compose
from helpers.runners import load_metrics, train_here

from grpo_sweep.config.local import installed
from grpo_sweep.memory.estimator import estimate
from grpo_sweep.memory.shapes import shapes
from grpo_sweep.memory.vllm import vllm_cpu_plan
from grpo_sweep.units import MIB

CARD = ["backend=trl_vllm", "gpu=cpu_sim", "gpu.memory_gib=0.125", "max_seq_length=64", "per_device_train_batch_size=2"]
CARD += ["num_generations=2", "trial.steps=2"]
SMALL, FITS, LARGE = 0.004, 0.3, 0.9
# vLLM engine settings the multirun passes (they reach colocate through TRL's LLM call: vllm_patches.inject_engine_kwargs),
# each away from TRL's own: max_num_seqs 2 (the generation batch), max_num_batched_tokens 4096, prefix caching on.
ENGINE = {"max_num_seqs": 1, "max_num_batched_tokens": 128, "enable_prefix_caching": False}

needs_vllm = pytest.mark.skipif(not installed("vllm"), reason="vLLM is not installed (make install installs it)")


def test_cpu_plan_matches_vllm_cpu_arithmetic():
    # The tiny model on vLLM-CPU: a block is 128 tokens x K,V x 2 layers x 1 KV head x 32 x fp32 = 64 KiB
    # (vllm-cpu 0.31.0 allocated 128 blocks for 8 MiB); one 64-token sequence needs 1 block + the null block.
    cfg = compose(CARD + [f"gpu_memory_utilization={FITS}"])
    plan = vllm_cpu_plan(shapes(cfg, "trl_vllm", "cpu"), int(FITS * 128 * MIB))
    assert plan["block_bytes"] == 65536 and plan["kv_cache_min_bytes"] == 2 * 65536
    assert plan["kv_cache_bytes"] % plan["block_bytes"] == 0
    assert 0 <= FITS * 128 * MIB - plan["pool_bytes"] < plan["block_bytes"]
    # The estimator sees both walls: too small a share leaves no KV cache, too large leaves training short.
    small = estimate(compose(CARD + [f"gpu_memory_utilization={SMALL}"]))
    assert small.kv_cache_ok is False and not small.fits
    assert estimate(cfg).fits and estimate(cfg).kv_cache_ok
    large = estimate(compose(CARD + [f"gpu_memory_utilization={LARGE}"]))
    assert large.kv_cache_ok and large.headroom_bytes < 0


def test_engine_settings_join_the_cpu_engine_arguments():
    from grpo_sweep.trial.backends.trl_vllm import cpu_engine_kwargs, cpu_plan

    cfg = compose(CARD + [f"gpu_memory_utilization={FITS}"])
    assert cpu_engine_kwargs(cpu_plan(cfg), cfg) == {
        "enforce_eager": True,
        "dtype": "float32",
        "kv_cache_memory_bytes": cpu_plan(cfg)["kv_cache_bytes"],
    }
    given = [f"backend.vllm_{k}={str(v).lower()}" for k, v in ENGINE.items()]
    cfg = compose(CARD + given + ["backend.vllm_enforce_eager=false", "backend.vllm_kv_cache_memory_bytes=300000"])
    assert cpu_engine_kwargs(cpu_plan(cfg), cfg) == {
        **ENGINE,
        "enforce_eager": False,
        "dtype": "float32",
        "kv_cache_memory_bytes": 4 * 65536,  # the bytes given, in whole 64 KiB blocks
    }


@needs_vllm
@pytest.mark.slow
def test_trl_vllm_trials_on_a_simulated_card(tmp_path):
    """Over 20 s: vLLM (CPU build) trials: each starts in a fresh interpreter (spawn) that imports vLLM."""
    utils = ",".join(str(u) for u in (SMALL, FITS, LARGE))
    engine = [f"backend.vllm_{k}={str(v).lower()}" for k, v in ENGINE.items()]
    result = train_here(["-m", *CARD, *engine, f"gpu_memory_utilization={utils}", f"hydra.sweep.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    small, fits, large = (load_metrics(tmp_path / str(i)) for i in range(3))

    # Too small: vLLM's own start-up error (its weights take more than the share), classified oom,
    # with the KV-cache numbers in bytes.
    assert small["status"] == "oom", small["error"]
    assert "No available memory for the cache blocks" in small["error"]
    assert small["deficit_bytes"] == 2 * 65536 and small.get("vllm_pool_bytes") is None

    # Fits: a real GRPO trial with vLLM generating; the weights reached vLLM (log-probs agree after
    # the last sync, fp32 both sides), the pool is what the engine allocated, shown beside training.
    assert fits["status"] == "ok", fits["error"]
    assert fits["backend"] == "trl_vllm" and fits["steps"] == 2
    assert fits["vllm_sync_max_abs_logprob_diff"] is not None
    assert fits["vllm_sync_max_abs_logprob_diff"] <= fits["vllm_sync_tolerance"] == 1e-4
    assert fits["vllm_sampling_logp_diff_max"] is not None  # TRL's per-step check, recorded
    cfg = compose(CARD + [f"gpu_memory_utilization={FITS}"])
    plan = vllm_cpu_plan(shapes(cfg, "trl_vllm", "cpu"), int(FITS * 128 * MIB))
    assert fits["effective"]["vllm_kv_cache_bytes"] == plan["kv_cache_bytes"]  # read from vLLM's KV tensors
    assert fits["vllm_pool_bytes"] == plan["weights_bytes"] + fits["effective"]["vllm_kv_cache_bytes"]
    breakdown = fits["peak_memory_breakdown"]
    assert breakdown["vllm_pool"] == fits["vllm_pool_bytes"] and sum(breakdown.values()) == fits["peak_memory_bytes"]
    assert fits["peak_memory_bytes"] <= fits["budget_bytes"]
    # The estimator's prediction (made in the trial, before anything ran) within the accuracy goal.
    assert abs(fits["predicted_peak_bytes"] - fits["peak_memory_bytes"]) <= 0.10 * fits["peak_memory_bytes"]
    assert fits["generation_time_s"] is not None and fits["generation_time_s"] > 0
    # The engine settings reached the colocated engine (its VllmConfig), and its scheduler obeyed max_num_seqs=1.
    assert fits["effective"]["vllm_engine"] == {
        **ENGINE,
        "enforce_eager": True,
        "kv_cache_memory_bytes": plan["kv_cache_bytes"],
        "kv_cache_dtype": "auto",
        "model_impl": "vllm",  # TRL's default, passed by TRL's colocate LLM(...)
    }
    assert fits["vllm_max_running_requests"] == 1 and fits["vllm_max_waiting_requests"] >= 1
    # Its own rendezvous port (vllm_util.own_rendezvous_port), not TRL's shared 29500.
    assert "rendezvous on port" in (tmp_path / "1" / "trial.log").read_text()

    # Too large: vLLM starts, training gets 12.8 MiB and runs out (the tracker's torch.OutOfMemoryError).
    assert large["status"] == "oom", large["error"]
    assert large["error"].startswith("OutOfMemoryError") and "simulated device" in large["error"]
    assert large["vllm_pool_bytes"] is not None and large["oom_phase"] in ("generation", "forward", "backward", "optimiser")
    assert large["requested_bytes"] > large["free_bytes"] >= 0
