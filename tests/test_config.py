"""Bad input is rejected with the key and the allowed values, before any trial starts."""

from __future__ import annotations

import pytest
from conftest import compose, run_train

from grpo_sweep.backends import installed
from grpo_sweep.schema import ConfigError, validate


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
        validate(compose(["quant=nf4"]), cuda=True)  # allowed where CUDA exists
    else:  # ... and bitsandbytes is installed (the message says so, before any model loads)
        with pytest.raises(ConfigError, match="not installed: bitsandbytes"):
            validate(compose(["quant=nf4"]), cuda=True)


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
    result = run_train(["num_generations=3", f"hydra.run.dir={tmp_path}/run"])
    assert result.returncode != 0
    assert "num_generations=3" in result.stderr + result.stdout
    assert not (tmp_path / "run" / "metrics.json").exists()
    assert "[trial]" not in result.stdout


def test_cli_unknown_group_choice_lists_options(tmp_path):
    result = run_train(["model=gpt5", f"hydra.run.dir={tmp_path}/run"])
    assert result.returncode != 0
    text = result.stderr + result.stdout
    assert "model/gpt5" in text and "tiny" in text and "gemma3_1b" in text


def test_cli_type_error_names_key(tmp_path):
    result = run_train(["lora_rank=big", f"hydra.run.dir={tmp_path}/run"])
    assert result.returncode != 0
    assert "lora_rank" in result.stderr + result.stdout
