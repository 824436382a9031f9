"""The throughput model: seconds of generation and of training per GRPO step on the target card.

Pure arithmetic like the estimator (no torch). The card's speed comes from its own
`conf/gpu/*.yaml` and nowhere else: its peak (`tflops_bf16`, `bandwidth_gbs`; a card without them is
an error that names the file to fix, never another card's numbers) and the efficiencies it reaches
(`train_flops_fraction`, `decode_bandwidth_fraction`, `dequant_bandwidth_fraction`, `microbatch_overhead_s`,
`step_overhead_s`, `vllm_pool_s_per_gib`, `eager_layer_s`), each with its source in that file.

Each step is modelled at three points:
- the worst case: every completion runs to its budget (max_seq_length - max_prompt_length). Trials
  pad to it (their memory is judged there), so the sweep's objective, measured tokens/s, ranks by it;
- the expected case: completions of `task.expected_completion_tokens` on average (null: the worst
  case), the wave's longest `EXPECTED_TAIL` times that (at most the budget);
- the limit: the card's peak FLOPs and peak bandwidth, no overheads (the roofline a trial's
  `mfu_training` and `decode_bandwidth_use` are fractions of).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from ..config.backends import VLLM_ENGINE_DEFAULTS, vllm_engine_settings
from ..config.schema import ConfigError
from ..config.split import processes_of, split_of
from ..units import GIB
from .estimator import checkpointed_layers, estimate, generates_with_vllm
from .shapes import kv_bytes_per_token, param_counts, resolve_backend_for, shapes, target_device, weights_bytes
from .vllm import VLLM_CPU_BLOCK_TOKENS, VLLM_GPU_BLOCK_TOKENS, vllm_kv_element_bytes

# vLLM's per-decode-step overhead (scheduler, sampler, CUDA graph replay) and, under enforce_eager, the kernel
# launches per layer a graph replay saves (not fitted: no enforce_eager run is measured).
VLLM_STEP_S = 0.003
VLLM_EAGER_LAYER_S = 0.00035
# HF generate's seconds per layer per decode step on a card whose conf/gpu file fits none: the two cards
# measured agree, the H200 (its landscape) and the T4 (the published fit runs) at 3.0 ms. The cost is the
# host's (Python and kernel launches), so it carries across cards.
EAGER_LAYER_S = 0.003
# Prefix caching where backend.vllm_enable_prefix_caching is null: what vLLM does then.
PREFIX_CACHING = VLLM_ENGINE_DEFAULTS["vllm_enable_prefix_caching"]
# A card's efficiencies where its conf/gpu file names none (a card added by hand): the fractions the model
# used before cards carried their own, no fixed overheads.
GENERIC_EFFICIENCY = {
    "train_flops_fraction": 0.4,
    "decode_bandwidth_fraction": 0.6,
    "dequant_bandwidth_fraction": 0.6,
    "microbatch_overhead_s": 0.0,
    "step_overhead_s": 0.0,
    "vllm_pool_s_per_gib": 0.0,
    "eager_layer_s": EAGER_LAYER_S,
}
# A micro-batch of T tokens runs at T / (T + MICROBATCH_FILL_TOKENS) of the card's training fraction: small
# matmuls fill a card's tensor cores less (the model's assumption, kept from its first version; not fitted).
MICROBATCH_FILL_TOKENS = 2048
# A trial's start before its first step, from the public runs' own logs (bench/data/published_grpo_runs.json's
# sources): vLLM's "init engine (profile, create kv cache, warmup model) took N seconds" is 28-194 s over the 15
# public GPU runs that print it (T4, RTX 4090, A100; vLLM 0.7-0.9), median 58 s; their "Model loading took X GiB
# and Y seconds" where nothing was downloaded reads 0.4-2.7 GiB/s (4.04 GiB in 2.8 s, 5.91 GiB in 15.0 s), taken
# as 1 GiB/s; the process's imports (torch, TRL) ~10 s, as a first trial here starts (bench/results/trial_start.md).
VLLM_START_S = 58.0
LOAD_BYTES_PER_S = 1.0 * GIB
PROCESS_START_S = 10.0
# hydra.sweeper.n_trials's default (the sweeper's config reads it from here): the trials `grpo-sweep estimate`
# prices a sweep of one config at unless told n_trials=N.
SWEEP_N_TRIALS = 20
# At the expected length, the longest completion of a generation wave is taken as this multiple of the
# mean (at most the budget) until a trial measures it (metrics.json completion_tokens_max). Source: the fit
# split of bench/data/published_grpo_runs.json, least squares of log(predicted / measured) over its runs on a
# 0.05 grid, the card constants fitted to single fit runs refitted at each value: the two vLLM runs whose
# completions stop well short of the budget (means of 157 and 174 tokens against 843 and 768, waves of 4 and 6)
# give 1.5 (1.45-1.6 keeps both within 13 %); the runs whose waves reach the budget do not depend on it.
EXPECTED_TAIL = 1.5
# bitsandbytes dequantises each NF4 projection to a 16-bit copy before its matmul (bnb.functional
# dequantize_4bit, in training, HF generate and vLLM alike): read 0.5 byte, write and read 2 bytes per weight.
# That stream runs at the card's dequant_bandwidth_fraction: the dequantisation kernel is branch-bound on some
# cards. A decode step of one row is the exception (`decode_rows`).
DEQUANT_BYTES_PER_WEIGHT = 4.5


@dataclass(frozen=True)
class Card:
    """The target card's peaks and what the model takes it to reach of them."""

    peak_flops: float  # dense 16-bit tensor FLOP/s (bf16; fp16 on a card without bf16)
    bandwidth: float  # bytes/s
    train_fraction: float
    decode_fraction: float
    dequant_fraction: float  # of the bandwidth, in bitsandbytes' 4-bit dequantisation stream
    microbatch_s: float  # fixed seconds per training micro-batch (forward + backward launches)
    step_s: float  # fixed seconds per step in generation (TRL times the weight sync to vLLM inside it)
    pool_s_per_byte: float  # seconds per step per byte of vLLM's KV pool (vLLM's CPU build; 0 on a GPU)
    eager_layer_s: float  # HF generate's seconds per layer per decode step (eager kernel launches, host-bound)


def vllm_step_overhead(s, engine: dict, device: str) -> float:
    """Seconds of overhead per vLLM decode step: VLLM_STEP_S, or with enforce_eager on a card (no CUDA
    graphs: vllm/config/model.py enforce_eager) the per-layer launches, whichever is larger.

    Args:
        s: The run's shape; its `L` is the layer count.
        engine: The vLLM engine settings; `enforce_eager` is backend.vllm_enforce_eager.
        device: The device the run uses ("cuda": a card).

    Returns:
        The seconds of overhead per decode step.
    """
    if engine.get("enforce_eager") and device == "cuda":
        return max(VLLM_STEP_S, VLLM_EAGER_LAYER_S * s.L)
    return VLLM_STEP_S


def card_speed(cfg: Any) -> tuple[float, float]:
    """(peak dense 16-bit TFLOP/s, memory bandwidth GB/s) of the target card, from its config."""
    gpu = cfg.gpu
    tflops, gbs = gpu.get("tflops_bf16"), gpu.get("bandwidth_gbs")
    if not tflops or not gbs or tflops <= 0 or gbs <= 0:
        raise ConfigError(
            f"gpu={gpu.name}: gpu.tflops_bf16={tflops} and gpu.bandwidth_gbs={gbs}: both must be positive numbers "
            f"to model throughput (add them to conf/gpu/{gpu.name}.yaml from the card's datasheet, "
            "or pass gpu.tflops_bf16=... gpu.bandwidth_gbs=...)"
        )
    return float(tflops), float(gbs)


def card_of(cfg: Any) -> Card:
    """The card's peaks (card_speed) and efficiencies (its conf/gpu file; GENERIC_EFFICIENCY where it names none)."""
    tflops, gbs = card_speed(cfg)
    eff = {key: cfg.gpu.get(key) for key in GENERIC_EFFICIENCY}
    eff = {key: GENERIC_EFFICIENCY[key] if value is None else float(value) for key, value in eff.items()}
    return Card(
        peak_flops=tflops * 1e12,
        bandwidth=gbs * 1e9,
        train_fraction=eff["train_flops_fraction"],
        decode_fraction=eff["decode_bandwidth_fraction"],
        dequant_fraction=eff["dequant_bandwidth_fraction"],
        microbatch_s=eff["microbatch_overhead_s"],
        step_s=eff["step_overhead_s"],
        pool_s_per_byte=eff["vllm_pool_s_per_gib"] / GIB,
        eager_layer_s=eff["eager_layer_s"],
    )


def recompute_passes(s) -> float:
    """Extra forward passes checkpointing costs: the share of layers checkpointed (all, or every n-th with
    gradient_checkpointing_every_n_layers), each recomputed once in backward.

    The other trainer settings have no term here, each for a reason: gradient_checkpointing_offload's
    host copies run at the host link's speed, which is not among a card's numbers (conf/gpu);
    torch_empty_cache_steps costs allocator calls, not FLOPs or bytes; cast_lm_head_to_fp32 runs the head
    at the card's fp32 rate, also not among its numbers; use_transformers_continuous_batching changes the
    decode scheduler's overhead, not measured on a card yet. pad_to_multiple_of enters through the padded
    lengths (shapes.shapes)."""
    return checkpointed_layers(s) / s.L if s.L else 0.0


def extra_forwards(cfg: Any, vllm: bool) -> int:
    """Forward passes over the step's completions outside the training micro-batches: the reference model's
    (beta > 0) and the old policy's log-probabilities, which TRL computes when vLLM generated with
    vllm_importance_sampling_correction or when the accumulation is not a multiple of steps_per_generation
    (trl/trainer/grpo_trainer.py `_generate_and_score_completions`: old_per_token_logps)."""
    ref = 1 if float(cfg.get("beta") or 0) > 0 else 0
    accum, per_gen = split_of(cfg)[1], cfg.get("steps_per_generation")
    old = 1 if (vllm and cfg.get("vllm_importance_sampling_correction")) or (per_gen and accum % int(per_gen)) else 0
    return ref + old


def generation_rounds(cfg: Any, s) -> float:
    """Generation rounds per optimiser step: accumulation / steps_per_generation (null: the accumulation, one
    round). TRL generates a batch of per_device_train_batch_size x steps_per_generation completions every
    steps_per_generation micro-steps and trains on its slices (trl/trainer/grpo_trainer.py `_prepare_inputs`:
    generate_every = steps_per_generation x num_iterations); under 1, one round feeds several steps."""
    per_gen = cfg.get("steps_per_generation")
    return s.GA / int(per_gen) if per_gen else 1.0


def decode_rows(s, rounds: float, assumptions: dict, vllm: bool) -> float:
    """Sequences one decode step runs: a generation round's batch (B x steps_per_generation), or under vLLM at
    most the sequences its KV cache or max_num_seqs holds at once (the estimator's `kv_cache_sequences`).

    It decides the 4-bit decode path. bitsandbytes' matmul_4bit calls its fused gemv_4bit, which reads the
    4-bit weights and writes no 16-bit copy, only when the input is a single row (bitsandbytes
    autograd/_functions.py `matmul_4bit`: A.numel() == A.shape[-1] without grad); any other input dequantises
    first (`MatMul4Bit.forward`). vLLM's bitsandbytes method hands a decode step's [sequences, hidden] input to
    it per weight shard (vllm/model_executor/layers/quantization/bitsandbytes.py `_apply_bnb_4bit`; Unsloth's
    patch, unsloth_zoo vllm_utils.py `_apply_4bit_weight`, keeps that call), and bitsandbytes' Linear4bit does
    the same under HF generate. A wave's tail, after all but its longest completion end, also runs one row;
    the model does not price that tail apart (no run logs a wave's second-longest completion).

    Args:
        s: The run's shape; `G` is the step's generation batch.
        rounds: Generation rounds per step (generation_rounds).
        assumptions: The estimator's assumptions ({} without vLLM).
        vllm: Whether vLLM generates.

    Returns:
        The sequences a decode step runs at once.
    """
    per_round = s.G / rounds
    held = assumptions.get("kv_cache_sequences") if vllm else None
    return min(per_round, held) if held else per_round


def expected_completion_tokens(cfg: Any, s) -> tuple[float, float]:
    """(mean, longest) completion tokens at the expected length: task.expected_completion_tokens (null: the
    budget), the longest EXPECTED_TAIL x the mean, both at most the budget."""
    mean = cfg.task.get("expected_completion_tokens")
    if mean is None:
        return float(s.C), float(s.C)
    mean = min(float(mean), float(s.C))
    return mean, min(EXPECTED_TAIL * mean, float(s.C))


def _phases(m: dict, card: Card, mean: float, longest: float, limit: bool = False) -> dict:
    """Generation and training seconds of one step.

    Args:
        m: The model's per-step terms; `s` is the run's shape.
        card: The target card.
        mean: The completions' mean length in tokens.
        longest: The length in tokens at which each wave ends.
        limit: True prices the roofline: the card's peaks (fractions 1), no fixed overheads.

    Returns:
        The step's generation_s, training_s and step_s, its training FLOPs, decode bytes and completion tokens.
    """
    s = m["s"]
    flops_rate = card.peak_flops * (1.0 if limit else card.train_fraction)
    bytes_rate = card.bandwidth * (1.0 if limit else card.decode_fraction)
    dequant_rate = card.bandwidth * (1.0 if limit else card.dequant_fraction)
    fixed = 0.0 if limit else 1.0
    # training: TRL pads a micro-batch to its longest completion
    tokens = s.G * (s.P + longest)
    train_flops = tokens * (m["layer_flops"] * m["passes"] + m["head_flops"])
    extra_flops = m["extra"] * tokens * (m["layer_flops"] + m["head_forward"])
    dequant = m["dequant"] * (m["passes"] + m["extra"]) * s.GA
    micro = s.B * (s.P + longest)  # tokens per micro-batch: a small one fills the card's matmuls less
    fill = 1.0 if limit else micro / (micro + MICROBATCH_FILL_TOKENS)
    train = (train_flops + extra_flops) / (flops_rate * fill) + dequant / dequant_rate
    train += fixed * s.GA * card.microbatch_s * (1 + m["extra"] / 2)
    # generation: prefill (compute-bound; a prefix cache computes the group's shared full blocks once) ...
    prefill = m["prefill_tokens"] * m["layer_flops"] / flops_rate
    # ... then decode: each wave runs until its longest completion ends, reading the weights once per step;
    # the KV reads are every live sequence's. vLLM drops a finished sequence from the batch (its scheduler
    # frees it: vllm/v1/core/sched/scheduler.py update_from_output), HF generate keeps it padded in the batch
    # until the longest ends (transformers generation/utils.py _sample: unfinished_sequences masks, no removal).
    steps = m["rounds"] * m["waves"] * longest  # each round decodes its own batch: weights read per round
    kv_tokens = s.G * (s.P * mean + mean * mean / 2) if m["vllm"] else s.G * longest * (s.P + longest / 2)
    decode_bytes = steps * (m["weight_read"] + m["decode_dequant"]) + kv_tokens * m["kv_per_token"]
    decode_s = (steps * m["weight_read"] + kv_tokens * m["kv_per_token"]) / bytes_rate
    decode_s += steps * m["decode_dequant"] / dequant_rate
    gen = prefill + decode_s + fixed * (steps * m["step_overhead"] + m["rounds"] * (m["pool_s"] + card.step_s))
    return {
        "generation_s": gen,
        "training_s": train,
        "step_s": gen + train,
        "training_flops": train_flops + extra_flops,
        "decode_bytes": decode_bytes,
        "completion_tokens": mean,
    }


def relative_step_time(cfg: Any, logits_mode: str | None = None) -> dict:
    """Seconds per step on the target card, generation and training apart, at the worst case (the top-level
    keys: what trials measure and the sweep ranks by), at the expected length (`expected`) and at the card's
    roofline (`limit`).

    training: FLOPs per token as TRL's compute_flops_per_token counts them (2 x parameters per token per
    forward) with LoRA's backward ~ one forward (no base-weight gradients), +1 forward with checkpointing,
    the chunked head's recompute, and the forwards outside the micro-batches (extra_forwards), at the card's
    train_flops_fraction of peak scaled by the micro-batch's fill (MICROBATCH_FILL_TOKENS), plus its fixed
    seconds per micro-batch. 4-bit adds the dequantisation stream (DEQUANT_BYTES_PER_WEIGHT per projection
    weight per pass; in decode where a step runs several rows, `decode_rows`) at the card's
    dequant_bandwidth_fraction. generation: prefill at the training rate (prefix caching computes the group's
    shared full KV blocks once: vllm/v1/core/kv_cache_manager.py get_computed_blocks), then one decode step per
    token of each wave's longest completion, bound by reading the weights and the live KV cache at the card's
    decode_bandwidth_fraction, plus a per-step overhead (HF generate: the card's eager_layer_s per layer; vLLM
    3 ms: `vllm_step_overhead`; an fp8 KV cache halves the KV reads). When vLLM's KV cache (or
    backend.vllm_max_num_seqs) holds fewer sequences than the generation batch (the estimator's
    `generation_waves`, vLLM's scheduler queueing the rest), the weights are read and the per-step overhead
    paid once per wave, the KV reads stay the batch's; so per generation round (`generation_rounds`). The
    card's fixed seconds are generation's, once a round: TRL's `_generate_single_turn` syncs the weights to
    vLLM first. Sources: NVIDIA datasheets, the efficiencies' own (conf/gpu/*.yaml), TRL compute_flops_per_token.
    Seconds are one rank's (the ranks step together); tokens/s is the trial's, over its ranks, at the worst case.
    """
    device = target_device(cfg)
    backend = resolve_backend_for(cfg, device)
    s = shapes(cfg, backend)
    card = card_of(cfg)
    n = param_counts(s)
    vllm = generates_with_vllm(cfg, backend)
    engine = vllm_engine_settings(cfg) if backend == "trl_vllm" else {}
    assumptions = estimate(cfg, logits_mode, device=device, backend=backend).assumptions if vllm else {}
    rounds = generation_rounds(cfg, s)
    waves = math.ceil((assumptions.get("generation_waves") or 1) / rounds) if vllm else 1  # per round
    dequant = n["linear"] * DEQUANT_BYTES_PER_WEIGHT if s.four_bit else 0
    group = max(int(cfg.get("num_generations") or 1), 1)
    block = VLLM_GPU_BLOCK_TOKENS if device == "cuda" else VLLM_CPU_BLOCK_TOKENS
    shared = (s.P // block) * block if vllm and engine.get("enable_prefix_caching", PREFIX_CACHING) else 0
    prompts = math.ceil(s.G / group)
    pool = float(assumptions.get("kv_cache_available_bytes") or 0) if vllm else 0.0
    m = {
        "s": s,
        "vllm": vllm,
        "waves": waves,
        "rounds": rounds,
        "layer_flops": 2 * n["linear"] + 4 * s.nh * s.hd * s.S * s.L,  # per token, forward
        "head_flops": 2 * s.V * s.H * (2 if logits_mode == "full" else 4),  # per token, forward + backward
        "head_forward": 2 * s.V * s.H,
        "passes": 2 + recompute_passes(s),
        "extra": extra_forwards(cfg, vllm),
        "dequant": dequant,
        "decode_dequant": dequant if decode_rows(s, rounds, assumptions, vllm) > 1 else 0,  # one row: gemv_4bit
        "weight_read": weights_bytes(s),
        "kv_per_token": kv_bytes_per_token(s, vllm_kv_element_bytes(engine, s.wb) if vllm else s.wb),
        "step_overhead": vllm_step_overhead(s, engine, device) if vllm else card.eager_layer_s * s.L,
        "prefill_tokens": s.G * s.P - (s.G - prompts) * shared,
        "pool_s": pool * card.pool_s_per_byte,
    }
    worst = _phases(m, card, float(s.C), float(s.C))
    mean, longest = expected_completion_tokens(cfg, s)
    expected = _phases(m, card, mean, longest)
    limit = _phases(m, card, float(s.C), float(s.C), limit=True)
    ranks = processes_of(cfg)
    step = worst["step_s"]
    return {
        "training_s": worst["training_s"],
        "generation_s": worst["generation_s"],
        "generation_waves": waves,
        "step_s": step,
        # every rank trains its own G completions in the same step time: the trial's tokens/s is N ranks'
        "tokens_per_s": ranks * s.G * s.S / step,
        "rank_tokens_per_s": s.G * s.S / step,
        "completion_tokens": s.C,
        "training_flops": worst["training_flops"],
        "decode_bytes": worst["decode_bytes"],
        "peak_flops": card.peak_flops,
        "peak_bandwidth": card.bandwidth,
        "expected": {**expected, "tokens_per_s": ranks * s.G * (s.P + mean) / expected["step_s"]},
        "limit": limit,
    }


# The FLOP convention of mfu_training, as metrics.json states it.
MFU_CONVENTION = (
    "model FLOPs: 2 x parameters per token per forward (TRL compute_flops_per_token), LoRA's backward as one forward, "
    "checkpointing's recompute and the old/reference forwards included, at the budget's padded length; "
    "over the card's dense 16-bit peak (conf/gpu tflops_bf16)"
)
SPEED_KEYS = (
    "predicted_generation_s",
    "predicted_training_s",
    "generation_s",
    "training_s",
    "completion_tokens_mean",
    "completion_tokens_max",
    "limit_step_s",
    "mfu_training",
    "decode_bandwidth_use",
)


def speed_record(measured: dict, model: dict | None, why_no_model: str | None = None) -> dict:
    """A trial's speed against its card's limit.

    Args:
        measured: What the trial measured: metrics.json's history and generation_times_s (each step's
            seconds and its generation's, over the steps speed_meter's step time is taken from).
        model: This model at the trial's config (None: it could not run).
        why_no_model: Why the model could not run.

    Returns:
        Every key of SPEED_KEYS; a null one has its reason in `speed_unknown`.
    """
    out: dict = dict.fromkeys(SPEED_KEYS)
    unknown: dict[str, str] = {}
    steps, gens = measured.get("history") or [], measured.get("generation_times_s") or []
    if steps and len(gens) == len(steps):  # one generation per step: the steps the step time is taken from
        pairs = list(zip(steps, gens))[1:] or list(zip(steps, gens))
        pairs = [(r, g) for r, g in pairs if not r.get("tracked")] or pairs  # as speed_meter.summary leaves them
        out["generation_s"] = statistics.median(g for _, g in pairs)
        out["training_s"] = statistics.median(max(r["step_time_s"] - g, 0.0) for r, g in pairs)
    else:
        why = "TRL's _generate_single_turn was not timed once per step (no step finished, or another TRL version)"
        unknown.update(generation_s=why, training_s=why)
    rows = (measured.get("history") or [])[1:] or (measured.get("history") or [])
    means = [r["completion_length"] for r in rows if r.get("completion_length") is not None]
    longest = [r["completion_length_max"] for r in rows if r.get("completion_length_max") is not None]
    out["completion_tokens_mean"] = sum(means) / len(means) if means else None
    out["completion_tokens_max"] = max(longest) if longest else None
    for key, values in (("completion_tokens_mean", means), ("completion_tokens_max", longest)):
        if not values:
            unknown[key] = "TRL logged no completion lengths (no step finished)"
    if model is None:
        for key in ("predicted_generation_s", "predicted_training_s", "limit_step_s", "mfu_training", "decode_bandwidth_use"):
            unknown[key] = f"the throughput model could not run: {why_no_model}"
    else:
        out["predicted_generation_s"], out["predicted_training_s"] = model["generation_s"], model["training_s"]
        out["limit_step_s"] = model["limit"]["step_s"]
        if out["training_s"]:
            out["mfu_training"] = model["training_flops"] / (out["training_s"] * model["peak_flops"])
        else:
            unknown["mfu_training"] = "no training time measured"
        if out["generation_s"]:
            out["decode_bandwidth_use"] = model["decode_bytes"] / (out["generation_s"] * model["peak_bandwidth"])
        else:
            unknown["decode_bandwidth_use"] = "no generation time measured"
    out["mfu_convention"] = MFU_CONVENTION
    out["speed_unknown"] = unknown
    return out


def speed_forecast(cfg: Any, logits_mode: str | None = None, n_trials: int | None = None) -> dict:
    """What `grpo-sweep estimate` and `plan` say of a recipe's speed before launch.

    Args:
        cfg: The recipe's composed config.
        logits_mode: The logits mode to price (None: the config's).
        n_trials: A sweep's trial count, each trial running this config (`grpo-sweep plan` prices a
            sweep's own space); None: no sweep cost.

    Returns:
        Seconds per step (generation and training) at the worst case, at the expected length and at the
        card's limit, the run's wall time for task.max_steps (null: no run time), one trial of it
        (trial_forecast) and, with n_trials, the sweep's cost.
    """
    r = relative_step_time(cfg, logits_mode)
    keys = ("step_s", "generation_s", "training_s")
    out = {
        "worst_case": {**{k: r[k] for k in keys}, "completion_tokens": r["completion_tokens"], "tokens_per_s": r["tokens_per_s"]},
        "expected": {**{k: r["expected"][k] for k in keys}, "completion_tokens": r["expected"]["completion_tokens"]},
        "limit": {k: r["limit"][k] for k in keys},
        "max_steps": cfg.task.get("max_steps"),
    }
    steps = out["max_steps"]
    out["run_s"] = None if steps is None else {case: steps * out[case]["step_s"] for case in ("worst_case", "expected")}
    out["trial"] = trial = trial_forecast(cfg, r["step_s"])
    if n_trials is not None:
        why = (
            f"n_trials={n_trials} trials, each this config: its start + trial.steps={trial['steps']} worst-case steps; "
            "`grpo-sweep plan` prices a sweep's own space"
        )
        out["sweep"] = sweep_cost(n_trials, trial["gpu_s"], 0, 0.0, why)
    return out


def trial_start_s(cfg: Any) -> float:
    """Seconds from a trial's launch to its first step: the process's imports, the weights read once by the
    trainer and once more by vLLM (its own copy, colocated or served), and vLLM's engine start (PROCESS_START_S,
    LOAD_BYTES_PER_S, VLLM_START_S and their sources)."""
    device = target_device(cfg)
    backend = resolve_backend_for(cfg, device)
    vllm = generates_with_vllm(cfg, backend)
    loads = 2 if vllm else 1
    return PROCESS_START_S + loads * weights_bytes(shapes(cfg, backend)) / LOAD_BYTES_PER_S + (VLLM_START_S if vllm else 0.0)


def trial_forecast(cfg: Any, step_s: float) -> dict:
    """One trial of cfg as a sweep runs it: its start (trial_start_s), then trial.steps steps at the worst case
    (step_s: trials pad every completion to the budget), on trial.num_processes cards."""
    steps = int(cfg.trial.get("steps") or 1)
    start = trial_start_s(cfg)
    seconds = start + steps * step_s
    return {"start_s": start, "steps": steps, "trial_s": seconds, "gpus": processes_of(cfg), "gpu_s": seconds * processes_of(cfg)}


def sweep_cost(search_trials: float, search_gpu_s: float, confirm_runs: int, confirm_gpu_s: float, assumption: str) -> dict:
    """A sweep's forecast cost in GPU-minutes: its search trials at their mean predicted GPU-seconds and its
    confirmation runs at the finalist's.

    Args:
        search_trials: the search trials expected to run (pruned ones load no model and cost nothing).
        search_gpu_s: one search trial's predicted GPU-seconds (trial_forecast's gpu_s; a mean over the space).
        confirm_runs: the confirmation runs reserved in n_trials.
        confirm_gpu_s: one confirmation run's predicted GPU-seconds.
        assumption: what the figure assumes, in words, as plan and estimate print it.

    Returns:
        {"gpu_minutes", "search_trials", "confirm_runs", "assumption"}.
    """
    total = search_trials * search_gpu_s + confirm_runs * confirm_gpu_s
    return {"gpu_minutes": total / 60, "search_trials": search_trials, "confirm_runs": confirm_runs, "assumption": assumption}


def format_duration(seconds: float) -> str:
    """Seconds as the largest two units: 45 s, 12 min 5 s, 3 h 20 min."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def speed_lines(forecast: dict, card: str) -> list[str]:
    """The forecast as `grpo-sweep estimate` prints it."""
    w, e, lim = forecast["worst_case"], forecast["expected"], forecast["limit"]

    def one(case: dict) -> str:
        return f"{case['step_s']:.3g} s/step (generation {case['generation_s']:.3g} s, training {case['training_s']:.3g} s)"

    lines = [
        f"speed on {card} (throughput model): worst case ({w['completion_tokens']:.0f}-token completions, what trials "
        f"measure and the sweep ranks by) {one(w)}",
        f"  expected ({e['completion_tokens']:.0f}-token completions on average, task.expected_completion_tokens) {one(e)}",
        f"  the card's limit (peak FLOPs and bandwidth, no overheads) {one(lim)}",
    ]
    if forecast["run_s"] is None:
        lines.append("  run time: set task.max_steps=N for the whole run's wall time")
    else:
        run = forecast["run_s"]
        lines.append(
            f"  {forecast['max_steps']} steps (task.max_steps): {format_duration(run['worst_case'])} at the worst case, "
            f"{format_duration(run['expected'])} expected"
        )
    trial = forecast["trial"]
    lines.append(
        f"  one sweep trial: {format_duration(trial['trial_s'])} ({format_duration(trial['start_s'])} to start, "
        f"{trial['steps']} worst-case steps) on {trial['gpus']} GPU{'s' if trial['gpus'] > 1 else ''}"
    )
    if forecast.get("sweep"):
        sweep = forecast["sweep"]
        lines.append(f"  sweep cost: {sweep['gpu_minutes']:.3g} GPU-minutes ({sweep['assumption']})")
    return lines


def limit_words(record: dict) -> str | None:
    """How far a trial is from its card's limit, in words ("38 % of this card's limit: training at 41 % MFU,
    decoding at 22 % of bandwidth"); None when its record has no limit or step time."""
    limit, step = record.get("limit_step_s"), record.get("step_time_s")
    if not limit or not step:
        return None
    parts = []
    if record.get("mfu_training") is not None:
        parts.append(f"training at {100 * record['mfu_training']:.0f} % MFU")
    if record.get("decode_bandwidth_use") is not None:
        parts.append(f"decoding at {100 * record['decode_bandwidth_use']:.0f} % of bandwidth")
    return f"{100 * limit / step:.0f} % of this card's limit" + (f": {', '.join(parts)}" if parts else "")
