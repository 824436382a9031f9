"""OOM messages as users paste them, and the doctor's advice on the seed's case."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers.config import compose
from helpers.runners import cli

from grpo_sweep.memory.doctor import diagnose, infer_logits_mode
from grpo_sweep.memory.oom_message import parse_oom_message
from grpo_sweep.units import GIB as GiB
from grpo_sweep.units import MIB as MiB

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
    assert p["deficit_bytes"] == pytest.approx(3.29 * GiB, abs=1)  # 6.01 - 2.72 GiB, by hand


def test_torch2_full_message_with_rank_prefixes():
    p = parse_oom_message(TORCH2_FULL)
    assert p["requested_bytes"] == 20 * MiB
    assert p["free_bytes"] == int(3.06 * MiB)
    assert p["process_in_use_bytes"] == int(14.74 * GiB)
    assert p["allocated_by_pytorch_bytes"] == int(14.50 * GiB)
    assert p["reserved_unallocated_bytes"] == 100 * MiB
    assert p["deficit_bytes"] == pytest.approx(16.94 * MiB, abs=1)  # 20 - 3.06 MiB, by hand


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
    assert p["reserved_unallocated_bytes"] == pytest.approx(0.30 * GiB, abs=1)  # 14.50 - 14.20 GiB, by hand
    assert p["deficit_bytes"] == pytest.approx((2048 - 10.44) * MiB, abs=1)  # 2 GiB - 10.44 MiB, by hand


def test_vllm_kv_cache_message_split_over_prefixed_lines():
    p = parse_oom_message(VLLM_KV)
    assert p["max_seq_len"] == 40960
    assert p["kv_cache_needed_bytes"] == int(5.62 * GiB)
    assert p["kv_cache_available_bytes"] == int(4.50 * GiB)
    assert p["deficit_bytes"] == pytest.approx(1.12 * GiB, abs=1)  # 5.62 - 4.50 GiB, by hand


def test_vllm_startup_message():
    p = parse_oom_message(VLLM_STARTUP)
    assert p["free_bytes"] == int(6.92 * GiB) and p["total_bytes"] == int(22.06 * GiB)
    assert p["gpu_memory_utilization"] == 0.6
    assert p["desired_bytes"] == int(13.24 * GiB)
    assert p["deficit_bytes"] == pytest.approx(6.32 * GiB, abs=1)  # 13.24 - 6.92 GiB, by hand


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


def test_doctor_on_the_seed_reads_the_message_and_keeps_the_generation_batch():
    """Oracles by hand, from the message and the preset (the doctor's estimate is not its own judge;
    test_doctor_fix_of_a_real_oom_runs_for_real runs a suggested fix for real)."""
    cfg = compose(SEED_CONFIG)
    result = diagnose(cfg, parse_oom_message(SEED_MESSAGE))
    assert result.deficit_bytes == pytest.approx(3.29 * GiB, abs=1)  # 6.01 GiB asked, 2.72 GiB free
    # The run needed what was in use (22.06 - 2.72 GiB) plus the failed 6.01 GiB: 25.35 GiB.
    assert result.observed_need_bytes == pytest.approx(25.35 * GiB, abs=2)
    # 6.01 GiB = 4 completions x 769 positions (768-token completion + 1) x 262144 vocab x 8 bytes:
    # a whole logits-sized tensor, so the run materialised full logits.
    assert 4 * 769 * 262144 * 8 == pytest.approx(6.01 * GiB, rel=1e-3)
    assert result.logits_mode == "full"
    assert result.overrides and not result.fits_as_is, result
    fixed = compose(SEED_CONFIG + result.overrides)
    # GRPO's generation batch (micro-batch x grad-accum = 4 x 1 in the preset) is the experiment: kept.
    assert fixed.per_device_train_batch_size * fixed.gradient_accumulation_steps == 4
    assert fixed.max_seq_length == 1024 and fixed.num_generations == 4
    # Upgrading to the chunked head is reported as a fix on its own.
    assert result.stack_upgrade["fits"] and result.stack_upgrade["saving_bytes"] > 10 * GiB
    # Levers are ranked by GiB freed per % of speed lost, experiment-changing moves last.
    ratios = [row["gib_per_pct"] for row in result.levers if row["gib_per_pct"] is not None and not row["changes_experiment"]]
    assert ratios == sorted(ratios, reverse=True)
    assert result.levers[-1]["changes_experiment"]


def test_doctor_with_vllm_lowers_the_pool_when_the_kv_cache_allows():
    cfg = compose(["model=gemma3_1b", "preset=seed_baseline", "gpu=l4_24g", "backend.name=trl_vllm"])
    msg = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total "
        "capacity of 22.06 GiB of which 100.00 MiB is free."
    )
    result = diagnose(cfg, parse_oom_message(msg))
    shares = [
        float(o.split("=")[1]) for row in result.levers for o in row["overrides"] if o.startswith("gpu_memory_utilization=")
    ]
    assert shares and all(s < 0.6 for s in shares)  # training ran out: the pool may only shrink
    assert result.overrides
    # By hand: every 0.05 of the share is 0.05 x 22.06 GiB = 1.10 GiB, more than the 412 MiB short.
    assert 0.05 * 22.06 * GiB > result.deficit_bytes == 412 * MiB


def test_doctor_on_a_vllm_kv_cache_error_raises_the_share():
    cfg = compose(
        ["model=gemma3_1b", "preset=seed_optimized", "gpu=l4_24g", "backend.name=trl_vllm", "gpu_memory_utilization=0.1"]
    )
    msg = (
        "ValueError: To serve at least one request with the models's max seq len (512), (0.01 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.00 GiB)."
    )
    result = diagnose(cfg, parse_oom_message(msg))
    assert result.deficit_bytes == int(0.01 * GiB)
    util = [float(o.split("=")[1]) for o in result.overrides if o.startswith("gpu_memory_utilization=")]
    assert util and util[0] >= 0.15  # a KV-cache error needs a larger pool: at least one 0.05 step


def _kv_error(case_id: str) -> str:
    (text,) = [p.values[0] for p in VLLM_REAL if p.id == case_id]
    return text


@pytest.mark.parametrize("case_id", ["FINDINGS-cpu-0.0-GiB", "FINDINGS-cpu-no-cache-blocks", "gpustack#1800-v0-worker"])
def test_doctor_on_kv_errors_without_sizes_still_raises_the_share(case_id):
    """vLLM says the KV cache is too small but gives no usable size: the share must grow anyway,
    even where the estimate thinks the pool holds the batch."""
    cfg = compose(["model=gemma3_1b", "preset=seed_optimized", "gpu=l4_24g", "backend.name=trl_vllm"])
    result = diagnose(cfg, parse_oom_message(_kv_error(case_id)))
    util = [float(o.split("=")[1]) for o in result.overrides if o.startswith("gpu_memory_utilization=")]
    assert util and util[0] >= 0.55, result.overrides  # from 0.5, at least one 0.05 step
    assert not result.fits_as_is


def test_doctor_on_the_cpu_builds_negative_kv_share_raises_the_share():
    """FINDINGS: a share of 0.29 GiB on a 14.34 GiB node, 0.34 GiB short before any KV: by hand the share
    must grow by at least 0.34 / 14.34 = 0.024, i.e. from 0.1 to 0.15 or more (0.05 steps)."""
    cfg = compose(
        ["model=gemma3_1b", "preset=seed_optimized", "gpu=l4_24g", "backend.name=trl_vllm", "gpu_memory_utilization=0.1"]
    )
    result = diagnose(cfg, parse_oom_message(_kv_error("FINDINGS-cpu-negative-kv")))
    util = [float(o.split("=")[1]) for o in result.overrides if o.startswith("gpu_memory_utilization=")]
    assert util and util[0] >= 0.15, result.overrides


def test_doctor_says_a_config_that_fits_fits(tmp_path):
    """Fragmentation: 2 MiB asked with 10 GiB free. The tiny model on an L4 needs well under 1 GiB (its
    weights are 147,776 float parameters): the doctor says it fits, never "use a larger card"."""
    msg = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity "
        "of 22.06 GiB of which 10.00 GiB is free."
    )
    result = diagnose(compose(["gpu=l4_24g"]), parse_oom_message(msg))
    assert result.fits_as_is and result.fits_after and result.overrides == []
    message = tmp_path / "oom.txt"
    message.write_text(msg)
    text = cli("doctor", "--message", str(message), "gpu=l4_24g")
    assert text.returncode == 0, text.stderr
    assert "this config fits as it is" in text.stdout
    assert "no combination" not in text.stdout and "larger card" not in text.stdout


def test_doctor_cannot_read_a_message_says_so_and_exits_2(tmp_path):
    crash = tmp_path / "crash.txt"
    crash.write_text("Segmentation fault (core dumped)\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"status": "failed", "error": "KeyError: 'prompt'"}))
    for source in (crash, run / "metrics.json"):
        for extra in ([], ["--json"]):
            result = cli("doctor", "--message", str(source), "gpu=l4_24g", *extra)
            assert result.returncode == 2, result.stdout + result.stderr
            assert result.stdout == ""  # no advice
            assert f"could not read an out-of-memory message in {source}" in result.stderr
            # ... and what it looked for
            assert "Tried to allocate" in result.stderr and "KV cache is needed" in result.stderr
            assert "Free memory on device" in result.stderr and "Available memory on node" in result.stderr
            assert "levers" not in result.stderr and "fits" not in result.stderr


def test_doctor_on_a_vllm_startup_error_keeps_the_share_within_free_memory():
    cfg = compose(["model=gemma3_1b", "preset=seed_optimized", "gpu=l4_24g", "backend.name=trl_vllm"])
    msg = (
        "ValueError: Free memory on device (15.00/22.06 GiB) on startup is less than desired GPU memory "
        "utilization (0.8, 17.65 GiB)."
    )
    result = diagnose(with_util(cfg, 0.8), parse_oom_message(msg))
    assert result.deficit_bytes == int(17.65 * GiB) - int(15.0 * GiB)
    assert result.unexplained_bytes > 5 * GiB  # memory held by something else at start-up
    (util,) = [float(o.split("=")[1]) for o in result.overrides if o.startswith("gpu_memory_utilization=")]
    assert util <= 0.65  # at most floor(15 / 22.06, 0.05): the share must fit in what was free


def with_util(cfg, util):
    from grpo_sweep.memory.doctor import with_overrides

    return with_overrides(cfg, {"gpu_memory_utilization": util})


def test_doctor_cli_json_and_text(tmp_path):
    message = tmp_path / "oom.txt"
    message.write_text(SEED_MESSAGE)
    args = ["doctor", "--message", str(message), *SEED_CONFIG]
    js = cli(*args, "--json")
    assert js.returncode == 0, js.stderr
    data = json.loads(js.stdout)
    assert data["parsed"]["requested_bytes"] == int(6.01 * GiB)
    assert data["deficit_bytes"] > 0 and data["overrides"]
    text = cli(*args)
    assert "deficit: 3.29 GiB" in text.stdout
    assert "GiB/%" in text.stdout and " ".join(data["overrides"]) in text.stdout
    # stdin works too
    piped = cli(*args[:2], "-", *SEED_CONFIG, "--json", stdin=TORCH1)
    assert json.loads(piped.stdout)["parsed"]["allocated_by_pytorch_bytes"] == int(14.20 * GiB)


def test_doctor_reads_a_trial_metrics_json(tmp_path):
    from omegaconf import OmegaConf

    run = tmp_path / "run"
    run.mkdir()
    OmegaConf.save(compose(SEED_CONFIG), run / "config.yaml", resolve=True)
    (run / "metrics.json").write_text(json.dumps({"status": "oom", "error": "OutOfMemoryError: " + SEED_MESSAGE}))
    result = cli("doctor", "--message", str(run / "metrics.json"), "--json")
    data = json.loads(result.stdout)
    assert data["parsed"]["free_bytes"] == int(2.72 * GiB) and data["overrides"]
    # Overrides on a saved config are typed as YAML (an int stays an int), groups are refused.
    from grpo_sweep.cli.doctor import load_config

    cfg = load_config(run / "config.yaml", ["per_device_train_batch_size=2", "gradient_checkpointing=true"])
    assert cfg.per_device_train_batch_size == 2 and cfg.gradient_checkpointing is True
    with pytest.raises(ValueError, match="already composed"):
        load_config(run / "config.yaml", ["gpu=t4_16g"])


def test_doctor_bad_input_is_one_clear_line(tmp_path):
    result = cli("doctor", "--message", str(tmp_path / "missing.txt"))
    assert result.returncode == 2 and "no such file" in result.stderr


@pytest.mark.slow
def test_doctor_fix_of_a_real_oom_runs_for_real(tmp_path, monkeypatch):
    """The doctor's advice judged by a real run, not by its own estimate: a tiny trial really runs out
    of memory on a 30.72 MiB simulated card; the doctor reads that trial's metrics.json (and the
    config.yaml beside it), and `--verify` runs a real trial with its overrides, which must finish."""
    from helpers.runners import FAST, train_here

    budget = int(0.03 * 2**30)
    first = train_here([*FAST, "gpu=cpu_sim", "gpu.memory_gib=0.03", f"hydra.run.dir={tmp_path}/oom"])
    record = json.loads((tmp_path / "oom" / "metrics.json").read_text())
    assert record["status"] == "oom", first.stdout[-2000:] + first.stderr[-2000:]
    assert record["requested_bytes"] > record["free_bytes"]
    monkeypatch.chdir(tmp_path)  # the verify trial's run directory is relative to where the doctor runs
    result = cli("doctor", "--message", str(tmp_path / "oom" / "metrics.json"), "--verify", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["overrides"] and not data["fits_as_is"], data
    verified = data["verify"]
    assert verified["status"] == "ok", verified
    assert verified["peak_memory_bytes"] <= budget  # measured under the same simulated card
    # The verify trial really ran the overrides (its own config.yaml), with the same generation batch.
    ran = yaml.safe_load((tmp_path / verified["run_dir"] / "config.yaml").read_text())
    for item in data["overrides"]:
        key, value = item.split("=", 1)
        assert str(ran[key]).lower() == value.lower(), (key, ran[key], value)
    assert ran["per_device_train_batch_size"] * ran["gradient_accumulation_steps"] == 4
    assert ran["gpu"]["memory_gib"] == 0.03


# --- vLLM's start-up and KV-cache errors as vLLM 0.10-0.33 print them --------------------------------
# Each case: where the text comes from, the text, and the numbers it must give (hand-read from the
# text; GiB as vLLM prints it, two decimals). Texts from an issue tracker are quoted as posted (with
# their process tags, timestamps and log prefixes); texts from vLLM's source are its f-string with
# numbers filled in; "FINDINGS" are the vLLM 0.31 CPU build's own messages, as it prints them on a
# 2-core CPU machine.
VLLM_REAL = [
    pytest.param(
        # vllm/v1/core/kv_cache_utils.py `_check_enough_kv_cache_memory` ("models's", before the CPU
        # wording); the same text in vllm-project/tpu-inference#223.
        "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.71 GiB). Based on the available memory, the "
        "estimated maximum model length is 5632. Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine.",
        {
            "form": "vllm_kv_cache",
            "max_seq_len": 131072,
            "kv_cache_needed_bytes": 16 * GiB,
            "kv_cache_available_bytes": int(0.71 * GiB),
            "estimated_max_model_len": 5632,
            "deficit_bytes": pytest.approx(15.29 * GiB, abs=2),  # 16.00 - 0.71
            "kv_cache_too_small": True,
        },
        id="kv_cache_utils-tpu-inference#223",
    ),
    pytest.param(
        # vllm-project/vllm#27508 (gpt-oss-120b on an H100): the EngineCore process tag.
        "(EngineCore_DP0 pid=6880) ValueError: To serve at least one request with the models's max seq len (131072), "
        "(4.54 GiB KV cache is needed, which is larger than the available KV cache memory (1.71 GiB).",
        {
            "form": "vllm_kv_cache",
            "max_seq_len": 131072,
            "kv_cache_needed_bytes": int(4.54 * GiB),
            "kv_cache_available_bytes": int(1.71 * GiB),
            "deficit_bytes": pytest.approx(2.83 * GiB, abs=2),  # 4.54 - 1.71
        },
        id="vllm#27508-engine-core-tag",
    ),
    pytest.param(
        # SergiioB/intel-arc-pro-b70-inference-cookbook#4: a terminal wrapped the line mid-word, the
        # continuation without the process tag.
        "(EngineCore pid=316) ValueError: To serve at least one request with the model's max seq len (100000), (4.26 GiB KV cach\n"
        "e is needed, which is larger than the available KV cache memory (4.25 GiB).",
        {
            "form": "vllm_kv_cache",
            "max_seq_len": 100000,
            "kv_cache_needed_bytes": int(4.26 * GiB),
            "kv_cache_available_bytes": int(4.25 * GiB),
        },
        id="intel-arc-cookbook#4-wrapped-mid-word",
    ),
    pytest.param(
        # FINDINGS: vLLM 0.31 CPU, kv_cache_memory_bytes=262144 for max_model_len 512. The GiB figures
        # round to 0.0: no size is taken from them.
        "[rank0]: ValueError: To serve at least one request with the model's max seq len (512), (0.0 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.0 GiB). Based on the available memory, the "
        "estimated maximum model length is 384. Try increasing `gpu_memory_utilization` (which also controls CPU "
        "memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. See "
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
        {"form": "vllm_kv_cache", "max_seq_len": 512, "estimated_max_model_len": 384, "kv_cache_too_small": True},
        id="FINDINGS-cpu-0.0-GiB",
    ),
    pytest.param(
        # FINDINGS: one block (0 usable): the "Based on the available memory" sentence is left out.
        "ValueError: To serve at least one request with the model's max seq len (512), (0.0 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (0.0 GiB). Try increasing `gpu_memory_utilization` "
        "(which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine.",
        {"form": "vllm_kv_cache", "max_seq_len": 512, "kv_cache_too_small": True},
        id="FINDINGS-cpu-no-estimate",
    ),
    pytest.param(
        # FINDINGS: kv_cache_memory_bytes=0 on the CPU build.
        "[rank0]: ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, despite its "
        "name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
        {"form": "vllm_no_cache_blocks", "no_cache_blocks": True, "kv_cache_available_bytes": 0, "kv_cache_too_small": True},
        id="FINDINGS-cpu-no-cache-blocks",
    ),
    pytest.param(
        # vllm-project/vllm#10439 (V0 worker.py): docker compose's column and V0's logger format.
        "vllm-1  | ERROR 11-18 18:07:28 engine.py:366] ValueError: No available memory for the cache blocks. Try "
        "increasing `gpu_memory_utilization` when initializing the engine.",
        {"form": "vllm_no_cache_blocks", "no_cache_blocks": True, "kv_cache_available_bytes": 0},
        id="vllm#10439-docker-compose",
    ),
    pytest.param(
        # gpustack/gpustack#1800 (vllm/worker/worker.py `raise_if_cache_size_invalid`, V0 engine).
        "ERROR 04-17 15:10:09 [engine.py:448] ValueError: The model's max seq len (8192) is larger than the maximum "
        "number of tokens that can be stored in KV cache (2400). Try increasing `gpu_memory_utilization` or "
        "decreasing `max_model_len` when initializing the engine.",
        {"form": "vllm_kv_tokens", "max_seq_len": 8192, "kv_cache_tokens": 2400, "kv_cache_too_small": True},
        id="gpustack#1800-v0-worker",
    ),
    pytest.param(
        # vllm-project/vllm#25837 (v1 gpu_worker.py, no device name yet).
        "(EngineCore_DP0 pid=17374) ERROR 09-28 15:47:24 [core.py:718] ValueError: Free memory on device (3.22/4.0 GiB) "
        "on startup is less than desired GPU memory utilization (0.9, 3.6 GiB). Decrease GPU memory utilization or "
        "reduce GPU memory used by other processes.",
        {
            "form": "vllm_startup",
            "free_bytes": int(3.22 * GiB),
            "total_bytes": 4 * GiB,
            "gpu_memory_utilization": 0.9,
            "desired_bytes": int(3.6 * GiB),
            "deficit_bytes": pytest.approx(0.38 * GiB, abs=2),  # 3.6 - 3.22
        },
        id="vllm#25837-gpu_worker",
    ),
    pytest.param(
        # QinYang79/ICL#3: a worker process tag with a rank.
        "(VllmWorker rank=0 pid=3926141) ERROR 08-12 01:36:10 [multiproc_executor.py:511] ValueError: Free memory on "
        "device (16.61/23.68 GiB) on startup is less than desired GPU memory utilization (0.8, 18.95 GiB). Decrease "
        "GPU memory utilization or reduce GPU memory used by other processes.",
        {
            "form": "vllm_startup",
            "free_bytes": int(16.61 * GiB),
            "total_bytes": int(23.68 * GiB),
            "desired_bytes": int(18.95 * GiB),
        },
        id="ICL#3-vllmworker-rank-tag",
    ),
    pytest.param(
        # vllm/v1/worker/utils.py `request_memory` (the device named) as in vllm-project/vllm-omni#1842,
        # with its stage tag.
        "(Worker pid=2291010) [Stage-0] ERROR 03-12 08:22:28 [multiproc_executor.py:800] ValueError: Free memory on "
        "device cuda:0 (111.99/139.8 GiB) on startup is less than desired GPU memory utilization (0.95, 132.81 GiB). "
        "Decrease GPU memory utilization or reduce GPU memory used by other processes.",
        {
            "form": "vllm_startup",
            "free_bytes": int(111.99 * GiB),
            "total_bytes": int(139.8 * GiB),
            "gpu_memory_utilization": 0.95,
            "desired_bytes": int(132.81 * GiB),
        },
        id="utils.request_memory-vllm-omni#1842",
    ),
    pytest.param(
        # pytorch/pytorch#175666: the CI log's timestamp and EngineCore tag, the message from its title.
        "[2026-02-24T20:21:58Z] (EngineCore_DP0 pid=6940) ValueError: Free memory on device cuda:0 (19.77/22.05 GiB) "
        "on startup is less than desired GPU memory utilization (0.9, 19.84 GiB).",
        {"form": "vllm_startup", "free_bytes": int(19.77 * GiB), "desired_bytes": int(19.84 * GiB)},
        id="pytorch#175666-ci-timestamp",
    ),
    pytest.param(
        # The same, wrapped by a terminal over three lines, each with the worker's tag and logger prefix.
        "(VllmWorker rank=0 pid=7) ERROR 08-12 01:36:10 [multiproc_executor.py:511] ValueError: Free memory on device\n"
        "(VllmWorker rank=0 pid=7) ERROR 08-12 01:36:10 [multiproc_executor.py:511]  cuda:0 (16.61/23.68 GiB) on startup is\n"
        "(VllmWorker rank=0 pid=7) ERROR 08-12 01:36:10 [multiproc_executor.py:511] less than desired GPU memory utilization (0.8, 18.95 GiB).",
        {
            "form": "vllm_startup",
            "free_bytes": int(16.61 * GiB),
            "total_bytes": int(23.68 * GiB),
            "desired_bytes": int(18.95 * GiB),
        },
        id="startup-wrapped-with-prefixes",
    ),
    pytest.param(
        # vllm/v1/worker/cpu_worker.py `CPUWorker.__init__` (the CPU build's start-up check).
        "ValueError: Available memory on node 0 (10.50/14.34 GiB) on startup is less than desired CPU memory "
        "utilization (0.9, 12.91 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls the fraction "
        "of CPU memory reserved (despite its name).",
        {
            "form": "vllm_cpu_startup",
            "free_bytes": int(10.5 * GiB),
            "total_bytes": int(14.34 * GiB),
            "gpu_memory_utilization": 0.9,
            "desired_bytes": int(12.91 * GiB),
            "deficit_bytes": pytest.approx(2.41 * GiB, abs=2),  # 12.91 - 10.50
        },
        id="cpu_worker-startup",
    ),
    pytest.param(
        # FINDINGS: auto-sized KV with gpu_memory_utilization=0.02: the share (0.29 GiB) is below what the
        # process holds, so the KV share is negative (-0.34 GiB).
        "[rank0]: ValueError: Available memory on node 0 (11.38/14.34 GiB) on kv cache allocation is less than "
        "requested memory for kv (-0.34/0.29 GiB). Reduce CPU memory used by other processes.",
        {
            "form": "vllm_cpu_kv",
            "free_bytes": int(11.38 * GiB),
            "total_bytes": int(14.34 * GiB),
            "kv_cache_requested_bytes": -int(0.34 * GiB),
            "vllm_share_bytes": int(0.29 * GiB),
            "deficit_bytes": int(0.34 * GiB),
            "kv_cache_too_small": True,
        },
        id="FINDINGS-cpu-negative-kv",
    ),
    pytest.param(
        # FINDINGS: explicit kv_cache_memory_bytes larger than the node's free memory.
        "ValueError: Available memory on node 0 (11.89/14.34 GiB) on kv cache allocation is less than requested "
        "memory for kv (93.13 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory "
        "used by other processes.",
        {
            "form": "vllm_cpu_kv",
            "free_bytes": int(11.89 * GiB),
            "kv_cache_requested_bytes": int(93.13 * GiB),
            "deficit_bytes": pytest.approx(81.24 * GiB, abs=2),  # 93.13 - 11.89
        },
        id="FINDINGS-cpu-explicit-kv-too-large",
    ),
]


@pytest.mark.parametrize("text, expected", VLLM_REAL)
def test_vllm_errors_as_printed(text, expected):
    parsed = parse_oom_message(text)
    assert {k: parsed.get(k) for k in expected} == expected, parsed
    if expected.get("form") == "vllm_kv_cache" and "kv_cache_needed_bytes" not in expected:
        # "0.0 GiB" is below the message's precision: no size, no deficit taken from it.
        assert "kv_cache_needed_bytes" not in parsed and "deficit_bytes" not in parsed
    if expected.get("form") == "vllm_cpu_kv" and "vllm_share_bytes" not in expected:
        assert "kv_cache_too_small" not in parsed  # too large for the node, not too small


def test_prefix_stripping_keeps_message_text_that_looks_like_a_tag():
    """A continuation line starting "(40960)," or "(5.62 GiB" is message, not a process tag."""
    text = (
        "ValueError: To serve at least one request with the model's max seq len\n"
        "(40960), (5.62 GiB KV cache is needed, which is larger than the available KV cache memory\n"
        "(4.50 GiB)."
    )
    p = parse_oom_message(text)
    assert (p["max_seq_len"], p["kv_cache_needed_bytes"], p["kv_cache_available_bytes"]) == (
        40960,
        int(5.62 * GiB),
        int(4.5 * GiB),
    )


def _moves(overrides: list[str], backend: str = "trl", device: str = "cuda") -> list[tuple]:
    from grpo_sweep.memory.doctor import candidate_moves

    # One card's moves; the hardware moves (more GPUs, vLLM's own GPU) are tested in test_multi_gpu.py.
    moves = candidate_moves(compose(overrides), backend, device)
    return [(m.group, m.overrides, m.label, m.changes_experiment) for m in moves if not m.needs_hardware]


def test_candidate_moves_by_hand():
    """The doctor's moves for configs worked out by hand: halve the micro-batch while it divides
    (grad-accum multiplied back: the same generation batch), 4-bit only on CUDA and only once, half
    the LoRA rank from rank 8, half the completion budget from 32 tokens, checkpointing unless it is
    on (or Unsloth's own). 4-bit, rank and length change the recipe (levers.KINDS): tried last."""
    # The tiny model on an L4: micro-batch 4, grad-accum 1, rank 16, max_seq_length 96, prompt 32.
    tiny = ["gpu=l4_24g", "gradient_checkpointing=false"]
    assert _moves(tiny) == [
        ("checkpointing", {"gradient_checkpointing": True}, "gradient checkpointing on", False),
        (
            "micro_batch",
            {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2},
            "micro-batch 4 -> 2 (grad-accum x2: same generation batch)",
            False,
        ),
        (
            "micro_batch",
            {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4},
            "micro-batch 4 -> 1 (grad-accum x4: same generation batch)",
            False,
        ),
        ("4bit", {"load_in_4bit": True}, "4-bit NF4 base weights", True),
        ("rank", {"lora_rank": 8}, "LoRA rank 16 -> 8", True),
        ("sequence", {"max_seq_length": 64}, "max_seq_length 96 -> 64 (halves the completion budget)", True),
    ]
    # Micro-batch 6 x grad-accum 2: 6 -> 3 (x2 = 4), and 3 does not halve; rank 8 -> 4 (the lowest
    # rank halved); a completion of exactly 32 tokens still halves: 150 - 118 = 32 -> 118 + 16.
    odd = tiny + ["per_device_train_batch_size=6", "gradient_accumulation_steps=2", "lora_rank=8"]
    odd += ["max_seq_length=150", "max_prompt_length=118"]
    assert [(g, o) for g, o, _, _ in _moves(odd)] == [
        ("checkpointing", {"gradient_checkpointing": True}),
        ("micro_batch", {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 4}),
        ("4bit", {"load_in_4bit": True}),
        ("rank", {"lora_rank": 4}),
        ("sequence", {"max_seq_length": 134}),
    ]
    # Nothing left to halve: micro-batch 1, rank 7, a 31-token completion; 4-bit already on;
    # checkpointing already on.
    done = ["gpu=l4_24g", "gradient_checkpointing=true", "per_device_train_batch_size=1", "gradient_accumulation_steps=4"]
    done += ["lora_rank=7", "max_seq_length=150", "max_prompt_length=119", "load_in_4bit=true"]
    assert _moves(done) == []
    # On CPU there is no 4-bit; Unsloth checkpoints on its own.
    assert [g for g, *_ in _moves(tiny, device="cpu")] == ["checkpointing", "micro_batch", "micro_batch", "rank", "sequence"]
    assert [g for g, *_ in _moves(tiny + ["gpu.memory_gib=null"], backend="unsloth")][:2] == ["micro_batch", "micro_batch"]


def test_candidate_vllm_share_moves():
    """The vLLM share: lowered as far as the KV cache allows (0.05 steps, not below 0.1), or raised by
    the least step that gives the KV cache room when it has none."""
    from grpo_sweep.memory.estimator import estimate

    # The tiny model's whole generation batch needs 96 KiB of KV cache; 0.1 of an L4 (2.2 GiB) holds it.
    (lowered,) = [m for m in _moves(["gpu=l4_24g", "backend.name=trl_vllm"], "trl_vllm") if m[0] == "vllm_share"]
    assert lowered == (
        "vllm_share",
        {"gpu_memory_utilization": 0.1},
        "vLLM share 0.6 -> 0.1 (KV cache still holds the batch)",
        False,
    )
    # No card size: no share to reason about.
    assert not [
        m for m in _moves(["gpu=l4_24g", "gpu.memory_gib=null", "backend.name=trl_vllm"], "trl_vllm") if m[0] == "vllm_share"
    ]
    # Gemma 3 1B at a 0.1 share has no room for its KV cache (test_kv_cache_too_small_is_reported): one step up.
    gemma = ["model=gemma3_1b", "preset=seed_baseline", "gpu=l4_24g", "backend.name=trl_vllm", "gpu_memory_utilization=0.1"]
    assert estimate(compose(gemma)).kv_cache_ok is False
    (raised,) = [m for m in _moves(gemma, "trl_vllm") if m[0] == "vllm_share"]
    assert raised == (
        "vllm_share",
        {"gpu_memory_utilization": 0.15},
        "vLLM share 0.1 -> 0.15 (room for one max_seq_length sequence)",
        False,
    )
    assert estimate(compose([*gemma[:-1], "gpu_memory_utilization=0.15"])).kv_cache_ok


def test_doctor_arithmetic_by_hand():
    """The doctor's bookkeeping on the tiny model (its whole estimate is 0.52 GiB), by hand from the
    message: what the run needed (in use + asked), the 5 % headroom under the card, and the verdict
    when the memory the message proves is in use leaves no room whatever the config."""
    card = 23_686_744_637  # l4_24g: 22.06 GiB
    limit = 22_502_407_405  # int(card x 0.95)
    tiny = compose(["gpu=l4_24g"])
    fits = parse_oom_message(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of "
        "22.06 GiB of which 10.00 GiB is free."
    )
    result = diagnose(tiny, fits)
    need = card - 10 * GiB + 2 * MiB
    assert (result.observed_need_bytes, result.limit_bytes, result.deficit_bytes) == (need, limit, 0)
    total = result.estimate["total_bytes"]
    assert total < 0.6 * GiB and result.unexplained_bytes == need - total  # the rest is not the model's
    assert (result.overrides, result.fits_as_is, result.fits_after) == ([], True, True)
    assert result.after == {"total_bytes": total, "need_bytes": need, "speed_cost_pct": 0.0} and result.fastest is None
    # Without a card size in the config, the message's total is the card.
    unsized = diagnose(compose(["gpu=l4_24g", "gpu.memory_gib=null"]), fits)
    assert unsized.limit_bytes == limit and unsized.fits_as_is
    # 512 MiB asked with 600 MiB free: 21.97 GiB in use + 0.5 GiB = 21.97 GiB needed, 1.09 GiB over the
    # limit: more than the tiny model's whole estimate, so no change to the config can fit.
    full = parse_oom_message(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of "
        "22.06 GiB of which 600.00 MiB is free."
    )
    result = diagnose(tiny, full)
    need = card - 600 * MiB + 512 * MiB
    assert result.observed_need_bytes == need and need - limit > GiB > total
    assert (result.overrides, result.fits_as_is, result.fits_after) == ([], False, False)
    assert result.after is None
    # logits_mode given: said so, and the chunked head offered as an upgrade of its own.
    given = diagnose(tiny, fits, "full")
    assert (given.logits_mode, given.logits_mode_source) == ("full", "given")
    upgrade = "upgrade to TRL >= 1.16 (chunked fused LM head) or Unsloth: no throughput cost"
    assert given.stack_upgrade["fits"] and given.stack_upgrade["what"] == upgrade
    assert result.stack_upgrade is None  # the chunked head is what runs already


def test_doctor_result_fields_by_hand():
    """The doctor's answer as data: where the logits mode came from, each lever row's fields, GiB per
    % of speed only for a lever that costs speed, and no unexplained memory without sizes."""
    result = diagnose(compose(SEED_CONFIG), parse_oom_message(SEED_MESSAGE))
    assert result.logits_mode_source == "inferred from the failed allocation (a tokens x vocab tensor)"
    fields = {"lever", "overrides", "saving_bytes", "speed_cost_pct", "gib_per_pct", "changes_experiment", "needs_hardware"}
    assert result.levers and all(set(row) == fields for row in result.levers)
    for row in result.levers:
        free = row["speed_cost_pct"] <= 0.05
        assert (row["gib_per_pct"] is None) == free, row
        if not free:  # GiB freed per % of speed lost (the % shown is rounded to 0.1)
            cost = row["saving_bytes"] / GiB / row["gib_per_pct"]
            assert abs(cost - row["speed_cost_pct"]) <= 0.05 + 1e-9, row
    assert any(row["gib_per_pct"] is not None for row in result.levers)
    cfg = compose(["model=gemma3_1b", "preset=seed_optimized", "gpu=l4_24g", "backend.name=trl_vllm"])
    no_sizes = diagnose(cfg, parse_oom_message(_kv_error("FINDINGS-cpu-no-cache-blocks")))
    assert no_sizes.observed_need_bytes is None and no_sizes.unexplained_bytes == 0


def test_allowed_vllm_shares_by_hand():
    """The shares a vLLM error allows, in 0.05 steps from the nearest to the current one: up to 0.95
    when the error asks for more, down to 0.1 when the card has less free; each a move that names
    the change. (vllm_limits puts both bounds on the 0.05 grid.)"""
    from types import SimpleNamespace

    from grpo_sweep.memory.doctor import allowed_shares

    def shares(util, lo, hi):
        moves = allowed_shares(SimpleNamespace(gpu_memory_utilization=util), lo, hi)
        assert all(m.group == "vllm_share" and list(m.overrides) == ["gpu_memory_utilization"] for m in moves)
        return [m.overrides["gpu_memory_utilization"] for m in moves]

    assert shares(0.5, 0.7, 0.95) == [0.7, 0.75, 0.8, 0.85, 0.9, 0.95]
    assert shares(0.5, 0.95, 0.95) == [0.95]
    assert shares(0.9, 0.0, 0.35) == [0.35, 0.3, 0.25, 0.2, 0.15, 0.1]
    assert shares(0.9, 0.0, 0.1) == [0.1]
    # Every bound on the grid reaches its end (0.95 or 0.1), whatever the float arithmetic gives.
    for k in range(2, 20):
        bound = round(0.05 * k, 2)
        assert shares(0.05, bound, 0.95)[-1] == 0.95 and shares(0.99, 0.0, bound)[-1] == 0.1, bound
    (move,) = allowed_shares(SimpleNamespace(gpu_memory_utilization=0.5), 0.95, 0.95)
    assert move.label == "vLLM share 0.5 -> 0.95 (within what the vLLM error allows)" and not move.needs_hardware


def test_a_move_fits_up_to_the_limit_and_the_shares_vllm_allows_by_hand():
    """The doctor's judge: a change fits when its need is at most the limit (equal fits) and its vLLM
    share lies within the bounds the error allows (a bound itself is allowed); its speed is priced
    in the logits mode the doctor uses, so no change costs nothing."""
    from grpo_sweep.memory.doctor import _Judge
    from grpo_sweep.memory.estimator import estimate

    cfg = compose(["gpu=l4_24g"])  # a config that fits its card
    util = cfg.gpu_memory_utilization
    for mode in ("full", "chunked"):
        base = estimate(cfg, mode)
        need = _Judge(cfg, base, mode, 0, 10**15, 0.0, 1.0).score({}).need
        assert _Judge(cfg, base, mode, 0, 10**15, 0.0, 1.0).score({}).speed_cost_pct == 0.0
        assert _Judge(cfg, base, mode, 0, need, util, util).score({}).fits  # at the limit, at both bounds
        assert not _Judge(cfg, base, mode, 0, need - 1, util, util).score({}).fits
        assert not _Judge(cfg, base, mode, 0, None, 0.0, 1.0).score({}).fits  # no budget known: never "fits"
        assert not _Judge(cfg, base, mode, 0, need, round(util + 0.05, 2), 1.0).score({}).fits
        assert _Judge(cfg, base, mode, 7, need + 7, util, util).score({}).need == need + 7


# --- the doctor's steps, each by hand -----------------------------------------------------------------


def test_the_vllm_share_is_raised_step_by_step_until_one_sequence_fits():
    """Gemma 3 1B at a 0.1 share of a T4 (14.58 GiB): neither 0.1 nor 0.15 of the card holds one
    max_seq_length sequence beside the weights; 0.2 does. The share climbs in 0.05 steps to the least
    that holds it."""
    from grpo_sweep.memory.estimator import estimate

    gemma = ["model=gemma3_1b", "preset=seed_baseline", "gpu=t4_16g", "backend.name=trl_vllm"]
    assert [estimate(compose([*gemma, f"gpu_memory_utilization={u}"])).kv_cache_ok for u in (0.1, 0.15, 0.2)] == [
        False,
        False,
        True,
    ]
    (raised,) = [m for m in _moves([*gemma, "gpu_memory_utilization=0.1"], "trl_vllm") if m[0] == "vllm_share"]
    assert raised[1:3] == ({"gpu_memory_utilization": 0.2}, "vLLM share 0.1 -> 0.2 (room for one max_seq_length sequence)")


def test_the_vllm_share_is_lowered_to_the_whole_batch_and_to_one_sequence():
    """A generation batch of 64 (micro-batch 4 x grad-accum 16) on an L4: a 0.2 share still holds all
    64 sequences, 0.15 holds 21 (generation in 4 waves), 0.1 none. Both lowered shares are offered,
    the one that keeps the batch first; from a share below 0.5 the same (the steps go down from the
    share, 0.05 at a time)."""
    from grpo_sweep.memory.estimator import estimate

    gemma = ["model=gemma3_1b", "preset=seed_baseline", "gpu=l4_24g", "backend.name=trl_vllm", "gradient_accumulation_steps=16"]
    held = []
    for u in (0.2, 0.15, 0.1):
        e = estimate(compose([*gemma, f"gpu_memory_utilization={u}"]))
        held.append((e.kv_cache_ok, e.assumptions["kv_cache_sequences"], e.assumptions.get("generation_waves")))
    assert held == [(True, 64, 1), (True, 21, 4), (False, 0, None)]
    for start in (0.6, 0.3):
        shares = [m for m in _moves([*gemma, f"gpu_memory_utilization={start}"], "trl_vllm") if m[0] == "vllm_share"]
        assert shares == [
            ("vllm_share", {"gpu_memory_utilization": 0.2}, f"vLLM share {start} -> 0.2 (KV cache still holds the batch)", False),
            (
                "vllm_share",
                {"gpu_memory_utilization": 0.15},
                f"vLLM share {start} -> 0.15 (KV cache holds one sequence: generation in waves)",
                False,
            ),
        ]


def test_the_observed_need_is_in_use_plus_requested_by_hand():
    """In use is the process's own figure when the message states it; the card's total less what
    was free only when it does not; nothing without the request or an in-use figure."""
    from grpo_sweep.memory.doctor import observed_need

    assert observed_need({"requested_bytes": 1, "process_in_use_bytes": 5, "total_bytes": 100, "free_bytes": 10}) == 6
    assert observed_need({"requested_bytes": 1, "total_bytes": 100, "free_bytes": 10}) == 91
    assert observed_need({"requested_bytes": 1, "total_bytes": 100}) is None
    assert observed_need({"requested_bytes": 1, "free_bytes": 10}) is None
    assert observed_need({"process_in_use_bytes": 5, "total_bytes": 100, "free_bytes": 10}) is None


def test_the_deficit_counts_what_the_message_proves_beyond_the_estimate():
    """A message that states in use and requested but no deficit: the deficit is what the run needed
    (22 GiB in use + 1 GiB asked) over the card (22.06 GiB), not the estimate's."""
    card = 23_686_744_637  # l4_24g: 22.06 GiB
    result = diagnose(compose(["gpu=l4_24g"]), {"requested_bytes": GiB, "process_in_use_bytes": 22 * GiB})
    assert result.observed_need_bytes == 23 * GiB
    assert result.unexplained_bytes == 23 * GiB - result.estimate["total_bytes"]
    assert result.deficit_bytes == 23 * GiB - card
    assert not result.fits_after  # the rest is not the model's: no change of it fits


def test_a_vllm_share_above_what_the_error_allows_never_fits():
    """The judge's upper bound: a share above util_max does not fit, however much room there is."""
    from grpo_sweep.memory.doctor import _Judge
    from grpo_sweep.memory.estimator import estimate

    cfg = compose(["gpu=l4_24g"])
    util = cfg.gpu_memory_utilization
    base = estimate(cfg)
    assert _Judge(cfg, base, "chunked", 0, 10**15, 0.0, util).score({}).fits
    assert not _Judge(cfg, base, "chunked", 0, 10**15, 0.0, round(util - 0.05, 2)).score({}).fits


def test_fragmentation_advice_follows_the_config():
    """TORCH2_FULL: 100 MiB reserved but unallocated beside 14.50 GiB allocated, 20 MiB asked: the spare
    memory alone held the request, so expandable_segments is advised, unless the config has it on."""
    parsed = parse_oom_message(TORCH2_FULL)
    advice = diagnose(compose(["gpu=l4_24g"]), parsed).fragmentation
    assert advice["overrides"] == {"expandable_segments": True}
    assert advice["reserved_unallocated_bytes"] == 100 * MiB
    assert advice["share"] == pytest.approx(100 * MiB / (100 * MiB + int(14.5 * GiB)))
    assert diagnose(compose(["gpu=l4_24g", "expandable_segments=true"]), parsed).fragmentation is None


def test_speed_advice_is_priced_in_the_doctors_logits_mode():
    """A 0.15 share holds 21 of 64 sequences (4 waves) and 0.2 the whole batch. With the chunked head
    0.2 still fits and is offered for speed; with full logits (given) 0.2 no longer fits the card, so
    the doctor offers nothing."""
    from grpo_sweep.memory.estimator import estimate

    over = ["model=gemma3_1b", "preset=seed_baseline", "gpu=l4_24g", "backend.name=trl_vllm", "gradient_accumulation_steps=16"]
    cfg = compose([*over, "gpu_memory_utilization=0.15"])
    wider = compose([*over, "gpu_memory_utilization=0.2"])
    assert estimate(wider, "chunked").fits and not estimate(wider, "full").fits
    chunked = diagnose(cfg, {}, "chunked").speed
    assert (chunked["overrides"], chunked["waves"]) == (["gpu_memory_utilization=0.2"], 4) and chunked["speedup_pct"] > 0
    assert diagnose(cfg, {}, "full").speed is None


def test_the_faster_larger_fix_is_offered_when_there_is_one():
    """Gemma 3 1B with vLLM, full logits, 512 MiB asked with 100 MiB free: one change fits (micro-batch
    4 -> 1); two changes (checkpointing on and a 0.15 vLLM share, the micro-batch kept full) fit too and
    cost less speed, so they are offered beside it, with their own need and cost."""
    cfg = compose(["model=gemma3_1b", "preset=seed_baseline", "gpu=l4_24g", "backend.name=trl_vllm"])
    msg = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total "
        "capacity of 22.06 GiB of which 100.00 MiB is free."
    )
    result = diagnose(cfg, parse_oom_message(msg), "full")
    assert result.overrides == ["per_device_train_batch_size=1", "gradient_accumulation_steps=4"]
    faster = result.fastest
    assert faster["overrides"] == ["gradient_checkpointing=true", "gpu_memory_utilization=0.15"]
    assert faster["speed_cost_pct"] < result.after["speed_cost_pct"] - 0.5
    assert faster["need_bytes"] <= result.limit_bytes


def _scored(cost: float, saving: int = 0, fits: bool = True, need: int = 0):
    from types import SimpleNamespace

    from grpo_sweep.memory.doctor import Scored

    return Scored(estimate=SimpleNamespace(total_bytes=need), need=need, fits=fits, speed_cost_pct=cost, saving=saving)


class _TableJudge:
    """A judge whose answers the test writes down: {frozenset(overrides.items()): Scored}; a set it
    does not list does not fit; None (a config `validate` refuses) where the table says so. The search
    and the ranking are the rules under test, so the oracle is the table, not the estimator."""

    def __init__(self, table: dict):
        self.table = {frozenset(k): v for k, v in table.items()}

    def score(self, overrides: dict):
        key = frozenset(overrides.items())
        return self.table[key] if key in self.table else _scored(0.0, fits=False)


def test_the_after_and_faster_entries_by_hand():
    """The chosen set's entry: its estimate, need and cost (to 0.1 %); the faster set only when it is
    more than half a percent faster than the chosen one."""
    from grpo_sweep.memory.doctor import _after, _faster

    assert _after(_scored(12.34, need=7)) == {"total_bytes": 7, "need_bytes": 7, "speed_cost_pct": 12.3}
    chosen = _scored(10.0)
    assert _faster(chosen, ({"lora_rank": 8, "load_in_4bit": True}, _scored(3.46, need=5))) == {
        "overrides": ["lora_rank=8", "load_in_4bit=true"],
        "need_bytes": 5,
        "speed_cost_pct": 3.5,
    }
    assert _faster(chosen, ({"lora_rank": 8}, _scored(9.5))) is None  # only half a percent faster
    assert _faster(chosen, ({"lora_rank": 8}, _scored(9.49)))["speed_cost_pct"] == 9.5


def test_lever_rows_rank_and_round_by_hand():
    """One row per move: knobs first, then more hardware, then recipe changes; within each, free moves
    that save memory first (a cost up to 0.05 % is free), then by GiB per % lost. The cost is shown to
    0.1 %; a move the judge refuses is left out; of the vLLM shares only the nearest and farthest."""
    from grpo_sweep.memory.doctor import Move, lever_rows

    moves = [
        Move("micro_batch", {"per_device_train_batch_size": 2}, "b"),
        Move("checkpointing", {"gradient_checkpointing": True}, "a"),
        Move("vllm_share", {"gpu_memory_utilization": 0.5}, "share 0.5"),
        Move("vllm_share", {"gpu_memory_utilization": 0.4}, "share 0.4"),
        Move("vllm_share", {"gpu_memory_utilization": 0.3}, "share 0.3"),
        Move("gpus", {"trial.num_processes": 2}, "gpus", needs_hardware=True),
        Move("rank", {"lora_rank": 8}, "rank"),
        Move("4bit", {"load_in_4bit": True}, "refused"),
    ]
    judge = _TableJudge(
        {
            (("per_device_train_batch_size", 2),): _scored(12.34, saving=2 * GiB),
            (("gradient_checkpointing", True),): _scored(0.05, saving=GiB),
            (("gpu_memory_utilization", 0.5),): _scored(1.0, saving=GiB),
            (("gpu_memory_utilization", 0.3),): _scored(2.0, saving=4 * GiB),
            (("trial.num_processes", 2),): _scored(0.0, saving=3 * GiB),
            (("lora_rank", 8),): _scored(0.5, saving=GiB),
        }
    )
    judge.table[frozenset({("load_in_4bit", True)})] = None
    rows = lever_rows(moves, judge)
    assert [(r["lever"], r["speed_cost_pct"], r["gib_per_pct"]) for r in rows] == [
        ("a", 0.1, None),  # 0.05 % costs nothing; shown rounded
        ("share 0.3", 2.0, 2.0),
        ("share 0.5", 1.0, 1.0),
        ("b", 12.3, pytest.approx(2 / 12.34)),
        ("gpus", 0.0, None),
        ("rank", 0.5, 2.0),
    ]
    assert [r["overrides"] for r in rows][:2] == [["gradient_checkpointing=true"], ["gpu_memory_utilization=0.3"]]
    assert rows[0]["saving_bytes"] == GiB and rows[-1]["changes_experiment"] and rows[-2]["needs_hardware"]


def test_the_smallest_fix_search_by_hand():
    """The search over a judge the test writes down: every move of a group is tried (one that does not
    fit does not end the group), the first of equally fast fixes of one size is kept; recipe changes
    and more hardware only when nothing on one card fits, more hardware before recipe changes."""
    from grpo_sweep.memory.doctor import Move, smallest_fix

    half = Move("micro_batch", {"per_device_train_batch_size": 2}, "micro-batch 4 -> 2")
    quarter = Move("micro_batch", {"per_device_train_batch_size": 1}, "micro-batch 4 -> 1")
    checkpoint = Move("checkpointing", {"gradient_checkpointing": True}, "checkpointing")
    gpus = Move("gpus", {"trial.num_processes": 2}, "2 GPUs", needs_hardware=True)
    shorter = Move("sequence", {"max_seq_length": 64}, "shorter")
    assert shorter.changes_experiment and not checkpoint.changes_experiment
    # 4 -> 2 does not fit, 4 -> 1 does; checkpointing fits at the same cost: the first found is kept.
    tie = _TableJudge(
        {
            (("per_device_train_batch_size", 1),): _scored(3.0),
            (("gradient_checkpointing", True),): _scored(3.0),
        }
    )
    chosen, fastest = smallest_fix([half, quarter, checkpoint], tie)
    assert chosen[0] == {"per_device_train_batch_size": 1} and fastest[0] == chosen[0]
    # Nothing on one card fits: more GPUs (slower) before a shorter sequence (faster).
    stages = _TableJudge({(("trial.num_processes", 2),): _scored(20.0), (("max_seq_length", 64),): _scored(1.0)})
    assert smallest_fix([half, gpus, shorter], stages)[0][0] == {"trial.num_processes": 2}
    # Only a recipe change fits: it is found.
    recipe = _TableJudge({(("max_seq_length", 64),): _scored(1.0)})
    assert smallest_fix([half, shorter], recipe)[0][0] == {"max_seq_length": 64}
    assert smallest_fix([half], recipe) == (None, None)
