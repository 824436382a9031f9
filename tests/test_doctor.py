"""OOM messages as users paste them, and the doctor's advice on the seed's case."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, compose

from grpo_sweep.memory.doctor import diagnose, infer_logits_mode
from grpo_sweep.memory.estimator import GiB, MiB, estimate
from grpo_sweep.memory.oom_message import parse_oom_message

SEED_MESSAGE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.01 GiB. "
    "GPU 0 has a total capacity of 22.06 GiB of which 2.72 GiB is free."
)
SEED_CONFIG = ["model=gemma3_1b", "preset=seed_baseline", "gpu=l4_24g"]

TORCH2_FULL = """[rank0]: Traceback (most recent call last):
[rank0]:   File "train.py", line 10, in <module>
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 14.75 GiB of which 3.06 MiB is free. Process 12345 has 14.74 GiB memory in use. Including non-PyTorch memory, this process has 14.74 GiB memory in use. Of the allocated memory 14.50 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.
"""

# Wrapped by a terminal mid-word, with logging prefixes and KiB.
TORCH2_WRAPPED = """2026-11-29 12:00:01,234 - ERROR - torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allo
cate 512.00 KiB. GPU 0 has a total capac
ity of 79.15 GiB of which 1.50 MiB is free. Process 77 has 40.00 GiB memory in use. Process 78 has 39.10 GiB
 memory in use."""

TORCH1 = (
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity; "
    "14.20 GiB already allocated; 10.44 MiB free; 14.50 GiB reserved in total by PyTorch) If reserved memory "
    "is >> allocated memory try setting max_split_size_mb to avoid fragmentation."
)

VLLM_KV = """(EngineCore_DP0 pid=18799) ERROR 10-08 20:33:48 [core.py:708] ValueError: To serve at least one request with the models's max seq len (40960),
(EngineCore_DP0 pid=18799) ERROR 10-08 20:33:48 [core.py:708] (5.62 GiB KV cache is needed, which is larger than the available KV cache memory (4.50 GiB). Based on the available memory, the estimated maximum model length is 32768. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."""

VLLM_STARTUP = (
    "[rank0]: ValueError: Free memory on device (6.92/22.06 GiB) on startup is less than desired GPU memory "
    "utilization (0.6, 13.24 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
)

VLLM_NO_BLOCKS = (
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
)

VLLM_OLD_TOKENS = (
    "ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be stored "
    "in KV cache (2048). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
)


def test_seed_message():
    p = parse_oom_message(SEED_MESSAGE)
    assert p["requested_bytes"] == int(6.01 * GiB)
    assert p["total_bytes"] == int(22.06 * GiB) and p["free_bytes"] == int(2.72 * GiB)
    assert p["deficit_bytes"] == int(6.01 * GiB) - int(2.72 * GiB)


def test_torch2_full_message_with_rank_prefixes():
    p = parse_oom_message(TORCH2_FULL)
    assert p["requested_bytes"] == 20 * MiB
    assert p["free_bytes"] == int(3.06 * MiB)
    assert p["process_in_use_bytes"] == int(14.74 * GiB)
    assert p["allocated_by_pytorch_bytes"] == int(14.50 * GiB)
    assert p["reserved_unallocated_bytes"] == 100 * MiB
    assert p["deficit_bytes"] == 20 * MiB - int(3.06 * MiB)


def test_torch2_wrapped_with_log_prefix_and_kib():
    p = parse_oom_message(TORCH2_WRAPPED)
    assert p["requested_bytes"] == 512 * 1024
    assert p["total_bytes"] == int(79.15 * GiB)
    assert p["free_bytes"] == int(1.5 * MiB)
    assert p["process_in_use_bytes"] == int(40 * GiB) + int(39.10 * GiB)  # both "Process N has" lines
    assert p["deficit_bytes"] == 0  # fragmentation: less requested than free


def test_torch1_message():
    p = parse_oom_message(TORCH1)
    assert p["requested_bytes"] == 2 * GiB
    assert p["total_bytes"] == int(15.78 * GiB)
    assert p["free_bytes"] == int(10.44 * MiB)
    assert p["allocated_by_pytorch_bytes"] == int(14.20 * GiB)
    assert p["reserved_unallocated_bytes"] == int(14.50 * GiB) - int(14.20 * GiB)
    assert p["deficit_bytes"] == 2 * GiB - int(10.44 * MiB)


def test_vllm_kv_cache_message_split_over_prefixed_lines():
    p = parse_oom_message(VLLM_KV)
    assert p["max_seq_len"] == 40960
    assert p["kv_cache_needed_bytes"] == int(5.62 * GiB)
    assert p["kv_cache_available_bytes"] == int(4.50 * GiB)
    assert p["deficit_bytes"] == int(5.62 * GiB) - int(4.50 * GiB)


def test_vllm_startup_message():
    p = parse_oom_message(VLLM_STARTUP)
    assert p["free_bytes"] == int(6.92 * GiB) and p["total_bytes"] == int(22.06 * GiB)
    assert p["gpu_memory_utilization"] == 0.6
    assert p["desired_bytes"] == int(13.24 * GiB)
    assert p["deficit_bytes"] == int(13.24 * GiB) - int(6.92 * GiB)


def test_vllm_no_cache_blocks_and_old_token_wording():
    assert parse_oom_message(VLLM_NO_BLOCKS)["kv_cache_available_bytes"] == 0
    p = parse_oom_message(VLLM_OLD_TOKENS)
    assert p["max_seq_len"] == 4096 and p["kv_cache_tokens"] == 2048


def test_unrelated_text_parses_to_nothing():
    assert parse_oom_message("Segmentation fault (core dumped)") == {}


def test_seed_allocation_is_recognised_as_full_logits():
    cfg = compose(SEED_CONFIG)
    assert infer_logits_mode(parse_oom_message(SEED_MESSAGE), cfg) == "full"
    assert infer_logits_mode({"requested_bytes": 20 * MiB}, cfg) is None


def test_doctor_on_the_seed_returns_overrides_the_estimator_says_fit():
    cfg = compose(SEED_CONFIG)
    result = diagnose(cfg, parse_oom_message(SEED_MESSAGE))
    assert result["deficit_bytes"] == parse_oom_message(SEED_MESSAGE)["deficit_bytes"]
    assert result["logits_mode"] == "full"
    assert result["overrides"], result
    fixed = compose(SEED_CONFIG + result["overrides"])
    after = estimate(fixed, "full")
    assert after.fits
    # >= 5 % headroom even with the overhead the message proves the estimate misses.
    assert after.total_bytes + result["unexplained_bytes"] <= 0.95 * after.budget_bytes
    # Upgrading to the chunked head is reported as a fix on its own.
    assert result["stack_upgrade"]["fits"] and result["stack_upgrade"]["saving_bytes"] > 10 * GiB
    # Levers are ranked by GiB freed per % of speed lost, experiment-changing moves last.
    ratios = [row["gib_per_pct"] for row in result["levers"] if row["gib_per_pct"] is not None and not row["changes_experiment"]]
    assert ratios == sorted(ratios, reverse=True)
    assert result["levers"][-1]["changes_experiment"]


def test_doctor_with_vllm_lowers_the_pool_when_the_kv_cache_allows():
    cfg = compose(["model=gemma3_1b", "preset=seed_baseline", "gpu=l4_24g", "backend.name=trl_vllm"])
    msg = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total "
        "capacity of 22.06 GiB of which 100.00 MiB is free."
    )
    result = diagnose(cfg, parse_oom_message(msg))
    assert any(o.startswith("gpu_memory_utilization=") for row in result["levers"] for o in row["overrides"])
    assert result["overrides"]
    assert estimate(
        compose(["model=gemma3_1b", "preset=seed_baseline", "gpu=l4_24g", "backend.name=trl_vllm"] + result["overrides"])
    ).fits


def test_doctor_on_a_vllm_kv_cache_error_raises_the_share():
    cfg = compose(
        ["model=gemma3_1b", "preset=seed_optimized", "gpu=l4_24g", "backend.name=trl_vllm", "gpu_memory_utilization=0.1"]
    )
    msg = (
        "ValueError: To serve at least one request with the models's max seq len (512), (0.01 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.00 GiB)."
    )
    result = diagnose(cfg, parse_oom_message(msg))
    assert result["deficit_bytes"] == int(0.01 * GiB)
    util = [o for o in result["overrides"] if o.startswith("gpu_memory_utilization=")]
    assert util and float(util[0].split("=")[1]) > 0.1
    after = estimate(
        compose(["model=gemma3_1b", "preset=seed_optimized", "gpu=l4_24g", "backend.name=trl_vllm"] + result["overrides"])
    )
    assert after.kv_cache_ok and after.fits


def test_doctor_on_a_vllm_startup_error_keeps_the_share_within_free_memory():
    cfg = compose(["model=gemma3_1b", "preset=seed_optimized", "gpu=l4_24g", "backend.name=trl_vllm"])
    msg = (
        "ValueError: Free memory on device (15.00/22.06 GiB) on startup is less than desired GPU memory "
        "utilization (0.8, 17.65 GiB)."
    )
    result = diagnose(with_util(cfg, 0.8), parse_oom_message(msg))
    assert result["deficit_bytes"] == int(17.65 * GiB) - int(15.0 * GiB)
    assert result["unexplained_bytes"] > 5 * GiB  # memory held by something else at start-up
    (util,) = [float(o.split("=")[1]) for o in result["overrides"] if o.startswith("gpu_memory_utilization=")]
    assert util <= 0.65  # at most floor(15 / 22.06, 0.05): the share must fit in what was free
    after = estimate(with_util(cfg, util))
    assert after.kv_cache_ok and after.total_bytes + result["unexplained_bytes"] <= 0.95 * after.budget_bytes


def with_util(cfg, util):
    from grpo_sweep.memory.doctor import with_overrides

    return with_overrides(cfg, {"gpu_memory_utilization": util})


def test_doctor_cli_json_and_text(tmp_path):
    message = tmp_path / "oom.txt"
    message.write_text(SEED_MESSAGE)
    args = [sys.executable, "-m", "grpo_sweep.cli", "doctor", "--message", str(message), *SEED_CONFIG]
    js = subprocess.run(args + ["--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert js.returncode == 0, js.stderr
    data = json.loads(js.stdout)
    assert data["parsed"]["requested_bytes"] == int(6.01 * GiB)
    assert data["deficit_bytes"] > 0 and data["overrides"]
    text = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "deficit: 3.29 GiB" in text.stdout
    assert "GiB/%" in text.stdout and " ".join(data["overrides"]) in text.stdout
    # stdin works too
    piped = subprocess.run(
        [*args[:5], "-", *SEED_CONFIG, "--json"], input=TORCH1, capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert json.loads(piped.stdout)["parsed"]["allocated_by_pytorch_bytes"] == int(14.20 * GiB)


def test_doctor_reads_a_trial_metrics_json(tmp_path):
    from omegaconf import OmegaConf

    run = tmp_path / "run"
    run.mkdir()
    OmegaConf.save(compose(SEED_CONFIG), run / "config.yaml", resolve=True)
    (run / "metrics.json").write_text(json.dumps({"status": "oom", "error": "OutOfMemoryError: " + SEED_MESSAGE}))
    result = subprocess.run(
        [sys.executable, "-m", "grpo_sweep.cli", "doctor", "--message", str(run / "metrics.json"), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    data = json.loads(result.stdout)
    assert data["parsed"]["free_bytes"] == int(2.72 * GiB) and data["overrides"]
    # Overrides on a saved config are typed as YAML (an int stays an int), groups are refused.
    from grpo_sweep.memory.doctor import load_config

    cfg = load_config(run / "config.yaml", ["per_device_train_batch_size=2", "gradient_checkpointing=true"])
    assert cfg.per_device_train_batch_size == 2 and cfg.gradient_checkpointing is True
    with pytest.raises(ValueError, match="already composed"):
        load_config(run / "config.yaml", ["gpu=t4_16g"])


def test_doctor_bad_input_is_one_clear_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "grpo_sweep.cli", "doctor", "--message", str(tmp_path / "missing.txt")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 2 and "no such file" in result.stderr


@pytest.mark.slow
def test_doctor_verify_runs_a_real_trial(tmp_path):
    # A tiny CPU config with a budget the estimator says it exceeds; --verify runs the fix for real.
    message = tmp_path / "oom.txt"
    message.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a "
        "total capacity of 0.06 GiB of which 1.00 MiB is free."
    )
    args = [
        sys.executable,
        "-m",
        "grpo_sweep.cli",
        "doctor",
        "--message",
        str(message),
        "gpu=cpu_sim",
        "gpu.memory_gib=0.06",
        "trial.steps=2",
        "task.num_prompts=16",
        "per_device_train_batch_size=8",
        "num_generations=4",
        "--verify",
        "--json",
    ]
    result = subprocess.run(
        args,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")},
    )
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["overrides"], data
    assert data["verify"]["status"] == "ok", data["verify"]
