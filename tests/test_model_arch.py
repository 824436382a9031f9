"""Any model by name: `model=hub model.hub_id=<dir or id>` reads the architecture from the model's own
config.json, for the estimator, the doctor and the trial alike; offline, from a directory the test writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.config import compose
from helpers.runners import FAST, ROOT, load_metrics
from omegaconf import OmegaConf

from grpo_sweep.config.model_arch import ARCH_KEYS, arch_from_config, arch_of
from grpo_sweep.config.schema import ConfigError
from grpo_sweep.memory.estimator import estimate

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _gemma3_multimodal_config() -> dict:
    """Gemma 3 4B+'s layout: the language model under text_config, with conf/model/gemma3_1b.yaml's numbers."""
    arch = OmegaConf.to_container(compose(["model=gemma3_1b"]).model.arch)
    text = {k: v for k, v in arch.items() if k != "tie_word_embeddings"}
    text["model_type"] = "gemma3_text"
    return {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": text,
        "vision_config": {"hidden_size": 1152},
    }


def test_config_json_gives_the_numbers_a_hand_written_block_gives(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_gemma3_multimodal_config()))
    from_json = compose(["model=hub", f"model.hub_id={tmp_path}", "gpu=l4_24g"])
    by_hand = compose(["model=gemma3_1b", "gpu=l4_24g"])
    assert OmegaConf.to_container(arch_of(from_json)) == OmegaConf.to_container(by_hand.model.arch)
    assert estimate(from_json).total_bytes == estimate(by_hand).total_bytes
    # A number given in the config wins over config.json.
    assert arch_of(compose(["model=hub", f"model.hub_id={tmp_path}", "model.arch.vocab_size=1000"])).vocab_size == 1000


def test_defaults_follow_transformers():
    """No head_dim, no num_key_value_heads, no tie flag: transformers' Llama defaults."""
    arch = arch_from_config(
        {
            "model_type": "llama",
            "hidden_size": 2048,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "intermediate_size": 8192,
            "vocab_size": 32000,
        }
    )
    assert arch["head_dim"] == 64 and arch["num_key_value_heads"] == 32 and arch["tie_word_embeddings"] is False
    assert set(arch) == set(ARCH_KEYS)
    with pytest.raises(ConfigError, match="vocab_size"):
        arch_from_config(
            {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 8}
        )


LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 1000,
}


@pytest.mark.parametrize(
    ("key", "value"),
    [("num_attention_heads", 0), ("hidden_size", "big"), ("num_hidden_layers", -2), ("vocab_size", True), ("head_dim", 1.5)],
)
def test_impossible_config_json_numbers_are_one_line(tmp_path, key, value):
    """A config.json size that is 0, negative, non-numeric or fractional is refused in one line
    naming the key and the value, by the pre-load check and by arch_of alike, never as a raw
    ZeroDivisionError or int() error. A whole float (2048.0) is the integer."""
    from grpo_sweep.config.local import validate_here

    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, key: value}))
    cfg = compose(["model=hub", f"model.hub_id={tmp_path}"])
    for check in (validate_here, arch_of):
        with pytest.raises(ConfigError) as err:
            check(cfg)
        line = str(err.value)
        assert f"{key}={value!r}" in line and "integer >= 1" in line and f"model.arch.{key}" in line and "\n" not in line
    assert arch_from_config({**LLAMA, "hidden_size": 64.0})["hidden_size"] == 64


def _estimate_cli(*args: str) -> subprocess.CompletedProcess:
    code = (
        "import sys; from grpo_sweep.cli import main; rc = main(['estimate', *sys.argv[1:]]); "
        "print('HEAVY', sorted({'torch', 'transformers'} & set(sys.modules))); sys.exit(rc)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, **OFFLINE}
    )


def test_estimate_cli_works_offline_on_a_directory_with_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_gemma3_multimodal_config()))
    out = _estimate_cli("model=hub", f"model.hub_id={tmp_path}", "gpu=l4_24g", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.split("\nHEAVY")[0])["total_bytes"] > 0
    assert "HEAVY []" in out.stdout  # neither torch nor transformers imported

    empty = tmp_path / "empty"
    empty.mkdir()
    out = _estimate_cli("model=hub", f"model.hub_id={empty}")
    assert out.returncode == 2 and f"model.hub_id={empty}" in out.stderr and "config.json" in out.stderr


@pytest.mark.slow
def test_a_trial_runs_a_model_saved_in_a_local_directory(tmp_path):
    """A tiny random Llama and its tokenizer saved with save_pretrained; the trial, its prediction
    and the doctor's inputs all read the architecture from that directory's config.json."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo_sweep.trial.tasks import get_task
    from grpo_sweep.trial.tokenizer import train_local_tokenizer

    model_dir = tmp_path / "my-model"
    cfg = compose(FAST)
    tokenizer = train_local_tokenizer(get_task(cfg).corpus(), vocab_size=512)
    config = LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256,
        vocab_size=len(tokenizer), max_position_embeddings=256, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    from grpo_sweep.trial.parent import run_trial

    run_dir = tmp_path / "run"
    old = {k: os.environ.get(k) for k in OFFLINE}
    os.environ.update(OFFLINE)
    try:
        record = run_trial(compose(["model=hub", f"model.hub_id={model_dir}", *FAST]), run_dir)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    assert record["status"] == "ok", record["error"]
    m = load_metrics(run_dir)
    assert m["predicted_peak_bytes"] > 0 and m["trainable_params"] > 0
    saved = OmegaConf.load(run_dir / "config.yaml").model.arch  # the numbers, recorded for the doctor
    assert saved.hidden_size == 64 and saved.num_key_value_heads == 1 and saved.head_dim == 32
    assert saved.vocab_size == len(tokenizer) and saved.tie_word_embeddings is True


def test_the_doctor_reads_the_vocabulary_from_config_json(tmp_path):
    """The doctor recognises a whole logits tensor by the vocabulary size: config.json's for model=hub."""
    from grpo_sweep.memory.doctor import infer_logits_mode

    (tmp_path / "config.json").write_text(json.dumps(_gemma3_multimodal_config()))
    cfg = compose(["model=hub", f"model.hub_id={tmp_path}", "gpu=l4_24g"])
    B, S = cfg.per_device_train_batch_size, cfg.max_seq_length
    assert infer_logits_mode({"requested_bytes": B * S * 262144 * 4}, cfg) == "full"
    assert infer_logits_mode({"requested_bytes": B * S * 151936 * 4}, cfg) is None  # another vocabulary


def test_gemma3_sliding_layers_are_transformers_own_layer_types():
    """config.model_arch.sliding_layers, the one count of Gemma 3's windowed layers that the memory model
    and the trial's model both read, is what transformers builds: 5 of every 6, the 6th global."""
    from transformers import Gemma3TextConfig

    from grpo_sweep.config.model_arch import sliding_layers

    for layers in (6, 26, 34, 62):
        types = Gemma3TextConfig(num_hidden_layers=layers).layer_types
        assert sliding_layers("gemma3", layers) == types.count("sliding_attention")
    assert sliding_layers("llama", 26) == 0
