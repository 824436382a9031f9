"""Bad input is rejected with the key and the allowed values, before any trial starts."""

from __future__ import annotations

import pytest
from helpers.config import compose
from helpers.runners import train_here

from grpo_sweep.config.local import installed, validate_here
from grpo_sweep.config.schema import ConfigError
from grpo_sweep.config.validate import validate


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["gpu_memory_utilization=1.0"], "gpu_memory_utilization=1.0: must be strictly between 0 and 1"),
        (["gpu_memory_utilization=0"], "gpu_memory_utilization"),
        (["per_device_train_batch_size=0"], "per_device_train_batch_size=0: must be a positive"),
        (["max_seq_length=-5"], "max_seq_length=-5"),
        (["lora_rank=0"], "lora_rank=0"),
        (["num_generations=1"], "num_generations=1: must be >= 2"),
        (["num_generations=3"], "allowed num_generations here: [2, 4]"),
        (["max_prompt_length=96"], "max_prompt_length=96 must be < max_seq_length=96"),
        (["backend.name=foo"], "backend.name=foo: must be one of auto, trl, trl_vllm, unsloth"),
    ],
)
def test_validate_names_key_and_allowed(overrides, needle):
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides), cuda=False)
    assert needle in str(err.value)


def test_cuda_only_levers_need_cuda():
    with pytest.raises(ConfigError, match="load_in_4bit=true"):
        validate(compose(["quant=nf4"]), cuda=False)
    with pytest.raises(ConfigError, match="backend=unsloth"):
        validate(compose(["backend.name=unsloth"]), cuda=False)
    if installed("bitsandbytes"):
        validate_here(compose(["quant=nf4"]), cuda=True)  # allowed where CUDA exists
    else:  # ... and bitsandbytes is installed (the message says so, before any model loads)
        with pytest.raises(ConfigError, match="not installed: bitsandbytes"):
            validate_here(compose(["quant=nf4"]), cuda=True)


@pytest.mark.parametrize("optim", ["adamw_8bit", "paged_adamw_32bit"])
def test_a_bitsandbytes_optimiser_needs_bitsandbytes_before_loading(optim):
    """The 8-bit and paged optimisers are bitsandbytes': without it the config is refused in one
    line naming optim, the package and the optimisers that need none, before any model loads."""
    cfg = compose([f"optim={optim}"])
    with pytest.raises(ConfigError) as err:
        validate(cfg, cuda=False, installed=lambda package: package != "bitsandbytes")
    line = str(err.value)
    assert line.startswith(f"optim={optim}: needs the package bitsandbytes") and "adamw_torch_fused" in line
    assert "\n" not in line
    validate(cfg, cuda=False, installed=lambda package: True)
    validate(compose(["optim=adamw_torch_fused"]), cuda=False, installed=lambda package: package != "bitsandbytes")


def test_groups_set_top_level_levers():
    cfg = compose(["preset=seed_optimized", "lora=all_linear"])
    assert (cfg.max_seq_length, cfg.per_device_train_batch_size, cfg.load_in_4bit) == (512, 2, True)
    assert len(cfg.lora_target_modules) == 7 and cfg.lora_rank == 16
    # An explicit key beats any group.
    assert compose(["preset=seed_baseline", "lora_rank=8"]).lora_rank == 8


def test_model_groups_carry_real_architecture():
    gemma = compose(["model=gemma3_1b"]).model.arch
    assert (gemma.hidden_size, gemma.num_hidden_layers, gemma.head_dim, gemma.vocab_size) == (1152, 26, 256, 262144)
    qwen = compose(["model=qwen2_5_0_5b"]).model.arch
    assert (qwen.hidden_size, qwen.num_attention_heads, qwen.num_key_value_heads) == (896, 14, 2)
    llama = compose(["model=llama3_2_1b"]).model.arch
    assert (llama.hidden_size, llama.intermediate_size, llama.vocab_size) == (2048, 8192, 128256)


def test_cli_rejects_before_any_trial(tmp_path):
    result = train_here(["num_generations=3", f"hydra.run.dir={tmp_path}/run"])
    assert result.returncode != 0
    assert "num_generations=3" in result.stderr + result.stdout
    assert not (tmp_path / "run" / "metrics.json").exists()
    assert "[trial]" not in result.stdout


def test_cli_unknown_group_choice_lists_options(tmp_path):
    result = train_here(["model=gpt5", f"hydra.run.dir={tmp_path}/run"])
    assert result.returncode != 0
    text = result.stderr + result.stdout
    assert "model/gpt5" in text and "tiny" in text and "gemma3_1b" in text


def test_cli_type_error_names_key(tmp_path):
    result = train_here(["lora_rank=big", f"hydra.run.dir={tmp_path}/run"])
    assert result.returncode != 0
    assert "lora_rank" in result.stderr + result.stdout


def test_a_card_without_speed_numbers_is_an_error_not_the_l4():
    """Each card's numbers live in its conf/gpu/*.yaml only; a card without them is named, not guessed."""
    from grpo_sweep.memory.throughput import relative_step_time

    l4 = relative_step_time(compose(["gpu=l4_24g"]))
    t4 = relative_step_time(compose(["gpu=t4_16g"]))
    assert l4["tokens_per_s"] != t4["tokens_per_s"]
    with pytest.raises(ConfigError, match=r"gpu=l4_24g: gpu.tflops_bf16=None .* conf/gpu/l4_24g.yaml"):
        relative_step_time(compose(["gpu=l4_24g", "gpu.tflops_bf16=null"]))


def test_user_config_groups_through_hydras_search_path(tmp_path):
    """A user's own groups, outside the package, on Hydra's search path: the app and the estimator."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "my_tiny.yaml").write_text(
        "name: my_tiny\nsource: random\ntokenizer: local\narch:\n  model_type: llama\n  hidden_size: 128\n"
        "  num_hidden_layers: 3\n  num_attention_heads: 4\n  num_key_value_heads: 2\n  head_dim: 32\n"
        "  intermediate_size: 256\n  vocab_size: 512\n"
    )
    search = f"hydra.searchpath=[file://{tmp_path}]"
    cfg = compose([search, "model=my_tiny"])
    assert cfg.model.name == "my_tiny" and cfg.model.arch.num_hidden_layers == 3
    result = train_here([search, "model=my_tiny", "--cfg", "job"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "name: my_tiny" in result.stdout and "num_hidden_layers: 3" in result.stdout


@pytest.mark.slow
def test_plain_install_ships_the_configs(tmp_path):
    """After a non-editable install, `python -m grpo_sweep` and `grpo-sweep estimate` work from any
    directory: conf/ (sweeps included) ships inside the package."""
    import shutil
    import subprocess
    import sys

    from helpers.runners import ROOT

    checkout = tmp_path / "checkout"  # a copy: the build must not leave build/ in the repository
    shutil.copytree(ROOT / "src", checkout / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    target = tmp_path / "site"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(checkout),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    shipped = {p.relative_to(target / "grpo_sweep" / "conf").as_posix() for p in (target / "grpo_sweep" / "conf").rglob("*.yaml")}
    assert {"train.yaml", "model/tiny.yaml", "gpu/l4_24g.yaml", "sweeps/tiny_cpu.yaml"} <= shipped
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    check = subprocess.run(
        [sys.executable, "-c", "import grpo_sweep; print(grpo_sweep.__file__)"], cwd=away, capture_output=True, text=True, env=env
    )
    assert str(target) in check.stdout, check.stdout + check.stderr
    cfg = subprocess.run(
        [sys.executable, "-m", "grpo_sweep", "+sweeps=tiny_cpu", "--cfg", "job"],
        cwd=away,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert cfg.returncode == 0 and "memory_gib: 0.09375" in cfg.stdout, cfg.stderr[-2000:]
    est = subprocess.run(
        [sys.executable, "-m", "grpo_sweep.cli", "estimate", "model=gemma3_1b", "gpu=l4_24g"],
        cwd=away,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert est.returncode == 0 and "fits" in est.stdout, est.stderr[-2000:]


# --- errors before any model loads: `+` typos, the objective, LoRA modules, every range -------------


@pytest.mark.parametrize(
    "args, needles",
    [
        (["+lora_rnk=8"], ["lora_rnk=8: not a key of the configuration", "did you mean lora_rank?"]),
        (["+recipe=learn"], ["recipe=learn: not a key", "a config group must exist under conf/"]),  # no conf/recipe/
        (["+trial.stpes=5"], ["trial.stpes=5: not a key", "did you mean trial.steps?"]),
        (["objective=bogus"], ["objective=bogus: must name a numeric metrics.json key", "tokens_per_s"]),
        (["objective=status"], ["objective=status: must name a numeric metrics.json key"]),  # a string key
        (["lora_target_modules=[q_proj,foo]"], ["foo not a linear layer of model_type=llama", "allowed: q_proj, k_proj"]),
        (["learning_rate=-1"], ["learning_rate=-1.0: must be a positive number (> 0)"]),
        (["beta=-0.1"], ["beta=-0.1: must be >= 0"]),
        (["seed=-1"], ["seed=-1: must be >= 0"]),
        (["lora_alpha=0"], ["lora_alpha=0: must be a positive"]),
        (["trial.timeout_s=0"], ["trial.timeout_s=0.0: must be a positive"]),
        (["task.num_prompts=0"], ["task.num_prompts=0: must be a positive"]),
        (["gpu.memory_gib=-2"], ["gpu.memory_gib=-2.0: must be > 0, or null"]),
    ],
    ids=lambda v: v[0] if isinstance(v, list) and v and "=" in v[0] else None,
)
def test_train_rejects_before_any_trial(tmp_path, args, needles):
    """`python train.py ...` as a user types it (its entry point, in this process: helpers.runners.train_here):
    the message names the key, the value and what is allowed, and no trial starts (no [trial] line,
    no metrics.json)."""
    result = train_here([*args, f"hydra.run.dir={tmp_path}/run"])
    text = result.stderr + result.stdout
    assert result.returncode != 0, text[-2000:]
    for needle in needles:
        assert needle in text, text[-2000:]
    assert "[trial]" not in text
    assert not list(tmp_path.rglob("metrics.json"))


def test_objective_allows_exactly_the_numeric_metrics_keys():
    from grpo_sweep.config.validate import numeric_metrics

    allowed = numeric_metrics()
    # By hand from metrics.TrialMetrics: throughput and memory numbers are; strings, dicts, lists,
    # bools and the mixed `tracked_steps` (int or "all") are not.
    assert {"tokens_per_s", "samples_per_s", "step_time_s", "peak_memory_bytes", "reward_mean", "wall_time_s"} <= set(allowed)
    assert not {"status", "error", "levers", "history", "throughput_tracked", "tracked_steps", "memory_source"} & set(allowed)
    for key in ("tokens_per_s", "peak_memory_bytes", "reward_mean"):
        validate(compose([f"objective={key}"]), cuda=False)


def test_lora_modules_of_every_shipped_model_and_unknown_model_types():
    import warnings

    from grpo_sweep.config.schema import ConfigWarning

    for model in ("tiny", "gemma3_1b", "llama3_2_1b", "qwen2_5_0_5b"):
        validate(compose([f"model={model}", "lora=all_linear"]), cuda=True)
    with pytest.raises(ConfigError, match=r"all-linear not a linear layer .*use lora=all_linear"):
        validate(compose(["lora_target_modules=[all-linear]"]), cuda=False)
    # A dotted PEFT name ending in a known layer is fine.
    validate(compose(["lora_target_modules=[self_attn.q_proj]"]), cuda=False)
    # A model type grpo-sweep does not know: not checked, and said so.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validate(compose(["model.arch.model_type=phi3", "lora_target_modules=[qkv_proj]"]), cuda=False)
    assert any(
        issubclass(w.category, ConfigWarning) and "model_type=phi3 is not one grpo-sweep knows" in str(w.message) for w in caught
    )


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (
            ["model.arch.num_key_value_heads=3", "model.arch.num_attention_heads=4"],
            "must divide model.arch.num_attention_heads=4",
        ),
        (["model.arch.hidden_size=0"], "model.arch.hidden_size=0: must be a positive"),
        (["gpu=l4_24g", "gpu.tflops_bf16=-1"], "gpu.tflops_bf16=-1.0: must be > 0, or null"),
        (["task.max_operand=0"], "task.max_operand=0: must be >= 1"),
    ],
)
def test_more_ranges(overrides, needle):
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides), cuda=False)
    assert needle in str(err.value)


def test_estimate_and_doctor_reject_unknown_keys_too(tmp_path):
    from helpers.runners import cli

    est = cli("estimate", "+lora_rnk=8")
    assert est.returncode == 2 and "did you mean lora_rank?" in est.stderr
    message = tmp_path / "oom.txt"
    message.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 22.06 GiB of which 1.00 GiB is free."
    )
    doc = cli("doctor", "--message", str(message), "gpu=l4_24g", "+lora_rnk=8")
    assert doc.returncode == 2 and "did you mean lora_rank?" in doc.stderr and doc.stdout == ""


VLLM = ["backend=trl_vllm"]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (VLLM + ["backend.vllm_max_num_seqs=0"], "backend.vllm_max_num_seqs=0: must be an integer >= 1, or null"),
        (VLLM + ["backend.vllm_kv_cache_memory_bytes=-1"], "backend.vllm_kv_cache_memory_bytes=-1: must be an integer >= 1"),
        (VLLM + ["backend.vllm_kv_cache_dtype=int4"], "backend.vllm_kv_cache_dtype=int4: must be one of null, auto, fp8"),
        (["backend=trl", "backend.vllm_max_num_seqs=8"], "backend.vllm_max_num_seqs=8: needs backend=trl_vllm (got backend=trl)"),
        (
            VLLM + ["backend.vllm_mode=server", "backend.vllm_max_num_seqs=8", "backend.vllm_max_num_batched_tokens=4"],
            "backend.vllm_max_num_batched_tokens=4: must be >= backend.vllm_max_num_seqs=8",
        ),
        # colocate, max_num_seqs null: TRL's own (per_device_train_batch_size 4 x steps_per_generation 2)
        (
            VLLM + ["gradient_accumulation_steps=2", "backend.vllm_max_num_batched_tokens=6"],
            "backend.vllm_max_num_batched_tokens=6: must be >= 8, the max_num_seqs TRL's colocated engine gets",
        ),
        (
            VLLM + ["backend.vllm_kv_cache_dtype=fp8"],
            "backend.vllm_kv_cache_dtype=fp8: CUDA only here (allowed on CPU: null, auto)",
        ),
    ],
)
def test_vllm_engine_settings_refused_in_one_line(overrides, needle):
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides), cuda=False)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_vllm_engine_settings_allowed_where_they_run():
    validate(compose(VLLM + ["backend.vllm_kv_cache_dtype=fp8_e4m3", "backend.vllm_enforce_eager=true"]), cuda=True)
    validate(compose(VLLM + ["backend.vllm_kv_cache_dtype=auto", "backend.vllm_max_num_batched_tokens=8"]), cuda=False)
    server = VLLM + ["backend.vllm_mode=server", "backend.vllm_max_num_batched_tokens=2", "backend.vllm_max_num_seqs=2"]
    validate(
        compose(server + ["backend.vllm_enable_prefix_caching=false", "backend.vllm_kv_cache_memory_bytes=4096"]), cuda=False
    )
