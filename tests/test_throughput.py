"""The throughput model (memory/throughput.py): generation and training apart, at the worst case, at the
expected length and at the card's roofline; each card's efficiencies from its conf/gpu file.

Pure arithmetic: every test composes a config and checks the model's numbers, most by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.config import compose

from grpo_sweep.config.schema import ConfigError
from grpo_sweep.config.validate import validate
from grpo_sweep.memory.shapes import kv_bytes_per_token, shapes, weights_bytes
from grpo_sweep.memory.throughput import EXPECTED_TAIL, GENERIC_EFFICIENCY, VLLM_STEP_S, card_of, relative_step_time

GPU_DIR = Path(__file__).resolve().parents[1] / "conf" / "gpu"
# Gemma 3 1B on an L4 with vLLM colocate: 16 completions of 768 tokens after a 256-token prompt.
L4_VLLM = ["model=gemma3_1b", "gpu=l4_24g", "preset=seed_baseline", "backend.name=trl_vllm"]
TINY_VLLM = ["+sweeps=tiny_cpu_vllm", "per_device_train_batch_size=4", "backend.vllm_max_num_seqs=4"]


def test_every_shipped_card_carries_its_efficiencies_with_a_source():
    """Each conf/gpu file names every efficiency the model reads, and says where it comes from (a comment)."""
    for path in sorted(GPU_DIR.glob("*.yaml")):
        text = path.read_text()
        card = yaml.safe_load(text)
        for key in GENERIC_EFFICIENCY:
            assert card.get(key) is not None, f"{path.name}: {key} missing"
        assert "Source" in text or "Measured here" in text or "fitted" in text, f"{path.name}: no source"
    assert yaml.safe_load((GPU_DIR / "t4_16g.yaml").read_text())["bf16"] is False


def test_phases_add_up_and_the_roofline_is_below_them():
    """step = generation + training at every point; the limit (peaks, no overheads) is faster than the
    worst case; without task.expected_completion_tokens the expected case is the worst case."""
    r = relative_step_time(compose(L4_VLLM))
    for case in (r, r["expected"], r["limit"]):
        assert case["step_s"] == pytest.approx(case["generation_s"] + case["training_s"])
    assert r["expected"]["step_s"] == pytest.approx(r["step_s"])
    assert r["limit"]["generation_s"] < r["generation_s"] and r["limit"]["training_s"] < r["training_s"]
    card = card_of(compose(L4_VLLM))
    # the roofline's training is the FLOPs at peak: the model's own FLOPs over the card's peak
    assert r["limit"]["training_s"] == pytest.approx(r["training_flops"] / card.peak_flops)
    assert r["training_flops"] / r["training_s"] / card.peak_flops < card.train_fraction + 1e-9


def test_expected_length_shortens_generation_and_training_by_hand():
    """task.expected_completion_tokens=E: each wave decodes until its longest completion (EXPECTED_TAIL x E)
    ends, vLLM reads the KV of live sequences only: G x (P x E + E^2 / 2) tokens' KV in all."""
    cfg = compose(L4_VLLM + ["task.expected_completion_tokens=100"])
    r = relative_step_time(cfg)
    s, card = shapes(cfg, "trl_vllm"), card_of(cfg)
    longest = EXPECTED_TAIL * 100
    kv = s.G * (s.P * 100 + 100 * 100 / 2) * kv_bytes_per_token(s, 2)
    decode = r["generation_waves"] * longest * weights_bytes(s) + kv
    assert r["expected"]["decode_bytes"] == pytest.approx(decode)
    assert r["expected"]["generation_s"] < r["generation_s"] / 2
    assert r["expected"]["training_s"] < r["training_s"]
    bytes_rate = card.bandwidth * card.decode_fraction
    prefill = r["expected"]["generation_s"] - decode / bytes_rate - r["generation_waves"] * longest * VLLM_STEP_S
    assert prefill == pytest.approx(
        r["generation_s"] - r["decode_bytes"] / bytes_rate - s.C * VLLM_STEP_S * r["generation_waves"]
    )


def test_hf_generate_pads_finished_sequences_vllm_drops_them():
    """At the same expected length, HF generate reads every sequence's KV until the longest ends (padded),
    vLLM only the live ones: HF's KV reads are G x longest x (P + longest / 2)."""
    base = ["model=gemma3_1b", "gpu=l4_24g", "preset=seed_baseline", "task.expected_completion_tokens=100"]
    hf = relative_step_time(compose(base + ["backend.name=trl"]))
    cfg = compose(base + ["backend.name=trl"])
    s = shapes(cfg, "trl")
    longest = EXPECTED_TAIL * 100
    kv = s.G * longest * (s.P + longest / 2) * kv_bytes_per_token(s, s.wb)
    assert hf["expected"]["decode_bytes"] == pytest.approx(longest * weights_bytes(s) + kv)
    vllm = relative_step_time(compose(base + ["backend.name=trl_vllm"]))
    vllm_kv = vllm["expected"]["decode_bytes"] - vllm["generation_waves"] * longest * weights_bytes(s)
    assert vllm_kv < kv


def test_prefix_caching_shares_the_groups_full_blocks_on_a_card_not_under_a_cpu_block():
    """vLLM's prefix cache computes a prompt's full KV blocks once per group: on a card (16-token blocks)
    a 256-token prompt's prefill runs once for its G completions; vLLM's CPU build (128-token blocks)
    shares nothing of the tiny sweep's 32-token prompts."""
    on = relative_step_time(compose(L4_VLLM + ["backend.vllm_enable_prefix_caching=true"]))
    off = relative_step_time(compose(L4_VLLM + ["backend.vllm_enable_prefix_caching=false"]))
    assert on["generation_s"] < off["generation_s"] and on["training_s"] == off["training_s"]
    assert relative_step_time(compose(L4_VLLM))["generation_s"] == on["generation_s"]  # vLLM's default: on
    cpu_on = relative_step_time(compose(TINY_VLLM + ["backend.vllm_enable_prefix_caching=true"]))
    cpu_off = relative_step_time(compose(TINY_VLLM + ["backend.vllm_enable_prefix_caching=false"]))
    assert cpu_on["step_s"] == cpu_off["step_s"]


def test_cpu_card_overheads_rank_the_tiny_landscapes_walls():
    """On vLLM's CPU build a larger KV pool costs its per-GiB seconds each step and a smaller micro-batch its
    fixed seconds (cpu_sim's measured numbers); on a GPU card the pool costs nothing."""
    small, large = (relative_step_time(compose(TINY_VLLM + [f"gpu_memory_utilization={u}"])) for u in (0.1, 0.3))
    assert large["generation_s"] > small["generation_s"] and large["training_s"] == small["training_s"]
    one = relative_step_time(compose(TINY_VLLM + ["per_device_train_batch_size=1", "gpu_memory_utilization=0.1"]))
    card = card_of(compose(TINY_VLLM))
    assert card.microbatch_s > 0
    assert one["training_s"] - small["training_s"] >= 3 * card.microbatch_s  # 4 micro-batches against 1
    l4 = [relative_step_time(compose(L4_VLLM + [f"gpu_memory_utilization={u}"]))["generation_s"] for u in (0.5, 0.6)]
    assert l4[0] == l4[1]


def test_old_logprobs_forward_costs_training_time():
    """vllm_importance_sampling_correction makes TRL run one more forward over the step's completions."""
    on = relative_step_time(compose(L4_VLLM + ["vllm_importance_sampling_correction=true"]))
    off = relative_step_time(compose(L4_VLLM + ["vllm_importance_sampling_correction=false"]))
    assert on["training_s"] > off["training_s"] and on["generation_s"] == off["generation_s"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("task.expected_completion_tokens=0", "task.expected_completion_tokens=0: must be >= 1, or null"),
        ("task.expected_completion_tokens=5000", "task.expected_completion_tokens=5000: must be at most the completion budget"),
        ("gpu.train_flops_fraction=1.5", r"gpu.train_flops_fraction=1.5: must be a fraction of the card's peak in \(0, 1\]"),
        ("gpu.microbatch_overhead_s=-1", r"gpu.microbatch_overhead_s=-1.0: must be >= 0"),
    ],
)
def test_bad_speed_settings_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(["gpu=l4_24g", override]))


def test_a_card_without_efficiencies_takes_the_generic_ones():
    cfg = compose(["gpu=l4_24g", "gpu.train_flops_fraction=null", "gpu.decode_bandwidth_fraction=null"])
    card = card_of(cfg)
    assert (card.train_fraction, card.decode_fraction) == (0.4, 0.6)


def test_speed_record_says_why_a_key_is_unknown():
    """A trial whose generation was not timed and whose card has no speeds: the keys are null, each with a
    reason; with both known, MFU is the model's training FLOPs over the measured training seconds at peak."""
    from grpo_sweep.memory.throughput import SPEED_KEYS, speed_record

    empty = speed_record({"history": []}, None, "ConfigError: no tflops_bf16")
    assert all(empty[key] is None for key in SPEED_KEYS)
    assert set(empty["speed_unknown"]) == set(SPEED_KEYS)
    assert "no tflops_bf16" in empty["speed_unknown"]["mfu_training"]
    model = relative_step_time(compose(L4_VLLM))
    rows = [
        {"step_time_s": 30.0},  # the first step: left out, as the step time leaves it out
        {"step_time_s": 10.0, "completion_length": 700.0, "completion_length_max": 768.0},
        {"step_time_s": 10.0, "completion_length": 500.0, "completion_length_max": 600.0},
        {"step_time_s": 50.0, "tracked": True},  # slowed by the CPU tracker: left out beside untracked steps
    ]
    got = speed_record({"history": rows, "generation_times_s": [29.0, 8.0, 8.0, 1.0]}, model)
    assert got["speed_unknown"] == {} and got["training_s"] == pytest.approx(2.0)
    assert (got["completion_tokens_mean"], got["completion_tokens_max"]) == (600.0, 768.0)
    assert got["mfu_training"] == pytest.approx(model["training_flops"] / (2.0 * model["peak_flops"]))
    assert got["decode_bandwidth_use"] == pytest.approx(model["decode_bytes"] / (8.0 * model["peak_bandwidth"]))
    assert got["limit_step_s"] == model["limit"]["step_s"]


def test_estimate_forecasts_the_steps_and_the_run_before_launch():
    """`estimate --json` carries speed: {worst_case, expected, limit} with each phase's seconds and the run's
    time for task.max_steps; the text says the same."""
    import json

    from helpers.runners import cli

    args = ["estimate", *L4_VLLM, "task.expected_completion_tokens=200", "task.max_steps=250"]
    speed = json.loads(cli(*args, "--json").stdout)["speed"]
    for case in ("worst_case", "expected", "limit"):
        assert set(speed[case]) >= {"step_s", "generation_s", "training_s"}
    assert speed["expected"]["step_s"] < speed["worst_case"]["step_s"]
    assert speed["run_s"]["worst_case"] == pytest.approx(250 * speed["worst_case"]["step_s"])
    text = cli(*args).stdout
    assert "speed on l4_24g (throughput model): worst case (768-token completions" in text
    assert "250 steps (task.max_steps):" in text
    refused = cli("estimate", *L4_VLLM, "task.max_steps=0")
    assert refused.returncode == 2 and "task.max_steps=0: must be >= 1, or null" in refused.stderr


def test_plan_compares_the_cards_for_one_recipe():
    """`plan --cards`: one row per card, in the order given, with its verdict and speed; a faster card is
    forecast faster; a card without datasheet speeds says so instead of borrowing another's numbers."""
    import json

    from helpers.runners import cli

    done = cli("plan", "--cards", "t4_16g,a100_40g,h100_80g", *L4_VLLM, "task.max_steps=10", "--json")
    rows = json.loads(done.stdout)
    assert [r["card"] for r in rows] == ["t4_16g", "a100_40g", "h100_80g"]
    steps = [r["speed"]["worst_case"]["step_s"] for r in rows]
    assert steps[0] > steps[1] > steps[2]
    assert rows[1]["fits"] is True
    bare = json.loads(cli("plan", "--cards", "l4_24g", *L4_VLLM, "gpu.tflops_bf16=null", "--json").stdout)
    assert bare[0]["speed"] is None and "gpu.tflops_bf16=None" in bare[0]["speed_error"]
    text = cli("plan", "--cards", "t4_16g,h100_80g", *L4_VLLM).stdout
    assert text.splitlines()[1].startswith("t4_16g") and "set task.max_steps=N" in text


def test_limit_words_say_how_far_the_card_is_from_its_limit():
    """best.yaml's card_limit and the summary's line: the limit step over the measured step, then MFU and
    bandwidth use; nothing when the record has no limit."""
    from grpo_sweep.memory.throughput import limit_words

    record = {"limit_step_s": 0.38, "step_time_s": 1.0, "mfu_training": 0.41, "decode_bandwidth_use": 0.22}
    assert limit_words(record) == "38 % of this card's limit: training at 41 % MFU, decoding at 22 % of bandwidth"
    assert limit_words({**record, "mfu_training": None}) == "38 % of this card's limit: decoding at 22 % of bandwidth"
    assert limit_words({"step_time_s": 1.0}) is None


def test_calibration_on_measured_phases_reranks_the_configs():
    """The model predicts generation 3x too fast and training right: its order is wrong where configs split
    their time differently. phase_scales finds (3, 1) from measured trials; each config recalibrated on the
    other configs' trials (never its own) ranks as measured, and the report's line says both rhos."""
    import optuna

    from grpo_sweep.memory.throughput import phase_scales
    from grpo_sweep.report.trials import model_trust_line, model_vs_measured, trials_from_study

    # batch: (predicted generation s, predicted training s); measured = (3 x generation, training)
    configs = {1: (1.0, 3.0), 2: (3.0, 1.5), 4: (0.5, 5.0), 8: (2.0, 1.8)}
    dist = {"per_device_train_batch_size": optuna.distributions.CategoricalDistribution(list(configs))}
    study = optuna.create_study(direction="maximize")
    for batch, (gen, train) in configs.items():
        measured = 100.0 / (3 * gen + train)
        attrs = {
            "status": "ok",
            "tokens_per_s": measured,
            "predicted_tokens_per_s": 100.0 / (gen + train),
            "predicted_generation_s": gen,
            "predicted_training_s": train,
            "generation_s": 3 * gen,
            "training_s": train,
        }
        study.add_trial(
            optuna.trial.create_trial(
                params={"per_device_train_batch_size": batch}, distributions=dist, value=measured, user_attrs=attrs
            )
        )
    trials = trials_from_study(study)
    assert phase_scales([t.record for t in trials]) == {"generation": 3.0, "training": 1.0, "trials": 4}
    result = model_vs_measured(trials)
    assert result["rho"] < 0.5 and result["rho_calibrated"] == pytest.approx(1.0)
    assert "calibrated on the other configs' measured phase times: rho 1.00" in model_trust_line(result)
    bare = trials_from_study(study)  # trials that carry no measured phases: no calibrated rho
    for t in bare:
        t.record.pop("generation_s", None)
        t.record.pop("training_s", None)
    assert model_vs_measured(bare)["rho_calibrated"] is None and phase_scales([t.record for t in bare]) is None
