"""The throughput model (memory/throughput.py): generation and training apart, at the worst case, at the
expected length and at the card's roofline; each card's efficiencies from its conf/gpu file.

Pure arithmetic: every test composes a config and checks the model's numbers, most by hand."""

from __future__ import annotations

import json
import statistics
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

    from grpo_sweep.memory.throughput import SWEEP_N_TRIALS

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
    # each card's sweep: the default n_trials trials of the recipe, in GPU-minutes, a faster card cheaper
    sweeps = [r["speed"]["sweep"]["gpu_minutes"] for r in rows]
    assert sweeps[0] > sweeps[2] and sweeps[0] == pytest.approx(SWEEP_N_TRIALS * rows[0]["speed"]["trial"]["gpu_s"] / 60)
    assert f"{sweeps[0]:.3g}" in text.splitlines()[1].split()[-1]


def test_4bit_dequantisation_runs_at_the_cards_own_fraction():
    """A 4-bit model's dequantisation stream (DEQUANT_BYTES_PER_WEIGHT per projection weight, once per decode
    step) runs at the card's dequant_bandwidth_fraction, not its decode fraction: halving it adds exactly that
    stream's extra seconds to generation, by hand; a 16-bit model has no such stream."""
    from grpo_sweep.memory.shapes import param_counts
    from grpo_sweep.memory.throughput import DEQUANT_BYTES_PER_WEIGHT

    four = ["model=gemma3_1b", "gpu=t4_16g", "preset=seed_baseline", "backend.name=trl_vllm", "load_in_4bit=true"]
    cfg = compose(four)
    card, s = card_of(cfg), shapes(cfg, "trl_vllm")
    fitted = yaml.safe_load((GPU_DIR / "t4_16g.yaml").read_text())["dequant_bandwidth_fraction"]
    assert card.dequant_fraction == fitted != card.decode_fraction  # conf/gpu/t4_16g.yaml's fitted value
    full = relative_step_time(cfg)
    half = relative_step_time(compose([*four, f"gpu.dequant_bandwidth_fraction={card.dequant_fraction / 2}"]))
    stream = param_counts(s)["linear"] * DEQUANT_BYTES_PER_WEIGHT * full["generation_waves"] * s.C
    extra = stream / (card.bandwidth * card.dequant_fraction)  # at half the fraction the stream takes twice as long
    assert half["generation_s"] - full["generation_s"] == pytest.approx(extra)
    assert half["training_s"] > full["training_s"]  # training dequantises too, at the same rate
    sixteen = ["model=gemma3_1b", "gpu=t4_16g", "preset=seed_baseline", "backend.name=trl_vllm"]
    assert relative_step_time(compose([*sixteen, "gpu.dequant_bandwidth_fraction=0.1"]))["step_s"] == pytest.approx(
        relative_step_time(compose(sixteen))["step_s"]
    )


def test_a_decode_step_of_one_row_takes_bitsandbytes_gemv_and_pays_no_dequantisation():
    """bitsandbytes' matmul_4bit takes its fused gemv_4bit for a single-row input and dequantises for any other
    (throughput.decode_rows cites the sources): a 4-bit vLLM run held to one sequence at a time
    (backend.vllm_max_num_seqs=1) decodes with no dequantisation stream, so its generation does not move with
    the card's dequant_bandwidth_fraction while its training does; at two sequences the stream is back. Both
    by hand: decode bytes = steps x (4-bit weights + the stream where it runs) + the KV reads."""
    from grpo_sweep.memory.shapes import param_counts
    from grpo_sweep.memory.throughput import DEQUANT_BYTES_PER_WEIGHT, decode_rows

    four = ["model=gemma3_1b", "gpu=t4_16g", "preset=seed_baseline", "backend.name=trl_vllm", "load_in_4bit=true"]
    slow = "gpu.dequant_bandwidth_fraction=0.1"
    for seqs in (1, 2):
        over = [*four, f"backend.vllm_max_num_seqs={seqs}"]
        cfg = compose(over)
        s, card = shapes(cfg, "trl_vllm"), card_of(cfg)
        base, slowed = relative_step_time(cfg), relative_step_time(compose([*over, slow]))
        assert base["generation_waves"] == s.G / seqs  # one wave per `seqs` sequences
        assert slowed["training_s"] > base["training_s"]  # training always dequantises
        steps = base["generation_waves"] * s.C
        stream = param_counts(s)["linear"] * DEQUANT_BYTES_PER_WEIGHT * steps if seqs > 1 else 0.0
        kv = s.G * (s.P * s.C + s.C * s.C / 2) * kv_bytes_per_token(s, 2)
        assert base["decode_bytes"] == pytest.approx(steps * weights_bytes(s) + stream + kv)
        extra = stream / (card.bandwidth * 0.1) - stream / (card.bandwidth * card.dequant_fraction)
        assert slowed["generation_s"] - base["generation_s"] == pytest.approx(extra, abs=1e-9)
    # HF generate decodes the round's whole batch at once: several rows, so it dequantises
    hf = compose(["model=gemma3_1b", "gpu=t4_16g", "preset=seed_baseline", "backend.name=trl", "load_in_4bit=true"])
    assert decode_rows(shapes(hf, "trl"), 1.0, {}, False) == shapes(hf, "trl").G > 1


def test_hf_generate_pays_the_cards_eager_seconds_per_layer_per_token():
    """HF generate's per-step overhead is the card's eager_layer_s per layer: on the T4 (its conf/gpu file's
    fit to its public HF-generate run) each of the budget's decode steps costs layers x that, by hand against
    half that rate."""
    hf = ["model=gemma3_1b", "gpu=t4_16g", "preset=seed_baseline", "backend.name=trl"]
    cfg = compose(hf)
    s, card = shapes(cfg, "trl"), card_of(cfg)
    assert card.eager_layer_s == yaml.safe_load((GPU_DIR / "t4_16g.yaml").read_text())["eager_layer_s"]
    half = card.eager_layer_s / 2
    slower = relative_step_time(cfg)
    faster = relative_step_time(compose([*hf, f"gpu.eager_layer_s={half}"]))
    assert slower["generation_s"] - faster["generation_s"] == pytest.approx(s.C * s.L * (card.eager_layer_s - half))
    assert slower["training_s"] == faster["training_s"]


H200_LANDSCAPE = Path(__file__).resolve().parents[1] / "bench" / "data" / "landscape_gpu_h200_2026-12-04.json"


def _h200_point(levers: dict):
    land = json.loads(H200_LANDSCAPE.read_text())
    extra = [f"{k}={'null' if v is None else str(v).lower()}" for k, v in levers.items()]
    return compose([*land["recipe"], *extra])


def test_steps_per_generation_prices_each_generation_round_by_hand():
    """steps_per_generation=1 under an accumulation of 4 generates four rounds of 8 (TRL `_prepare_inputs`): each
    round decodes to the budget, reading the weights and paying HF generate's per-layer overhead per decode step;
    prefill, the KV reads and training stay the step's."""
    base = {"per_device_train_batch_size": 8, "steps_per_generation": None}
    one, whole = _h200_point({**base, "steps_per_generation": 1}), _h200_point(base)
    s, card = shapes(whole, "trl"), card_of(whole)
    assert s.GA == 4
    r1, r4 = relative_step_time(one), relative_step_time(whole)
    per_round = s.C * (s.L * card.eager_layer_s + weights_bytes(s) / (card.bandwidth * card.decode_fraction))
    assert r1["generation_s"] - r4["generation_s"] == pytest.approx((s.GA - 1) * per_round)
    assert r1["training_s"] == r4["training_s"]
    # a round feeding several optimiser steps is shared among them
    two = relative_step_time(_h200_point({**base, "steps_per_generation": 8}))
    assert two["generation_s"] < r4["generation_s"]


def test_h200_landscape_generation_rounds_and_seconds_match_the_card():
    """On the H200's measured landscape the model's generation seconds (its fitted eager_layer_s) are within 35 %
    of every point's (the one-run points read 1.96-2.94 s at one shape), and steps_per_generation=1's generation over the other points' median within 10 %."""
    land = json.loads(H200_LANDSCAPE.read_text())
    points = [p for p in land["points"] if p["status"] == "ok"]
    assert len(points) == 17
    for p in points:
        model = relative_step_time(_h200_point(p["levers"]))["generation_s"]
        assert model == pytest.approx(p["generation_s"], rel=0.35), p["levers"]
    one = [p for p in points if p["levers"]["steps_per_generation"] == 1]
    rest = statistics.median(p["generation_s"] for p in points if p["levers"]["steps_per_generation"] is None)
    ratio_model = (
        relative_step_time(_h200_point(one[0]["levers"]))["generation_s"]
        / relative_step_time(_h200_point(points[0]["levers"]))["generation_s"]
    )
    assert one[0]["generation_s"] / rest == pytest.approx(ratio_model, rel=0.10)


def test_estimate_prices_a_trial_and_a_sweep_in_gpu_minutes():
    """`estimate` forecasts one trial (its start: imports, the weights read by the trainer and by vLLM, vLLM's
    engine start; then trial.steps worst-case steps) and a sweep of n_trials such trials in GPU-minutes, by
    hand; `--json` carries both; n_trials=N sets the count and a bad one is refused in one line."""
    import json

    from helpers.runners import cli

    from grpo_sweep.memory.throughput import LOAD_BYTES_PER_S, PROCESS_START_S, SWEEP_N_TRIALS, VLLM_START_S

    args = ["estimate", *L4_VLLM, "trial.num_processes=2", "trial.strategy=ddp"]
    speed = json.loads(cli(*args, "n_trials=7", "--json").stdout)["speed"]
    cfg = compose([*L4_VLLM, "trial.num_processes=2", "trial.strategy=ddp"])
    start = PROCESS_START_S + 2 * weights_bytes(shapes(cfg, "trl_vllm")) / LOAD_BYTES_PER_S + VLLM_START_S
    trial = speed["trial"]
    assert trial["start_s"] == pytest.approx(start)
    assert trial["trial_s"] == pytest.approx(start + cfg.trial.steps * speed["worst_case"]["step_s"])
    assert trial["gpus"] == 2 and trial["gpu_s"] == pytest.approx(2 * trial["trial_s"])
    assert speed["sweep"]["gpu_minutes"] == pytest.approx(7 * trial["gpu_s"] / 60)
    default = json.loads(cli(*args, "--json").stdout)["speed"]["sweep"]
    assert default["gpu_minutes"] == pytest.approx(SWEEP_N_TRIALS * trial["gpu_s"] / 60)
    text = cli(*args, "n_trials=7").stdout
    assert f"sweep cost: {speed['sweep']['gpu_minutes']:.3g} GPU-minutes (n_trials=7 trials, each this config" in text
    refused = cli(*args, "n_trials=0")
    assert refused.returncode == 2 and "n_trials=0: must be an integer >= 1" in refused.stderr


def test_plan_prices_the_sweep_over_its_own_space(capfd):
    """`grpo-sweep plan`: the sweep's forecast cost over its space: its search trials less the share the
    pre-screen prunes (those load no model), each at least a trial's start, plus the confirmation runs;
    twice the trial steps cost more; the text says it."""
    import json

    from helpers.runners import cli

    from grpo_sweep.memory.throughput import PROCESS_START_S

    data = json.loads(cli("plan", "+sweeps=tiny_cpu", "--json").stdout)
    cost, pre = data["cost"], data["prescreen"]
    assert pre["pruned"] > 0  # the tiny sweep's micro-batch 8 points: the cost leaves them out
    search = cost["search_trials"] / (pre["runs"] / (pre["runs"] + pre["pruned"]))
    assert search + cost["confirm_runs"] == 8  # the sweep's n_trials
    assert cost["gpu_minutes"] * 60 > (cost["search_trials"] + cost["confirm_runs"]) * PROCESS_START_S
    longer = json.loads(cli("plan", "+sweeps=tiny_cpu", "trial.steps=4", "--json").stdout)["cost"]
    assert longer["gpu_minutes"] > cost["gpu_minutes"]
    capfd.readouterr()
    cli("plan", "+sweeps=tiny_cpu")  # the text plan comes from the app's own process
    assert f"Forecast cost: {cost['gpu_minutes']:.3g} GPU-minutes ({cost['assumption']})" in capfd.readouterr().out


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
    their time differently. The pure scale per phase (speed_fit.phase_fit, affine off) finds (3, 1) from measured trials; each config recalibrated on the
    other configs' trials (never its own) ranks as measured, and the report's line and table say both."""
    import optuna

    from grpo_sweep.memory.speed_fit import phase_fit
    from grpo_sweep.report.html import model_rank_html
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
    scales = phase_fit([t.record for t in trials], affine=False)
    assert (scales["generation"]["scale"], scales["training"]["scale"], scales["trials"]) == (3.0, 1.0, 4)
    assert scales["generation"]["kind"] == scales["training"]["kind"] == "scale"
    result = model_vs_measured(trials)
    assert result["rho"] < 0.5 and result["rho_calibrated"] == pytest.approx(1.0)
    assert "calibrated on the other configs' measured phase times: rho 1.00" in model_trust_line(result)
    # the report's table: each config's predicted, calibrated and measured rank; calibrated as measured
    assert all(row["calibrated_rank"] == row["measured_rank"] for row in result["rows"])
    assert any(row["predicted_rank"] != row["measured_rank"] for row in result["rows"])
    html = model_rank_html(result)
    assert "<th>predicted rank</th><th>calibrated rank</th><th>measured rank</th>" in html
    assert html.count("<tr>") == 1 + len(configs)
    bare = trials_from_study(study)  # trials that carry no measured phases: no calibrated rho
    for t in bare:
        t.record.pop("generation_s", None)
        t.record.pop("training_s", None)
    assert model_vs_measured(bare)["rho_calibrated"] is None and phase_fit([t.record for t in bare]) is None


# Real trials of sweeps/tiny_cpu_vllm.yaml (vLLM's CPU build, one core of the shared 2-core box, one run each,
# in one session): (gpu_memory_utilization, batch, checkpointing, prefix caching), the model's predicted and
# the measured generation and training seconds, and the measured tokens/s. The first five are the model
# start's picks (bench/throughput_model.py), the rest points it did not try.
MEASURED_TINY_VLLM = [
    ((0.1, 4, False, False), 0.5541, 0.2133, 0.0756, 0.0483, 1958),
    ((0.1, 4, True, False), 0.5541, 0.2197, 0.0776, 0.0544, 1867),
    ((0.1, 2, False, True), 0.5541, 0.2110, 0.1495, 0.0604, 1887),
    ((0.1, 2, True, False), 0.5541, 0.2135, 0.1531, 0.0775, 1760),
    ((0.3, 4, False, False), 0.6440, 0.2250, 0.0756, 0.0495, 1865),
    ((0.1, 4, False, True), 0.5541, 0.2166, 0.0756, 0.0500, 1920),
    ((0.1, 4, True, True), 0.5541, 0.2136, 0.0776, 0.0573, 1890),
    ((0.1, 1, False, False), 0.5541, 0.2824, 0.2975, 0.1001, 1339),
    ((0.5, 2, False, False), 0.7341, 0.2158, 0.1495, 0.0609, 1850),
]
TINY_TOKENS_PER_STEP = 4 * 128  # 4 completions of the 128-token sequence per step


def measured_tiny_records() -> list[dict]:
    """MEASURED_TINY_VLLM as trial records (the model's tokens/s from its phases, as relative_step_time has it)."""
    return [
        {
            "predicted_generation_s": gen,
            "generation_s": gen_measured,
            "predicted_training_s": train,
            "training_s": train_measured,
            "predicted_tokens_per_s": TINY_TOKENS_PER_STEP / (gen + train),
            "tokens_per_s": tokens_per_s,
        }
        for _, gen, gen_measured, train, train_measured, tokens_per_s in MEASURED_TINY_VLLM
    ]


def test_calibration_on_real_trials_fits_a_scale_and_a_per_step_overhead():
    """On real trials the training phase is a fixed ~30 ms per step plus a part that grows with the model's
    prediction: the fit finds both (a pure scale would stretch the fixed part with the prediction and put
    micro-batch 1 at twice its measured seconds). Generation, predicted alike at every pick, keeps a scale."""
    from grpo_sweep.memory.speed_fit import MIN_SPREAD, calibrate_untried, phase_fit

    records = measured_tiny_records()
    picks, untried = records[:5], records[5:]
    fit = phase_fit(picks)
    assert fit["trials"] == 5
    generation, training = fit["generation"], fit["training"]
    assert max(r["predicted_generation_s"] for r in picks) < MIN_SPREAD * min(r["predicted_generation_s"] for r in picks)
    assert generation["kind"] == "scale" and generation["overhead_s"] == 0.0
    assert generation["scale"] == pytest.approx(sorted(r["generation_s"] / r["predicted_generation_s"] for r in picks)[2])
    assert training["kind"] == "affine"
    assert 0 < training["overhead_s"] < min(r["training_s"] for r in picks)
    batch1 = untried[2]
    affine = training["scale"] * batch1["predicted_training_s"] + training["overhead_s"]
    assert affine == pytest.approx(batch1["training_s"], rel=0.1)
    ratio = sorted(r["training_s"] / r["predicted_training_s"] for r in picks)[2]
    assert ratio * batch1["predicted_training_s"] > 1.5 * batch1["training_s"]

    same, calibrated = calibrate_untried(picks, untried)
    assert same == fit and len(calibrated) == len(untried)
    errors = sorted(abs(c["tokens_per_s"] / r["tokens_per_s"] - 1) for c, r in zip(calibrated, untried))
    before = sorted(abs(r["predicted_tokens_per_s"] / r["tokens_per_s"] - 1) for r in untried)
    assert (errors[1] + errors[2]) / 2 <= 0.15 < 0.5 < (before[1] + before[2]) / 2
    for c in calibrated:
        assert c["step_s"] == pytest.approx(c["generation_s"] + c["training_s"])


def test_calibration_shrugs_off_an_outlier_and_falls_back_to_a_scale():
    """Theil-Sen's line: one trial measured at 3x moves neither the slope nor the overhead. With one trial,
    with trials the model predicts alike, or with a line that is not physical (measured falling as predicted
    grows), each phase keeps the median ratio; no measured phase: no fit, no calibrated prediction."""
    from grpo_sweep.memory.speed_fit import FLOOR, calibrate_untried, calibrated, fit_phase

    line = [(p, 0.4 * p + 0.03) for p in (0.1, 0.2, 0.3, 0.4, 0.5)]
    noisy = [*line[:2], (0.3, 3 * line[2][1]), *line[3:]]
    for points in (line, noisy):
        fit = fit_phase(points)
        assert fit["kind"] == "affine"
        assert fit["scale"] == pytest.approx(0.4) and fit["overhead_s"] == pytest.approx(0.03)
    assert fit_phase(line[:1]) == {"scale": pytest.approx(0.7), "overhead_s": 0.0, "points": 1, "kind": "scale"}
    assert fit_phase([(0.5, 0.2), (0.52, 0.4), (0.55, 0.3)])["kind"] == "scale"
    falling = fit_phase([(0.1, 0.5), (0.2, 0.4), (0.4, 0.2)])
    assert falling["kind"] == "scale" and falling["scale"] == pytest.approx(2.0)
    # the model counts fixed seconds this machine does not spend: a negative overhead, floored far below
    lower = fit_phase([(1.0, 0.6), (2.0, 1.6), (3.0, 2.6)])
    assert lower["kind"] == "affine" and lower["overhead_s"] == pytest.approx(-0.4)
    fit = {"generation": lower, "training": {"scale": 1.0, "overhead_s": 0.0}}
    tiny = calibrated({"predicted_generation_s": 0.1, "predicted_training_s": 0.1, "predicted_tokens_per_s": 100.0}, fit)
    assert tiny["generation_s"] == pytest.approx(FLOOR * 0.1)
    assert calibrated({"predicted_generation_s": 1.0, "predicted_training_s": None, "predicted_tokens_per_s": 1.0}, fit) is None
    assert calibrate_untried([{"tokens_per_s": 5.0}], [{"predicted_tokens_per_s": 1.0}]) == (None, [None])
