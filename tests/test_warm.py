"""The warm embedded model (model.init=warm): built once and cached, loadable by path, and GRPO on it
has rewards that vary, a policy gradient that is not zero, and (experiment=learn) a reward that rises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.config import compose
from helpers.runners import FAST, IN_PROCESS_TRIALS, load_metrics, train_here


def _tokenizer(cfg):
    from grpo_sweep.trial.models import load_tokenizer
    from grpo_sweep.trial.tasks import get_task

    return load_tokenizer(cfg, get_task(cfg).corpus())


def test_tiny_is_warm_and_the_random_path_stays():
    from grpo_sweep.trial.models import is_warm

    assert is_warm(compose([]))
    assert not is_warm(compose(["model.init=random"]))
    assert not is_warm(compose(["model=qwen2_5_0_5b"]))  # a hub model is never warmed


def test_warm_cache_reused_and_keyed(tmp_path, monkeypatch, capsys):
    """A small recipe in a private cache: the second call takes no time, the weights are
    deterministic for the seed, and a changed architecture (or recipe) builds its own entry."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_sweep.trial.models import load_model, model_path

    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(tmp_path))
    small = ["task.num_prompts=32", "model.warmup.steps=5", "model.warmup.batch_size=8"]
    cfg = compose(small)
    tok = _tokenizer(cfg)
    first = Path(model_path(cfg, tok, on_cuda=False))
    assert first.is_relative_to(tmp_path / "warm-models")
    info = json.loads((first / "warmup.json").read_text())
    assert info["steps"] == 5 and info["loss"] > 0
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert "[warmup] building" in capsys.readouterr().out
    assert Path(model_path(cfg, tok, on_cuda=False)) == first  # reused: a lookup, no warm-up
    assert "[warmup]" not in capsys.readouterr().out
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    # What load_model gives the trainer is the cached checkpoint, not fresh random weights.
    loaded = load_model(cfg, tok, on_cuda=False)
    assert Path(loaded.name_or_path) == first
    random = load_model(compose([*small, "model.init=random"]), tok, on_cuda=False)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert not torch.equal(loaded(ids).logits, random(ids).logits)
    # Deterministic: the same recipe rebuilt from scratch gives bit-identical weights.
    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(tmp_path / "again"))
    again = Path(model_path(cfg, tok, on_cuda=False))
    a = AutoModelForCausalLM.from_pretrained(first).state_dict()
    b = AutoModelForCausalLM.from_pretrained(again).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(tmp_path))
    for change in (["model.arch.intermediate_size=128"], ["model.warmup.steps=6"], ["seed=1"]):
        other = compose([*small, *change])
        path = Path(model_path(other, _tokenizer(other), on_cuda=False))
        assert path != first and (path / "config.json").exists(), change
    assert (
        json.loads(
            (
                Path(model_path(compose([*small, "model.arch.intermediate_size=128"]), tok, on_cuda=False)) / "config.json"
            ).read_text()
        )["intermediate_size"]
        == 128
    )


@IN_PROCESS_TRIALS
def test_bad_grpo_config_key_is_named(tmp_path):
    from grpo_sweep.trial.parent import run_trial

    record = run_trial(compose([*FAST, "+trial.grpo_config.no_such_arg=1"]), tmp_path)
    assert record["status"] == "failed"
    assert "trial.grpo_config" in record["error"] and "no_such_arg" in record["error"]


@IN_PROCESS_TRIALS
def test_default_trial_rewards_vary_and_gradient_flows(tmp_path):
    """The default trial (3 steps) on the warm tiny model: rewards between always wrong and always
    right, some group with reward_std > 0 and a non-zero gradient norm, all logged per step."""
    from grpo_sweep.trial.parent import run_trial

    record = run_trial(compose([]), tmp_path)
    assert record["status"] == "ok", record["error"]
    m = load_metrics(tmp_path)
    history = m["history"]
    for row in history:
        for key in ("reward", "reward_std", "reward/correctness_reward", "reward/format_reward", "loss", "grad_norm"):
            assert key in row, (key, row)
    assert any(row["reward_std"] > 0 and row["grad_norm"] > 0 for row in history), history
    assert 0.0 < m["reward_mean"] < 1.2  # 1.0 exact + 0.2 format is always right
    assert any(row["reward/format_reward"] > 0 for row in history)  # it writes <answer>N</answer>
    assert m["reward_first"] == history[0]["reward"] and m["reward_last"] == history[-1]["reward"]
    assert m["warmup"]["steps"] == 400


@pytest.mark.slow
def test_learn_experiment_reward_rises(tmp_path):
    """`python train.py +experiment=learn`: a real GRPO run whose last quarter of steps earns clearly
    more reward than its first quarter. Over 20 s: experiment=learn: enough real GRPO steps for the reward to rise."""
    out = tmp_path / "learn"
    done = train_here(["+experiment=learn", f"hydra.run.dir={out}"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    m = load_metrics(out)
    assert m["status"] == "ok", m["error"]
    rewards = [row["reward"] for row in m["history"]]
    q = len(rewards) // 4
    first, last = sum(rewards[:q]) / q, sum(rewards[-q:]) / q
    assert last - first >= 0.1, (first, last, rewards)
    assert m["reward_change"] == pytest.approx(last - first)
