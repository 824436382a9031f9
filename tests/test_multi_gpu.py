"""Trials larger than one GPU: the estimator per rank, the settings, the launch."""

from __future__ import annotations

import math

import pytest
from helpers.config import compose
from helpers.runners import cli, load_metrics, log_text

from grpo_sweep.config.schema import ConfigError
from grpo_sweep.config.validate import validate
from grpo_sweep.memory.estimator import GiB, estimate
from grpo_sweep.memory.shapes import param_counts, shapes

GEMMA = ["model=gemma3_1b", "gpu=l4_24g"]
# Gemma 3 1B by hand: one decoder layer = q 1152x1024 + k, v 1152x256 + o 1024x1152 + MLP 3 x 1152x6912
# + 4 norms x 1152 + q/k norms 2 x 256; the root = embeddings 262144 x 1152 (tied head) + final norm 1152.
GEMMA_LAYER = 1152 * 1024 + 2 * 1152 * 256 + 1024 * 1152 + 3 * 1152 * 6912 + 4 * 1152 + 2 * 256
GEMMA_ROOT = 262144 * 1152 + 1152


def est(*overrides: str, mode: str | None = None):
    return estimate(compose([*GEMMA, *overrides]), mode)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero2", "zero3"])
def test_one_process_is_the_single_process_estimate_whatever_the_strategy(strategy):
    plain = est()
    one = est(f"trial.strategy={strategy}")
    assert one.components == plain.components and one.total_bytes == plain.total_bytes


def test_ddp_is_a_full_replica_plus_buckets_the_size_of_the_gradients():
    one, ddp = est(), est("trial.num_processes=4", "trial.strategy=ddp")
    for key in ("weights", "lora_params", "gradients", "optimizer_state", "activations", "logits"):
        assert ddp.components[key] == one.components[key], key
    assert ddp.components["ddp_buckets"] == one.components["gradients"] > 0
    assert ddp.total_bytes == one.total_bytes + one.components["gradients"]
    assert ddp.assumptions["world_size"] == 4 and ddp.assumptions["single_process_bytes"] == one.total_bytes


@pytest.mark.parametrize("n", [2, 4, 8])
def test_zero2_shards_gradients_and_optimiser_state_only(n):
    full = ["trial.full_finetune=true"]
    one, z2 = est(*full), est(*full, f"trial.num_processes={n}", "trial.strategy=zero2")
    params = 999_885_952
    assert z2.components["weights"] == one.components["weights"] == 2 * params  # replicated, bf16
    assert z2.components["gradients"] == -(-2 * params // n)  # bf16 gradients, 1/n (rank 0 rounds up)
    assert z2.components["optimizer_state"] == -(-12 * params // n)  # fp32 master + 2 moments, 1/n
    assert z2.components["ddp_buckets"] == 1152 * 1152 * 2  # HF's "auto" reduce bucket: hidden^2


@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_fsdp_and_zero3_shard_parameters_and_add_the_gathered_layer(strategy):
    n = 4
    s = shapes(compose(GEMMA), "trl")
    assert 26 * GEMMA_LAYER + GEMMA_ROOT == param_counts(s)["total"] == 999_885_952
    one = est("trial.full_finetune=true")
    r = est("trial.full_finetune=true", f"trial.num_processes={n}", f"trial.strategy={strategy}")
    assert r.peak_phase == "training"
    assert r.components["weights"] == -(-one.components["weights"] // n)
    assert r.components["gradients"] == -(-one.components["gradients"] // n)
    gathered = r.components["gathered_params"]
    if strategy == "fsdp":  # the root unit stays gathered + the running and the prefetched layer
        assert gathered == 2 * (GEMMA_ROOT + 2 * GEMMA_LAYER)
    else:  # the largest module (the embedding) + a 0.9 x hidden^2 prefetch bucket
        assert gathered == 2 * GEMMA_ROOT + int(0.9 * 1152 * 1152) * 2
    assert r.total_bytes < one.total_bytes


def test_zero3_with_hf_generate_gathers_the_whole_model_for_generation():
    r = est("trial.num_processes=4", "trial.strategy=zero3")  # LoRA: training is light, generation is not
    assert r.peak_phase == "generation"
    assert r.components["gathered_params"] == 2 * 999_885_952
    fsdp = est("trial.num_processes=4", "trial.strategy=fsdp")  # summon_full_params(recurse=False): root only
    assert fsdp.total_bytes < r.total_bytes


def test_more_ranks_never_need_more_memory_per_rank_when_sharded():
    # From 2 ranks on: one process runs plain bf16 AdamW, while DeepSpeed adds an fp32 master copy,
    # so ZeRO-2 over 2 ranks can need more than one process (12/2 + 2/2 > 4 + 2 bytes per weight).
    for strategy in ("zero2", "fsdp", "zero3"):
        totals = [
            est("trial.full_finetune=true", f"trial.num_processes={n}", f"trial.strategy={strategy}").total_bytes
            for n in (2, 4, 8)
        ]
        assert all(b <= a for a, b in zip(totals, totals[1:])), (strategy, totals)


def test_full_finetune_trains_every_weight():
    lora, full = est(), est("trial.full_finetune=true")
    params = 999_885_952
    assert full.components["lora_params"] == 0 and full.assumptions["trainable_params"] == params
    assert full.components["gradients"] == 2 * params and full.components["optimizer_state"] == 4 * params
    assert full.components["activations"] > lora.components["activations"]  # every linear saves its input


def test_pre_screen_verdict_follows_the_largest_rank():
    """A full fine-tune of Gemma 3 1B does not fit an 8 GiB card alone; 4 ranks with FSDP do."""
    from hydra_plugins.grpo_optuna_sweeper.outcome import prescreen_verdict

    base = ["trial.full_finetune=true", "gpu.memory_gib=8"]
    one = est(*base)
    four = est(*base, "trial.num_processes=4", "trial.strategy=fsdp")
    assert prescreen_verdict(one.total_bytes, one.budget_bytes, 0.1) is not None  # pruned
    assert prescreen_verdict(four.total_bytes, four.budget_bytes, 0.1) is None  # runs
    assert not one.fits and four.fits and four.budget_bytes == 8 * GiB


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["trial.num_processes=0"], "trial.num_processes=0: must be an integer >= 1"),
        (["trial.strategy=zero4"], "trial.strategy=zero4: must be one of ddp, fsdp, zero2, zero3"),
        (["trial.num_processes=2", "backend=unsloth"], "trial.num_processes=2: not with backend=unsloth"),
        (["trial.num_processes=2", "trial.strategy=zero3"], "trial.strategy=zero3: DeepSpeed ZeRO needs CUDA"),
        (["trial.num_processes=2", "trial.strategy=fsdp"], "trial.strategy=fsdp: accelerate enables FSDP only on accelerators"),
    ],
)
def test_bad_settings_are_one_line_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides), cuda=False)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_zero_needs_deepspeed_installed_on_a_cuda_machine():
    cfg = compose(["trial.num_processes=2", "trial.strategy=zero2"])
    with pytest.raises(ConfigError, match="needs the package deepspeed"):
        validate(cfg, cuda=True, installed=lambda p: p != "deepspeed")
    validate(cfg, cuda=True, installed=lambda p: True)


def test_estimate_cli_prints_the_per_rank_table():
    args = ["estimate", *GEMMA, "trial.num_processes=4", "trial.strategy=zero3"]
    out = cli(*args, "trial.full_finetune=true")
    assert out.returncode == 0, out.stderr
    assert "per rank (4 x zero3)" in out.stdout and "gathered_params" in out.stdout and "1 process" in out.stdout
    one = est("trial.full_finetune=true")
    assert f"{one.total_bytes / GiB:.2f} GiB" in out.stdout  # the one-process column's total


# ----------------------------------------------------------------------------- N processes, for real

from grpo_sweep.metrics import KEYS  # noqa: E402
from grpo_sweep.trial.ranks import command, merge, rank_dir  # noqa: E402

# The default task: the warm model every default trial loads (conftest.warm_model), no build of its own
TINY_DDP = ["trial.steps=2", "trial.num_processes=2", "trial.strategy=ddp"]


def _rank(status="ok", peak=100, tokens=10.0, **extra):
    return {"status": status, "error": None, "peak_memory_bytes": peak, "tokens_per_s": tokens, "samples_per_s": 1.0,
            "tokens_per_step": 50.0, "step_time_s": 2.0, "predicted_peak_bytes": 90, **extra}  # fmt: skip


def test_merge_judges_the_largest_rank_and_counts_throughput_once():
    """Every rank's tokens and samples are already the trial's (TRL gathers the token count; the
    samples are the global generation batch): the trial's throughput is the slowest rank's, not a sum."""
    out = merge([_rank(peak=100, tokens=10.0), _rank(peak=130, tokens=12.0, step_time_s=3.0, peak_phase="backward")], 2, "ddp")
    assert out["status"] == "ok" and out["error"] is None
    assert out["rank_peak_memory_bytes"] == [100, 130] and out["peak_memory_bytes"] == 130 and out["peak_rank"] == 1
    assert out["peak_phase"] == "backward"  # the largest rank's own breakdown and phase
    assert out["tokens_per_s"] == 10.0 and out["samples_per_s"] == 1.0 and out["tokens_per_step"] == 50.0
    assert out["step_time_s"] == 3.0  # the slowest rank: they wait for each other
    assert out["world_size"] == 2 and out["strategy"] == "ddp" and set(out) <= KEYS


def test_merge_an_oom_on_any_rank_is_the_trials_oom_with_that_ranks_message():
    stopped = _rank("failed", error="TrialStopped: the trial process received SIGTERM")
    oom = _rank(
        "oom",
        error="OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        requested_bytes=2 << 30,
        oom_phase="backward",
    )
    out = merge([stopped, oom], 2, "fsdp")
    assert out["status"] == "oom" and out["error"].startswith("rank 1: OutOfMemoryError: CUDA out of memory")
    assert out["requested_bytes"] == 2 << 30 and out["oom_phase"] == "backward"
    assert out["rank_status"] == ["failed", "oom"]
    # A crash: the rank that failed first is the cause, not the one torchrun stopped afterwards.
    crash = _rank("failed", error="RuntimeError: boom")
    assert merge([stopped, crash], 2, "ddp")["error"] == "rank 1: RuntimeError: boom"
    # A rank that left nothing: the trial failed, and says which.
    out = merge([_rank(), None], 2, "ddp", launcher_exitcode=1)
    assert out["status"] == "failed" and "ranks [1] left no metrics.json" in out["error"] and out["tokens_per_s"] is None


def test_the_launch_is_torchrun_with_one_rank_per_process():
    cmd = command(compose(TINY_DDP), "/runs/x")
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node=2" in cmd and "--max-restarts=0" in cmd
    assert cmd[-3:] == ["-m", "grpo_sweep.trial.rank", "/runs/x"]


def _check_rank_records(m: dict, n: int, strategy: str) -> list[float]:
    assert set(m) <= KEYS, sorted(set(m) - KEYS)  # every key declared in metrics.TrialMetrics
    assert m["world_size"] == n and m["strategy"] == strategy and m["rank_status"] == ["ok"] * n
    peaks, predicted = m["rank_peak_memory_bytes"], m["rank_predicted_peak_bytes"]
    assert len(peaks) == n and all(p and p > 0 for p in peaks) and m["peak_memory_bytes"] == max(peaks)
    assert m["memory_source"] == "cpu-tracker"
    assert m["tokens_per_s"] == pytest.approx(min(m["rank_tokens_per_s"]))  # counted once
    return [(pr - p) / p for p, pr in zip(peaks, predicted)]


def test_completions_per_step_counts_every_rank():
    """completions_per_step is the optimiser step's across all processes: the accumulation is
    completions_per_step / (batch x N), TRL's generation batch is the recipe's, and a split that
    batch x N does not divide is refused naming what is allowed."""
    from grpo_sweep.config.schema import ConfigError
    from grpo_sweep.config.split import generation_batch_size, split_of
    from grpo_sweep.config.validate import validate
    from grpo_sweep.levers import recipe_of
    from grpo_sweep.trial.backends.trl import grpo_args

    held = ["completions_per_step=8", "per_device_train_batch_size=2"]
    for n, accum in ((1, 4), (2, 2), (4, 1)):
        cfg = compose([*held, f"trial.num_processes={n}"])
        assert split_of(cfg) == (2, accum) and generation_batch_size(cfg) == 8, n
        assert recipe_of(cfg)["completions_per_step"] == 8
        args = grpo_args(validate(cfg), on_cuda=False, output_dir="/tmp/x")
        assert args["gradient_accumulation_steps"] == accum and args["generation_batch_size"] == 8
    with pytest.raises(ConfigError) as err:
        split_of(compose(["completions_per_step=8", "per_device_train_batch_size=8", "trial.num_processes=2"]))
    assert str(err.value) == (
        "per_device_train_batch_size=8 x trial.num_processes=2 does not divide completions_per_step=8 "
        "(gradient_accumulation_steps = completions_per_step / (per_device_train_batch_size x 2 processes)); "
        "allowed per_device_train_batch_size here: [1, 2, 4]"
    )
    # Without a held completions_per_step, the recipe's is what N ranks train together.
    assert recipe_of(compose(["per_device_train_batch_size=4", "trial.num_processes=2"]))["completions_per_step"] == 8


# 8 completions per step, held: one process accumulates 4 micro-batches of 2, two processes 2 each.
HELD_8 = ["trial.steps=2", "completions_per_step=8", "per_device_train_batch_size=2"]
PROCS = pytest.mark.xdist_group("procs")  # one worker builds procs_sweep and runs both of its tests


@pytest.fixture(scope="module")
def procs_sweep(tmp_path_factory):
    """(sweep dir, finished train.py run) of a grid sweep with trial.num_processes and
    trial.strategy as knobs: one trial of one process and one of two ranks over gloo, the same recipe
    (HELD_8). Both tests below read it: the two-rank trial (two ranks that import torch and TRL) is
    the costly part."""
    from helpers.runners import sweep_args, train_here

    root = tmp_path_factory.mktemp("procs")
    conf = root / "conf"
    (conf / "sweeps").mkdir(parents=True)
    (conf / "sweeps" / "procs_cpu.yaml").write_text(
        "# @package _global_\n"
        "defaults:\n  - override /gpu: cpu_sim\n  - override /hydra/sweeper: grpo_optuna\n"
        "gpu:\n  memory_gib: 0.25\nnum_generations: 2\ntrial:\n  steps: 2\n"
        "hydra:\n  sweeper:\n    study_name: procs_cpu\n    sampler: grid\n    n_trials: 2\n"
        "    params:\n      trial.num_processes: choice(1, 2)\n      trial.strategy: choice(ddp)\n"
    )
    sweep_dir = root / "sweep"
    result = train_here(sweep_args(sweep_dir, f"hydra.searchpath=[file://{conf}]", *HELD_8, sweep="procs_cpu", file_space=True))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return sweep_dir, result


def _trials_by_processes(sweep_dir) -> dict:
    """{trial.num_processes: the study's trial} of procs_sweep."""
    from helpers.studies import counted, load_study

    return {
        t.params["trial.num_processes"]: t for t in counted(load_study(f"journal:{sweep_dir / 'study.journal'}", "procs_cpu"))
    }


@PROCS
@pytest.mark.slow
def test_one_and_two_processes_train_the_same_recipe(procs_sweep):
    """A one-process and a two-process trial over gloo (procs_sweep) at completions_per_step=8: per
    optimiser step both train 8 completions and the same tokens, and the trial counts its throughput
    once (the two-process trial's tokens/s is not the ranks' sum). Over 20 s: the first of the two
    tests to run builds procs_sweep (two ranks import torch and TRL)."""
    from pathlib import Path

    trials = _trials_by_processes(procs_sweep[0])
    dirs = {n: Path(t.user_attrs["run_dir"]) for n, t in trials.items()}
    records = {n: load_metrics(d) for n, d in dirs.items()}
    for n in (1, 2):
        assert records[n]["status"] == "ok", records[n]["error"]
    one, two = records[1], records[2]
    assert one["effective"]["generation_batch_size"] == two["effective"]["generation_batch_size"] == 8
    assert one["effective"]["gradient_accumulation_steps"] == 4
    for k in range(2):
        rank = load_metrics(dirs[2] / "ranks" / str(k))
        assert rank["effective"]["gradient_accumulation_steps"] == 2 and rank["effective"]["per_device_train_batch_size"] == 2
    # Worst-case lengths: every completion is max_seq_length tokens, so a step's tokens are the recipe's.
    for m in (one, two):
        assert [r["samples"] for r in m["history"]] == [8, 8]
        assert all(r["tokens"] == 8 * 96 for r in m["history"]), m["history"]
        assert m["recipe"]["completions_per_step"] == 8
        assert sum(r["samples"] for r in m["history"]) == 2 * 8  # the trained total: steps x the recipe
    assert two["tokens_per_step"] == one["tokens_per_step"] == 8 * 96
    assert two["tokens_per_s"] == pytest.approx(two["tokens_per_step"] / two["step_time_s"], rel=0.35)
    # The two-process trial over gloo: each rank its own record, two steps, a reward; the estimate per
    # rank within 10 %; DDP's gradient buckets are real (the tracker sees the adapters' gradient bytes
    # once more than one process: the prediction's ddp_buckets term).
    errors = _check_rank_records(two, 2, "ddp")  # tokens/s counted once: the slowest rank's
    assert all(abs(e) <= 0.10 for e in errors), errors
    for k in range(2):
        rank = load_metrics(dirs[2] / "ranks" / str(k))
        assert rank["steps"] == 2 and rank["reward_mean"] is not None and rank["effective"]["generation_batch_size"] == 8
    assert two["predicted_peak_breakdown"]["ddp_buckets"] == two["predicted_peak_breakdown"]["gradients"] > 0
    assert two["peak_memory_breakdown"]["weights"] > 0 and two["peak_memory_breakdown"]["trainable_params"] > 0


@pytest.mark.slow
def test_an_oom_on_one_rank_makes_the_trial_oom_with_that_ranks_message(tmp_path):
    """Over 20 s: a two-process trial: torchrun starts two ranks that each import torch and TRL from scratch."""
    from helpers.runners import load_metrics, train_here

    args = [*TINY_DDP, "trial.debug_fault=oom", "trial.debug_fault_rank=1", f"hydra.run.dir={tmp_path}"]
    out = train_here(args)
    assert out.returncode == 0, out.stderr[-3000:]
    m = load_metrics(tmp_path)
    assert m["status"] == "oom" and m["error"].startswith("rank 1: "), m["error"]
    assert "can't allocate memory" in m["error"] or "out of memory" in m["error"].lower()
    assert m["rank_status"][1] == "oom" and m["rank_status"][0] != "ok"  # rank 0 was stopped, not left waiting


def test_fsdp_and_zero_arguments_for_the_trainer():
    """What a rank hands GRPOConfig for each strategy (FSDP2, one unit per decoder layer; DeepSpeed
    with HF's "auto" values); GRPOConfig itself turns the FSDP request into accelerate's plugin."""
    from trl import GRPOConfig

    from grpo_sweep.trial.backends.trl import grpo_args

    def args(strategy, n=2):
        cfg = compose([f"trial.num_processes={n}", f"trial.strategy={strategy}", "per_device_train_batch_size=4"])
        return grpo_args(cfg, on_cuda=False, output_dir="/tmp/unused")

    assert args("ddp")["ddp_find_unused_parameters"] is False and args("ddp")["generation_batch_size"] == 8
    assert "fsdp" not in args("ddp", n=1) and args("ddp", n=1)["generation_batch_size"] == 4
    fsdp = GRPOConfig(**args("fsdp"))
    assert fsdp.fsdp_plugin_args["fsdp_version"] == 2
    assert (
        fsdp.fsdp_plugin_args["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP" and fsdp.fsdp_plugin_args["reshard_after_forward"]
    )
    for strategy, stage in (("zero2", 2), ("zero3", 3)):
        ds = args(strategy)["deepspeed"]
        assert ds["zero_optimization"]["stage"] == stage and ds["train_micro_batch_size_per_gpu"] == "auto"
    assert "stage3_prefetch_bucket_size" in args("zero3")["deepspeed"]["zero_optimization"]


@pytest.mark.slow
def test_fsdp_on_cpu_is_refused_by_the_rank_when_accelerate_falls_back_to_ddp(tmp_path):
    """The launch path of an FSDP trial, run for real on CPU past the settings check: torch's FSDP2
    runs on CPU over gloo, but accelerate 1.x enables FSDP only on accelerators and would train DDP.
    Each rank reads back how accelerate distributes the trainer and fails rather than mislabel.
    Over 20 s: a two-process trial: torchrun starts two ranks that each import torch and TRL from
    scratch and build the trainer before the refusal."""
    from grpo_sweep.trial.parent import run_trial

    cfg = compose(["trial.steps=2", "trial.num_processes=2", "trial.strategy=fsdp"])
    m = run_trial(cfg, tmp_path)
    assert m["status"] == "failed" and m["world_size"] == 2 and m["strategy"] == "fsdp"
    assert "trial.strategy=fsdp did not take effect: accelerate distributes this trainer as ddp" in m["error"], m["error"]


# ----------------------------------------------------------------------------- vLLM server mode


def test_server_mode_takes_the_pool_off_the_training_card():
    colocate = est("backend=trl_vllm")
    server = est("backend=trl_vllm", "backend.vllm_mode=server")
    pool = math.ceil(0.6 * server.budget_bytes)  # gpu_memory_utilization x the L4's budget (vLLM's request_memory)
    assert colocate.components["vllm_pool"] == pool and server.components["vllm_pool"] == 0
    assert server.assumptions["vllm_server_bytes"] == pool and server.assumptions["vllm_mode"] == "server"
    assert server.total_bytes == colocate.total_bytes - pool
    out = cli("estimate", *GEMMA, "backend=trl_vllm", "backend.vllm_mode=server")
    assert out.returncode == 0 and "vLLM server (backend.vllm_mode=server" in out.stdout, out.stderr


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["backend.vllm_mode=remote"], "backend.vllm_mode=remote: must be one of colocate, server"),
        (["backend=trl", "backend.vllm_mode=server"], "backend.vllm_mode=server: needs backend=trl_vllm"),
        (
            ["backend=trl_vllm", "backend.vllm_tensor_parallel_size=0"],
            "backend.vllm_tensor_parallel_size=0: must be an integer >= 1",
        ),
        (
            ["backend=trl_vllm", "backend.vllm_mode=server", "backend.vllm_tensor_parallel_size=2", "trial.vllm_devices=[3]"],
            "backend.vllm_tensor_parallel_size=2: more than the 1 trial.vllm_devices=[3]",
        ),
        (  # the colocated engine is built without it: refused, not ignored
            ["backend=trl_vllm", "backend.vllm_tensor_parallel_size=2"],
            "backend.vllm_tensor_parallel_size=2: only with backend.vllm_mode=server (the colocated engine runs in each "
            "training process, tensor parallel 1; got vllm_mode=colocate); use 1",
        ),
    ],
)
def test_bad_server_settings_are_one_line(overrides, needle):
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides), cuda=True)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_server_command_is_trls_own_through_the_shim():
    from grpo_sweep.trial.vllm_server import command, environment

    cfg = compose(
        ["backend=trl_vllm", "backend.vllm_mode=server", "backend.vllm_tensor_parallel_size=2", "trial.vllm_devices=[2,3]"]
    )
    cmd = command(cfg, "/models/x", 8123, on_cuda=True)
    assert cmd[1:5] == ["-m", "grpo_sweep.trial.vllm_serve", "serve", "/models/x"]
    joined = " ".join(cmd)
    assert "--tensor-parallel-size 2" in joined and "--port 8123" in joined and "--max-model-len 96" in joined
    assert "--weight-transfer-config" in joined and "--kv-cache-memory-bytes" not in joined  # TRL's settings
    assert environment(cfg, on_cuda=True)["CUDA_VISIBLE_DEVICES"] == "2,3"
    cpu = command(cfg, "/models/x", 8123, on_cuda=False, kv_cache_bytes=12345)
    assert "--dtype float32" in " ".join(cpu) and cpu[-2:] == ["--kv-cache-memory-bytes", "12345"]
    assert environment(cfg, on_cuda=False)["VLLM_TARGET_DEVICE"] == "cpu"
    # no engine setting given: none of their flags (TRL's and vLLM's defaults, as before they existed)
    assert not any(f in joined for f in ("--max-num-seqs", "--max-num-batched-tokens", "prefix-caching", "--enforce-eager"))
    assert "--kv-cache-dtype auto" in joined


def test_engine_settings_on_the_server_command_line():
    from grpo_sweep.trial.vllm_server import command

    engine = [
        "backend.vllm_max_num_seqs=8",
        "backend.vllm_max_num_batched_tokens=512",
        "backend.vllm_enable_prefix_caching=false",
        "backend.vllm_enforce_eager=true",
        "backend.vllm_kv_cache_memory_bytes=65536",
        "backend.vllm_kv_cache_dtype=fp8",
    ]
    cfg = compose(["backend=trl_vllm", "backend.vllm_mode=server", *engine])
    joined = " ".join(command(cfg, "/models/x", 8123, on_cuda=True, kv_cache_bytes=65536))
    for flag in ("--max-num-seqs=8", "--max-num-batched-tokens=512", "--no-enable-prefix-caching", "--enforce-eager"):
        assert flag in joined, flag
    assert "--kv-cache-dtype fp8" in joined and "--kv-cache-memory-bytes 65536" in joined
    # CPU: eager by default; backend.vllm_enforce_eager=false lets vLLM-CPU compile (no --enforce-eager)
    lazy = compose(["backend=trl_vllm", "backend.vllm_mode=server", "backend.vllm_enforce_eager=false"])
    assert "--enforce-eager" not in command(lazy, "/m", 1, on_cuda=False)
    assert "--enforce-eager" in command(compose(["backend=trl_vllm", "backend.vllm_mode=server"]), "/m", 1, on_cuda=False)


def test_export_says_how_to_pass_engine_settings():
    from grpo_sweep.report.export import engine_notes

    settings = {"model_name_or_path": "org/m"}
    assert engine_notes({"backend": {"name": "trl_vllm", "vllm_max_num_seqs": None}}, settings) == []
    server = {"backend": {"vllm_mode": "server", "vllm_max_num_seqs": 8, "vllm_enable_prefix_caching": False}}
    (line,) = engine_notes(server, settings)
    assert "`trl vllm-serve --model org/m --max-num-seqs 8 --enable-prefix-caching false`" in line
    (colocate,) = engine_notes({"backend": {"vllm_kv_cache_dtype": "fp8"}}, {})
    assert "--kv-cache-dtype fp8" in colocate and "colocate mode cannot pass them" in colocate


# ----------------------------------------------------------------------------- SLURM


def test_grpo_slurm_launcher_asks_slurm_for_a_gpu_per_rank():
    """hydra/launcher=grpo_slurm: submitit_slurm with one task per trial and trial.num_processes GPUs."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from grpo_sweep.config.compose import CONF_DIR
    from grpo_sweep.config.schema import register

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("train", overrides=["hydra/launcher=grpo_slurm", "trial.num_processes=4"], return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert launcher["gpus_per_node"] == 4 and launcher["tasks_per_node"] == 1


@pytest.mark.parametrize(
    ("overrides", "gpus"),
    [
        (["trial.num_processes=2"], 2),
        (["trial.num_processes=choice(1,4,2)"], 4),  # a knob: the largest, submitit asks once per sweep
        (["trial.num_processes=2", "backend=trl_vllm", "backend.vllm_mode=server", "trial.vllm_devices=[2]"], 3),
        (["trial.num_processes=4", "hydra.launcher.gpus_per_node=8"], None),  # the user's own value stands
    ],
)
def test_submitit_slurm_gets_a_gpu_per_rank_from_the_sweeper(overrides, gpus):
    """Plain hydra/launcher=submitit_slurm under our sweeper: one task per trial and GPUs for the
    largest trial.num_processes (+ the vLLM server's devices), set before Hydra builds the launcher."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from grpo_sweep.config.compose import CONF_DIR
    from grpo_sweep.config.schema import register
    from hydra_plugins.grpo_optuna_sweeper.launch_config import slurm_resources

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        base = ["+sweeps=tiny_cpu", "hydra/launcher=submitit_slurm"]
        values = [o for o in overrides if "choice(" not in o]
        cfg = hydra_compose("train", overrides=[*base, *values], return_hydra_config=True)
        swept = [o for o in overrides if "choice(" in o]
        if swept:  # a command-line sweep override, as Hydra hands it to the sweeper
            cfg.hydra.overrides.task = list(cfg.hydra.overrides.task) + swept
    assert slurm_resources(cfg) == gpus
    expected = 8 if gpus is None else gpus
    assert cfg.hydra.launcher.gpus_per_node == expected
    if gpus is not None:
        assert cfg.hydra.launcher.tasks_per_node == 1


# ----------------------------------------------------------------------------- the doctor


def test_doctor_proposes_gpus_with_fsdp_when_one_card_cannot_fit():
    """A full fine-tune of Gemma 3 1B on an 8 GiB card: no lever on one card fits (weights, gradients
    and AdamW state alone are ~7.5 GiB), so the doctor proposes sharding over 2 GPUs with FSDP."""
    from grpo_sweep.cli.doctor import format_report
    from grpo_sweep.memory.doctor import diagnose

    cfg = compose([*GEMMA, "trial.full_finetune=true", "gpu.memory_gib=8"])
    r = diagnose(cfg, {})
    assert r.fits_after and r.overrides == ["trial.num_processes=2", "trial.strategy=fsdp"], r.overrides
    text = format_report(r)
    assert "use 2 GPUs with FSDP" in text and "[needs more GPUs]" in text


def test_doctor_proposes_moving_vllm_to_its_own_gpu():
    """vLLM colocate with a large share on a small card: moving vLLM to its own GPU frees the pool."""
    from grpo_sweep.memory.doctor import diagnose

    cfg = compose([*GEMMA, "backend=trl_vllm", "gpu.memory_gib=8", "gpu_memory_utilization=0.6", "trial.full_finetune=true"])
    r = diagnose(cfg, {})
    levers = {row["lever"]: row for row in r.levers}
    server = next(v for k, v in levers.items() if k.startswith("move vLLM to its own GPU"))
    assert server["needs_hardware"] and "backend.vllm_mode=server" in server["overrides"]
    assert server["saving_bytes"] == int(0.6 * cfg.gpu.memory_gib * GiB) or server["saving_bytes"] > 4 * GiB


def test_doctor_keeps_one_card_fixes_first():
    """When a lever on one card fits, the doctor never asks for more hardware."""
    from grpo_sweep.memory.doctor import diagnose

    r = diagnose(compose([*GEMMA, "preset=seed_baseline", "gpu.memory_gib=6"]), {})
    assert r.fits_after and not any("num_processes" in o or "vllm_mode" in o for o in r.overrides), r.overrides


def test_hardware_moves_by_hand():
    from grpo_sweep.memory.doctor import candidate_moves

    moves = [m for m in candidate_moves(compose([*GEMMA, "backend=trl_vllm"]), "trl_vllm", "cuda") if m.needs_hardware]
    assert [m.overrides for m in moves] == [
        {"trial.num_processes": 2, "trial.strategy": "fsdp"},
        {"trial.num_processes": 4, "trial.strategy": "fsdp"},
        {"trial.num_processes": 8, "trial.strategy": "fsdp"},
        {"backend.vllm_mode": "server", "trial.vllm_devices": [1]},
    ]
    assert not [m for m in candidate_moves(compose(GEMMA), "trl", "cpu") if m.needs_hardware]  # no GPUs to add on CPU
    two = compose([*GEMMA, "backend=trl_vllm", "trial.num_processes=2"])
    assert [m.overrides for m in candidate_moves(two, "trl_vllm", "cuda") if m.needs_hardware] == [
        {"backend.vllm_mode": "server", "trial.vllm_devices": [2]}  # the GPU after the ranks' 0 and 1
    ]


# ----------------------------------------------------------------------------- a sweep over the processes


@PROCS
@pytest.mark.slow
def test_sweep_with_processes_and_strategy_as_knobs(procs_sweep):
    """trial.num_processes and trial.strategy in the search space (procs_sweep: grid, 2 points): both
    trials run, trials.csv, the printed summary and report.html show the strategy and the per-rank peaks."""
    import csv

    from helpers.studies import counted, load_study

    tmp_path, result = procs_sweep
    trials = counted(load_study(f"journal:{tmp_path / 'study.journal'}", "procs_cpu"))
    assert sorted(t.params["trial.num_processes"] for t in trials) == [1, 2]
    assert all(t.user_attrs["status"] == "ok" for t in trials), [t.user_attrs.get("error") for t in trials]
    two = next(t for t in trials if t.params["trial.num_processes"] == 2)
    assert two.user_attrs["world_size"] == 2 and two.user_attrs["strategy"] == "ddp"
    for t in trials:  # one recipe: the same completions per optimiser step, however many processes
        assert load_metrics(t.user_attrs["run_dir"])["effective"]["generation_batch_size"] == 8
    assert len(two.user_attrs["rank_peak_memory_bytes"]) == 2
    rows = {int(r["world_size"]): r for r in csv.DictReader(open(tmp_path / "trials.csv"))}
    assert set(rows) == {1, 2} and rows[2]["strategy"] == "ddp" and len(rows[2]["rank_peak_memory_bytes"].split()) == 2
    assert "2 x ddp" in result.stdout  # the summary table's ranks column
    html = (tmp_path / "report.html").read_text()
    assert "per-rank peak GiB" in html and "strategy" in html


def _rank_log(run_dir, rank: int) -> str:
    return log_text(rank_dir(run_dir, rank) / "trial.log")


@pytest.mark.slow
def test_a_two_process_trial_past_its_timeout_is_stopped_and_says_so(tmp_path, warm_model, deadline_when):
    """trial.timeout_s bounds the whole group: the parent's SIGTERM reaches torchrun and the ranks,
    the trial is `timeout`, and no rank outlives it. The deadline passes once both ranks hang
    (conftest.deadline_when), whatever time two ranks need to start torch and TRL from scratch on this
    machine (over 14 s on an idle 2-core one from a cold forkserver)."""
    import psutil

    from grpo_sweep.trial.parent import run_trial

    def both_hang() -> bool:
        return all("hanging until stopped" in _rank_log(tmp_path, k) for k in range(2))

    deadline_when(both_hang, 30)
    cfg = compose([*TINY_DDP, "trial.debug_fault=hang", "trial.timeout_s=30"])
    m = run_trial(cfg, tmp_path)
    assert m["status"] == "timeout" and "trial.timeout_s=30" in m["error"]
    assert m["world_size"] == 2 and len(m["rank_status"]) == 2
    hung = [k for k in range(2) if "hanging until stopped" in _rank_log(tmp_path, k)]
    assert hung == [0, 1], "both ranks were stopped while hanging, not before they got there"
    ranks = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not ranks, ranks
