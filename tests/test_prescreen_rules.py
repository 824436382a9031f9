"""The pre-screen's rules: vLLM's own feasibility rule for its KV cache (one max_seq_length
sequence, block rounding, the null block), the waves a smaller cache costs in the throughput model,
Unsloth without vLLM (backend.fast_inference=false), model=hub LoRA targets from config.json, and
the logits term's TRL version."""

from __future__ import annotations

import json
import math

import pytest
from helpers.cards import CPU_CARD, share_for_blocks
from helpers.config import compose
from helpers.runners import cli

from grpo_sweep.config.local import validate_here
from grpo_sweep.config.model_arch import check_hub_lora_targets
from grpo_sweep.config.schema import ConfigError
from grpo_sweep.memory.estimator import estimate, trl_version, verdict
from grpo_sweep.memory.shapes import kv_bytes_per_token, shapes
from grpo_sweep.memory.throughput import relative_step_time
from grpo_sweep.memory.vllm import VLLM_CPU_BLOCK_TOKENS, VLLM_GPU_BLOCK_TOKENS, kv_cache_capacity

SEED = ["model=gemma3_1b", "gpu=l4_24g", "gpu.memory_gib=22"]


@pytest.mark.parametrize(
    "device, block_tokens, kv_bytes", [("cpu", VLLM_CPU_BLOCK_TOKENS, 4), ("cuda", VLLM_GPU_BLOCK_TOKENS, 2)]
)
def test_one_sequence_boundary_one_block_more_or_less(device, block_tokens, kv_bytes):
    """vLLM starts when ceil(S / block) blocks + the null block fit, not one block fewer; a cache of
    k x blocks_per_sequence + 1 blocks holds k sequences at once."""
    cfg = compose(SEED + ["max_seq_length=1000", "max_prompt_length=200", "per_device_train_batch_size=8"])
    s = shapes(cfg, "trl_vllm", device)
    block = block_tokens * kv_bytes_per_token(s, kv_bytes)
    per_seq = math.ceil(1000 / block_tokens)  # 8 blocks of 128 (CPU), 63 of 16 (CUDA)
    at = kv_cache_capacity(s, (per_seq + 1) * block, block_tokens, kv_bytes)
    assert at["one_sequence_ok"] and at["sequences"] == 1 and at["waves"] == 8
    below = kv_cache_capacity(s, (per_seq + 1) * block - 1, block_tokens, kv_bytes)  # floor: one block fewer
    assert not below["one_sequence_ok"] and below["sequences"] == 0 and below["waves"] is None
    assert at["min_bytes"] == below["min_bytes"] == (per_seq + 1) * block
    three = kv_cache_capacity(s, (3 * per_seq + 1) * block, block_tokens, kv_bytes)
    assert three["sequences"] == 3 and three["waves"] == math.ceil(8 / 3)
    whole = kv_cache_capacity(s, at["batch_bytes"], block_tokens, kv_bytes)
    assert whole["sequences"] == 8 and whole["waves"] == 1


def test_cpu_estimate_boundary_and_waves():
    """Through `estimate` on vLLM-CPU (the share sets the KV cache): 2 blocks (one 64-token sequence +
    the null block) fit, 1 does not; 3 blocks hold 2 of the 8 sequences: fits, 4 waves."""
    base = compose(CPU_CARD)
    one = estimate(compose(CPU_CARD + [f"gpu_memory_utilization={share_for_blocks(base, 2.5)}"]))
    assert one.kv_cache_ok and one.fits and one.assumptions["kv_cache_sequences"] == 1
    assert one.assumptions["generation_waves"] == 8
    none = estimate(compose(CPU_CARD + [f"gpu_memory_utilization={share_for_blocks(base, 1.5)}"]))
    assert none.kv_cache_ok is False and not none.fits
    two = estimate(compose(CPU_CARD + [f"gpu_memory_utilization={share_for_blocks(base, 3.5)}"]))
    assert two.fits and two.assumptions["generation_waves"] == 4
    assert "generation runs in about 4 waves" in verdict(two)


def test_a_cache_smaller_than_the_batch_fits_on_a_card_and_costs_waves():
    """Gemma 3 1B at a 0.106 share of a 22 GiB L4: room for 2 of the 4 sequences of 1024 tokens (by
    the estimator's arithmetic): feasible (vLLM queues the rest), 2 waves, and the throughput model
    is slower than at 0.15 (one wave) by the extra wave's weight reads and step overheads."""
    small = compose(SEED + ["preset=seed_baseline", "backend.name=trl_vllm", "gpu_memory_utilization=0.106"])
    roomy = compose(SEED + ["preset=seed_baseline", "backend.name=trl_vllm", "gpu_memory_utilization=0.15"])
    e = estimate(small)
    assert e.fits and e.kv_cache_ok and e.assumptions["kv_cache_sequences"] == 2 and e.assumptions["generation_waves"] == 2
    assert (
        e.assumptions["kv_cache_batch_bytes"]
        > e.assumptions["kv_cache_available_bytes"]
        >= e.assumptions["kv_cache_needed_bytes"]
    )
    t_small, t_roomy = relative_step_time(small), relative_step_time(roomy)
    assert (t_small["generation_waves"], t_roomy["generation_waves"]) == (2, 1)
    assert t_small["training_s"] == pytest.approx(t_roomy["training_s"])
    assert t_small["generation_s"] > 1.5 * t_roomy["generation_s"]
    assert t_small["tokens_per_s"] < t_roomy["tokens_per_s"]


def test_waves_scale_the_generation_time_by_hand():
    """Generation time = C x (waves x weight reads + the batch's KV reads) / bandwidth + waves x C x
    overhead: the difference between W and 1 waves is (W-1) x C x (weights / bandwidth + 3 ms)."""
    from grpo_sweep.memory.shapes import weights_bytes

    small = compose(SEED + ["preset=seed_baseline", "backend.name=trl_vllm", "gpu_memory_utilization=0.106"])
    roomy = compose(SEED + ["preset=seed_baseline", "backend.name=trl_vllm", "gpu_memory_utilization=0.15"])
    s = shapes(small, "trl_vllm")
    bw = small.gpu.bandwidth_gbs * 1e9 * 0.6
    extra = (s.C) * (weights_bytes(s) / bw + 0.003)
    got = relative_step_time(small)["generation_s"] - relative_step_time(roomy)["generation_s"]
    assert got == pytest.approx(extra, rel=1e-9)


def test_estimate_cli_says_waves_and_records_the_logits_version():
    args = ["estimate", *SEED, "preset=seed_baseline", "backend.name=trl_vllm"]
    text = cli(*args, "gpu_memory_utilization=0.106")
    assert text.returncode == 0, text.stderr
    assert "generation runs in about 2 waves" in text.stdout and "fits with" in text.stdout
    js = cli(*args, "gpu_memory_utilization=0.106", "--json")
    a = json.loads(js.stdout)["assumptions"]
    assert a["generation_waves"] == 2 and a["logits_mode"] == "chunked"
    assert a["logits_mode_trl_version"] == trl_version() and trl_version() is not None


def test_unsloth_without_vllm_is_hf_generation_without_a_pool():
    """backend.fast_inference=false: no vLLM pool, the weights on the card once (not shared with a
    pool), HF generation's KV cache in the generation phase, and HF's per-step cost in throughput."""
    fast = estimate(compose(SEED + ["preset=seed_baseline", "backend=unsloth"]))
    hf = estimate(compose(SEED + ["preset=seed_baseline", "backend=unsloth", "backend.fast_inference=false"]))
    assert fast.components["vllm_pool"] > 0 and fast.components["weights"] == 0
    assert hf.components["vllm_pool"] == 0 and hf.components["weights"] > 0
    assert hf.kv_cache_ok is None and "generation_waves" not in hf.assumptions
    assert hf.assumptions["fast_inference"] is False and fast.assumptions["fast_inference"] is True
    # The pool no longer counts: the config that needed 0.6 x 22 GiB for vLLM now needs far less.
    assert hf.total_bytes < fast.total_bytes - 5 * 2**30
    t_hf = relative_step_time(compose(SEED + ["preset=seed_baseline", "backend=unsloth", "backend.fast_inference=false"]))
    assert t_hf["generation_waves"] == 1


def test_unsloth_fast_inference_needs_vllm_installed():
    cfg = compose(["backend=unsloth"])
    with pytest.raises(ConfigError, match=r"vllm \(backend.fast_inference=true; false runs Unsloth with HF generation\)"):
        from grpo_sweep.config.validate import validate

        validate(cfg, cuda=True, installed=lambda p: p != "vllm")
    validate(compose(["backend=unsloth", "backend.fast_inference=false"]), cuda=True, installed=lambda p: p != "vllm")


def _hub_dir(tmp_path, model_type: str):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": model_type,
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "intermediate_size": 128,
                "vocab_size": 1000,
            }
        )
    )
    return str(tmp_path)


def test_hub_lora_targets_checked_from_config_json(tmp_path):
    """model=hub: the targets are checked against config.json's model_type before anything loads,
    by validate_here (the trial, the sweeper) and by `grpo-sweep estimate`."""
    hub = _hub_dir(tmp_path, "llama")
    bad = compose(["model=hub", f"model.hub_id={hub}", "lora_target_modules=[q_proj,c_attn]"])
    with pytest.raises(ConfigError, match=r"c_attn not a linear layer of model_type=llama"):
        check_hub_lora_targets(bad)
    with pytest.raises(ConfigError, match="c_attn"):
        validate_here(bad, cuda=False)
    check_hub_lora_targets(compose(["model=hub", f"model.hub_id={hub}", "lora_target_modules=[q_proj,down_proj]"]))
    refused = cli("estimate", "model=hub", f"model.hub_id={hub}", "lora_target_modules=[c_attn]")
    assert refused.returncode == 2 and "c_attn not a linear layer of model_type=llama" in refused.stderr


def test_hub_lora_targets_from_the_hub_cache_and_not_fetched(tmp_path, monkeypatch):
    """A hub id: read from huggingface_hub's cache when it is there; when it is not, nothing is
    fetched (the check is left to PEFT at load time)."""
    import huggingface_hub

    cached = _hub_dir(tmp_path, "qwen2") + "/config.json"
    seen = []

    def lookup(repo_id, filename, **kwargs):
        seen.append((repo_id, filename))
        return cached if repo_id == "org/cached" else None

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lookup)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("downloaded"))
    with pytest.raises(ConfigError, match="model_type=qwen2"):
        check_hub_lora_targets(compose(["model=hub", "model.hub_id=org/cached", "lora_target_modules=[c_attn]"]))
    check_hub_lora_targets(compose(["model=hub", "model.hub_id=org/absent", "lora_target_modules=[c_attn]"]))
    assert seen == [("org/cached", "config.json"), ("org/absent", "config.json")]


def test_doctor_says_holding_the_batch_is_speed_not_memory():
    """At a 0.106 share Gemma 3 1B's cache holds 2 of 4 sequences: the doctor does not raise the share
    to fit (vLLM starts, generation runs in waves); it offers 0.16 (one 0.05 step) as a speed suggestion, said so."""
    from grpo_sweep.cli.doctor import format_report
    from grpo_sweep.memory.doctor import diagnose
    from grpo_sweep.memory.oom_message import parse_oom_message

    cfg = compose(SEED + ["preset=seed_baseline", "backend.name=trl_vllm", "gpu_memory_utilization=0.106"])
    msg = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total "
        "capacity of 22.00 GiB of which 100.00 MiB is free."
    )
    result = diagnose(cfg, parse_oom_message(msg))
    speed = result.speed
    assert speed["overrides"] == ["gpu_memory_utilization=0.16"] and speed["waves"] == 2 and speed["speedup_pct"] > 0
    assert speed["what"].startswith("speed, not memory") and "not needed to fit" in speed["what"]
    assert "speed: speed, not memory" in format_report(result)
    # No memory move raises the share: training ran out, so the share may only shrink.
    raised = [o for o in result.overrides if o.startswith("gpu_memory_utilization=") and float(o.split("=")[1]) > 0.106]
    assert not raised
    # A share that already holds the batch gets no speed suggestion.
    roomy = compose(SEED + ["preset=seed_baseline", "backend.name=trl_vllm", "gpu_memory_utilization=0.15"])
    assert diagnose(roomy, parse_oom_message(msg)).speed is None


def test_the_sweeper_records_the_waves_and_the_models_tokens_per_s_and_the_frontier_sees_them():
    """A trial records the pre-screen's predicted waves and the forecast's throughput-model tokens/s (the
    report's `gen. waves` and `model tok/s` columns); the frontier start counts a fit in N waves 1/N as full."""
    from dataclasses import replace

    import optuna
    from helpers.sweeper import tiny_sweeper

    from hydra_plugins.grpo_optuna_sweeper import start
    from hydra_plugins.grpo_optuna_sweeper.forecast import predicted_tokens_per_s
    from hydra_plugins.grpo_optuna_sweeper.prepare import Prepared
    from hydra_plugins.grpo_optuna_sweeper.start import enqueue_frontier

    shares = "gpu_memory_utilization=choice(0.106,0.15)"
    fixed = [*SEED, "preset=seed_baseline", "backend.name=trl_vllm", "gradient_checkpointing=false", "expandable_segments=false"]
    with tiny_sweeper(*fixed, shares, sweep="+sweeps=gemma3_1b_l4", start="memory") as tiny:  # the memory-first start
        plan = replace(tiny.plan, distributions={"gpu_memory_utilization": tiny.plan.distributions["gpu_memory_utilization"]})
        study = optuna.create_study(direction="maximize")
        for share in (0.106, 0.15):
            trial = study.ask()
            cfg = tiny.compose([*plan.fixed, f"gpu_memory_utilization={share}"])
            validate_here(cfg, cuda=True)
            verdict = tiny.prescreen.verdict(cfg, None)
            assert verdict.runs  # both fit
            Prepared([], {**verdict.attrs, "predicted_tokens_per_s": predicted_tokens_per_s(cfg)}, None).apply(trial)
            attrs = trial.user_attrs
            assert attrs["generation_waves"] == (2 if share == 0.106 else 1)
            assert attrs["predicted_tokens_per_s"] == pytest.approx(relative_step_time(cfg)["tokens_per_s"])
        picked = []
        real_pick = start.pick
        start.pick = lambda fullness, count, seed: picked.extend(fullness) or real_pick(fullness, count, seed)
        try:
            enqueue_frontier(optuna.create_study(direction="maximize"), plan, tiny.prescreen, tiny.compose.cache(), 2)
        finally:
            start.pick = real_pick
        full = {p["gpu_memory_utilization"]: f for p, f in picked}
        raw = {s: estimate(tiny.compose([*plan.fixed, f"gpu_memory_utilization={s}"])).total_bytes for s in (0.106, 0.15)}
        assert full[0.106] / full[0.15] == pytest.approx(raw[0.106] / raw[0.15] / 2)  # 2 waves: half as full
