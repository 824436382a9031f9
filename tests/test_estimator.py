"""The estimator: monotone in the levers, 4-bit ~1/4 of bf16, the seed's case, the CLI."""

from __future__ import annotations

import functools
import json
import math
from importlib.metadata import version

import pytest
from helpers.config import compose
from helpers.runners import cli
from omegaconf import OmegaConf

from grpo_sweep.memory.estimator import GiB, estimate

SEED = ["model=gemma3_1b", "gpu=l4_24g", "gpu.memory_gib=22"]
TRL_CHUNKED = tuple(int(p) for p in version("trl").split(".")[:2]) >= (1, 16)


@functools.cache
def _base(overrides: tuple):
    return compose(list(overrides))


def total(overrides, mode=None):
    """Compose the group selections once (Hydra is the slow part), then set the plain keys."""
    groups = tuple(o for o in overrides if o.split("=")[0] in ("model", "gpu"))
    cfg = OmegaConf.create(OmegaConf.to_container(_base(groups)))
    for item in overrides:
        if item not in groups:
            key, value = item.split("=")
            OmegaConf.update(cfg, key, int(value), merge=False)
    return estimate(cfg, mode).total_bytes


@pytest.mark.parametrize("model", ["tiny", "gemma3_1b"])
@pytest.mark.parametrize("mode", ["chunked", "full"])
@pytest.mark.parametrize(
    "key,values",
    [
        ("per_device_train_batch_size", [2, 4, 8, 16]),
        ("max_seq_length", [256, 512, 1024, 2048]),
        ("lora_rank", [4, 16, 32, 128]),
    ],
)
def test_more_of_a_lever_never_needs_less_memory(model, mode, key, values):
    base = [f"model={model}", "gpu=l4_24g", "max_prompt_length=64", "num_generations=2"]
    totals = [total(base + [f"{key}={v}"], mode) for v in values]
    assert all(b >= a for a, b in zip(totals, totals[1:])), totals
    assert totals[-1] > totals[0]  # and each of these levers does cost memory


def test_more_rank_more_trainable_bytes_linearly():
    r16 = estimate(compose(SEED + ["lora_rank=16"])).components["lora_params"]
    r32 = estimate(compose(SEED + ["lora_rank=32"])).components["lora_params"]
    assert r32 == 2 * r16


def test_num_generations_at_fixed_batch_does_not_change_training_memory():
    # TRL 1.x: per_device_train_batch_size counts completions; num_generations only groups them.
    a = estimate(compose(SEED + ["per_device_train_batch_size=8", "num_generations=2"]))
    b = estimate(compose(SEED + ["per_device_train_batch_size=8", "num_generations=8"]))
    assert a.total_bytes == b.total_bytes
    # More generations at a fixed number of prompts means a bigger batch: never less memory.
    c = estimate(compose(SEED + ["per_device_train_batch_size=16", "num_generations=8"]))
    assert c.total_bytes > b.total_bytes


def test_four_bit_weights_are_about_a_quarter_of_bf16():
    bf16 = estimate(compose(["model=llama3_2_1b", "gpu=l4_24g", "model.arch.tie_word_embeddings=true"]))
    nf4 = estimate(compose(["model=llama3_2_1b", "gpu=l4_24g", "load_in_4bit=true"]))
    # Only the projections are quantised; embeddings stay bf16. Compare the projections' share.
    from grpo_sweep.memory.shapes import param_counts, shapes

    s = shapes(compose(["model=llama3_2_1b", "gpu=l4_24g"]), "trl")
    linear_bf16 = param_counts(s)["linear"] * 2
    other = param_counts(s)["other"] * 2
    ratio = (nf4.components["weights"] - other) / linear_bf16
    assert 0.25 <= ratio <= 0.27, ratio
    assert nf4.components["weights"] < 0.5 * bf16.components["weights"]


def test_cpu_is_float32_and_cuda_is_bfloat16():
    cpu = estimate(compose(["model=qwen2_5_0_5b", "gpu=cpu"]))
    cuda = estimate(compose(["model=qwen2_5_0_5b", "gpu=l4_24g"]))
    assert cpu.assumptions["device"] == "cpu" and cuda.assumptions["device"] == "cuda"
    assert cpu.components["weights"] == 2 * cuda.components["weights"]
    assert cpu.budget_bytes is None and cpu.fits and cpu.headroom_bytes is None


# Gemma 3 1B has 999,885,952 parameters (the count Hugging Face lists for google/gemma-3-1b-it; by
# hand: embeddings 262144 x 1152 + 26 layers x (q 1152x1024 + k, v 1152x256 + o 1024x1152 + MLP
# 3 x 1152x6912 + 4 norms x 1152 + q/k norms 2 x 256) + the final norm 1152).
GEMMA3_1B_PARAMS = 999_885_952


def lora_params_by_hand(hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int, rank: int) -> int:
    """LoRA on q_proj and v_proj: A (rank x in) + B (out x rank) per module, per layer."""
    q = rank * hidden + heads * head_dim * rank
    v = rank * hidden + kv_heads * head_dim * rank
    return layers * (q + v)


def test_weights_and_lora_bytes_by_hand():
    """Independent oracles: the published parameter count, and LoRA's shapes counted by hand."""
    est = estimate(compose(SEED + ["preset=seed_baseline"]))
    assert est.components["weights"] == 2 * GEMMA3_1B_PARAMS  # bfloat16 on a CUDA card
    lora = lora_params_by_hand(1152, 26, 4, 1, 256, rank=32)  # 2,981,888 parameters
    assert est.components["lora_params"] == 4 * lora  # LoRA weights are float32
    assert est.components["gradients"] == 4 * lora and est.components["optimizer_state"] == 8 * lora  # AdamW: 2 moments
    assert all(v >= 0 for v in est.components.values())


def test_seed_case():
    full = estimate(compose(SEED + ["preset=seed_baseline"]), "full")
    assert not full.fits and full.headroom_bytes < 0
    assert full.dominant == "logits" and full.components["logits"] > 10 * GiB
    optimized = estimate(compose(SEED + ["preset=seed_optimized"]), "full")
    assert optimized.fits and optimized.headroom_bytes > 0
    chunked = estimate(compose(SEED + ["preset=seed_baseline"]), "chunked")
    assert chunked.fits and chunked.components["logits"] < 0.5 * GiB
    assert chunked.assumptions["logits_mode"] == "chunked"
    # The default is what the installed TRL does: chunked fused head from 1.16, full logits before.
    default = estimate(compose(SEED + ["preset=seed_baseline"])).assumptions["logits_mode"]
    assert default == ("chunked" if TRL_CHUNKED else "full")


def test_seed_case_with_vllm_colocate():
    # The seed's users run vLLM colocate: its pool (util x card) comes on top of training.
    base = compose(SEED + ["preset=seed_baseline", "backend.name=trl_vllm"])
    est = estimate(base, "full")
    assert est.components["vllm_pool"] == math.ceil(0.6 * 22 * GiB)  # vLLM's request_memory
    assert not est.fits and est.kv_cache_ok
    assert estimate(compose(SEED + ["preset=seed_optimized", "backend.name=trl_vllm"]), "full").fits
    # Unsloth shares the weights with vLLM and offloads checkpoints: the baseline fits there.
    unsloth = estimate(compose(SEED + ["preset=seed_baseline", "backend.name=unsloth"]))
    assert unsloth.components["weights"] == 0 and unsloth.fits


def test_kv_cache_too_small_is_reported():
    est = estimate(compose(SEED + ["preset=seed_baseline", "backend.name=trl_vllm", "gpu_memory_utilization=0.1"]))
    assert est.kv_cache_ok is False and not est.fits


def test_estimate_cli_table_and_json():
    args = ["estimate", *SEED, "preset=seed_baseline"]
    table = cli(*args, "logits_mode=full")
    assert table.returncode == 0, table.stderr
    assert "logits" in table.stdout and "short by" in table.stdout and "dominant: logits" in table.stdout
    js = cli(*args, "--json")
    data = json.loads(js.stdout)
    assert data["fits"] is TRL_CHUNKED and data["budget_bytes"] == 22 * GiB
    assert data["components"]["weights"] == 2 * GEMMA3_1B_PARAMS
    assert data["assumptions"]["logits_mode"] == ("chunked" if TRL_CHUNKED else "full")
    bad = cli(*args, "logits_mode=tiled")
    assert bad.returncode == 2 and "logits_mode=tiled" in bad.stderr and "chunked, full" in bad.stderr


def _est(total_gib: float, budget_gib: float | None, *, fits=None, kv_ok=None, **assumptions):
    """A hand-built Estimate: 3/4 of the total in weights (the dominant part), 1/4 in logits."""
    from grpo_sweep.memory.estimator import Estimate

    total, budget = int(total_gib * GiB), None if budget_gib is None else int(budget_gib * GiB)
    headroom = None if budget is None else budget - total
    fits = (headroom is None or headroom >= 0) if fits is None else fits
    components = {"weights": total * 3 // 4, "logits": total - total * 3 // 4}
    return Estimate(components, total, budget, headroom, fits, kv_ok, dict(assumptions))


def test_verdict_sentences_by_hand():
    """The estimator's one-line verdict, case by case, against sentences written out by hand
    (the CLI test above reaches it only in a child process, which mutation testing cannot see)."""
    from grpo_sweep.memory.estimator import verdict

    dom = "dominant: weights (3.00 GiB)"
    assert verdict(_est(4, None)) == f"no budget (gpu.memory_gib is null): needs 4.00 GiB; {dom}"
    assert verdict(_est(4, 5)) == f"fits with 1.00 GiB headroom; {dom}"
    assert verdict(_est(4, 4)) == f"fits with 0.00 GiB headroom; {dom}"  # exactly full still fits
    assert verdict(_est(4, 2.5)) == f"short by 1.50 GiB; {dom}"
    kv = "; vLLM would refuse to start: its KV cache cannot hold one max_seq_length sequence"
    assert verdict(_est(4, 5, fits=False, kv_ok=False)) == f"memory fits but with 1.00 GiB headroom{kv}; {dom}"
    assert verdict(_est(4, 3, kv_ok=False)) == f"short by 1.00 GiB{kv}; {dom}"
    no_kv = "; vLLM would refuse to start: its share leaves no KV cache for one max_seq_length sequence"
    cpu = _est(4, 5, fits=False, kv_ok=False, vllm_weights_bytes=GiB)
    assert verdict(cpu) == f"memory fits but with 1.00 GiB headroom{no_kv}; {dom}"
    # A vLLM-CPU plan whose KV cache is fine says nothing about vLLM.
    assert verdict(_est(4, 5, kv_ok=True, vllm_weights_bytes=GiB)) == f"fits with 1.00 GiB headroom; {dom}"
    startup = "; vLLM would refuse to start (free memory < gpu_memory_utilization x total)"
    assert verdict(_est(4, 5, fits=False, vllm_startup_ok=False)) == f"memory fits but with 1.00 GiB headroom{startup}; {dom}"
    both = _est(4, 3, kv_ok=False, vllm_startup_ok=False)
    assert verdict(both) == f"short by 1.00 GiB{kv}{startup}; {dom}"
    assert verdict(_est(4, 5, vllm_startup_ok=True)) == f"fits with 1.00 GiB headroom; {dom}"
    # A cache holding fewer sequences than the batch fits; the verdict says generation runs in waves.
    waves = _est(4, 5, kv_ok=True, generation_waves=3, kv_cache_sequences=3, generation_batch=8)
    assert verdict(waves) == (
        "fits with 1.00 GiB headroom; generation runs in about 3 waves (vLLM's KV cache holds 3 of the 8 "
        f"max_seq_length sequences at once; its scheduler queues the rest); {dom}"
    )
    assert verdict(_est(4, 5, kv_ok=True, generation_waves=1, kv_cache_sequences=9, generation_batch=8)).startswith("fits with")


def test_the_trainer_settings_memory_terms_by_hand():
    """Each trainer setting's term, against the shapes counted by hand (Gemma 3 1B on a 22 GiB L4, bf16)."""
    from grpo_sweep.memory.shapes import shapes

    base = SEED + ["preset=seed_baseline", "gradient_checkpointing=true"]
    s = shapes(compose(base), "trl")
    every = estimate(compose(base)).assumptions
    half = estimate(compose([*base, "gradient_checkpointing_every_n_layers=2"]))
    assert (every["checkpointed_layers"], half.assumptions["checkpointed_layers"]) == (26, 13)
    assert estimate(compose(base)).components["activations"] < half.components["activations"]
    assert half.components["activations"] < estimate(compose(SEED + ["preset=seed_baseline"])).components["activations"]
    # offload: every checkpointed layer's input (B x S x H, bf16) leaves the card
    offload = estimate(compose([*base, "gradient_checkpointing_offload=true"]))
    assert estimate(compose(base)).components["activations"] - offload.components["activations"] == s.B * s.S * 26 * s.H * 2
    assert offload.assumptions["checkpoints_offloaded"] is True
    # pad_to_multiple_of: prompt and completion rounded up each
    padded = estimate(compose([*base, "pad_to_multiple_of=100"])).assumptions
    assert (padded["prompt_tokens"], padded["completion_tokens"]) == (-(-s.P // 100) * 100, -(-s.C // 100) * 100)
    # the fp32 LM head: V x H weights at 4 bytes instead of 2 (the tied embedding with it)
    fp32 = estimate(compose([*base, "cast_lm_head_to_fp32=true"]))
    assert fp32.components["weights"] - estimate(compose(base)).components["weights"] == 262144 * 1152 * 2
    # continuous batching: half of what is free when generation starts (TRL's max_memory_percent)
    from grpo_sweep.memory.estimator import hf_generation_bytes

    resident = estimate(compose(base)).phases["generation"] - hf_generation_bytes(s)  # HF generate's cache aside
    cb = estimate(compose([*base, "use_transformers_continuous_batching=true"]))
    assert cb.phases["generation"] == resident + int((22 * GiB - resident) * 0.5)


def test_checkpointing_every_n_layers_recomputes_that_share():
    from grpo_sweep.memory.throughput import relative_step_time

    base = SEED + ["preset=seed_baseline", "gradient_checkpointing=true"]
    times = [relative_step_time(compose([*base, f"gradient_checkpointing_every_n_layers={n}"]))["training_s"] for n in (1, 2, 26)]
    assert times[0] > times[1] > times[2] > relative_step_time(compose(SEED + ["preset=seed_baseline"]))["training_s"]


def test_vllm_engine_settings_terms():
    """backend.vllm_*: each changes the term vLLM's own code changes (memory/estimator.py, memory/throughput.py)."""
    from grpo_sweep.memory.shapes import shapes
    from grpo_sweep.memory.throughput import relative_step_time
    from grpo_sweep.memory.vllm import vllm_cpu_plan, vllm_engine, vllm_graphs_bytes

    card = [*SEED, "backend=trl_vllm", "max_seq_length=1024", "max_prompt_length=256", "per_device_train_batch_size=16"]
    base = estimate(compose(card))
    avail = base.assumptions["kv_cache_available_bytes"]
    assert base.assumptions["vllm_engine_settings"] is None and base.assumptions["generation_waves"] == 1

    s = shapes(compose(card), "trl_vllm")
    colocate = vllm_engine(s, "trl_vllm", {}, budget=None, utilization=0.6, server=False)
    assert (
        base.assumptions["vllm_engine_resolved"]
        == colocate
        == {
            "max_num_batched_tokens": 4096,  # TRL colocate's
            "max_num_seqs": 16,  # TRL colocate's: the generation batch
            "enforce_eager": False,
        }
    )
    eager = estimate(compose(card + ["backend.vllm_enforce_eager=true"]))  # no CUDA graphs captured
    assert eager.assumptions["kv_cache_available_bytes"] == avail + vllm_graphs_bytes(s, colocate) > avail
    assert eager.assumptions["vllm_non_kv_bytes"]["cuda_graphs"] == 0
    tokens = estimate(compose(card + ["backend.vllm_max_num_batched_tokens=8192"]))  # a larger profile run
    assert tokens.assumptions["kv_cache_available_bytes"] == avail - 4096 * (3 * s.I + 4 * s.H) * 2
    assert tokens.components["vllm_pool"] == base.components["vllm_pool"]  # still util x card

    given = estimate(compose(card + ["backend.vllm_kv_cache_memory_bytes=1000000000"]))  # the KV cache as given
    assert given.assumptions["kv_cache_available_bytes"] == 10**9
    assert given.components["vllm_pool"] < base.components["vllm_pool"] and given.headroom_bytes > base.headroom_bytes

    fp8 = estimate(compose(card + ["backend.vllm_kv_cache_dtype=fp8"]))  # one byte per element: twice the tokens
    assert fp8.assumptions["kv_cache_tokens"] in (
        2 * base.assumptions["kv_cache_tokens"],
        2 * base.assumptions["kv_cache_tokens"] + 1,
    )

    seqs = estimate(compose(card + ["backend.vllm_max_num_seqs=4"]))  # the scheduler runs 4 of the 16 at once
    assert seqs.assumptions["generation_waves"] == 4
    slow, fast = relative_step_time(compose(card + ["backend.vllm_max_num_seqs=4"])), relative_step_time(compose(card))
    assert slow["generation_waves"] == 4 and slow["generation_s"] > fast["generation_s"]
    assert relative_step_time(compose(card + ["backend.vllm_enforce_eager=true"]))["generation_s"] > fast["generation_s"]
    assert relative_step_time(compose(card + ["backend.vllm_kv_cache_dtype=fp8"]))["generation_s"] < fast["generation_s"]

    # vLLM-CPU: the KV bytes as given, in whole blocks (64 KiB for the tiny model), whatever the share
    cpu = ["backend=trl_vllm", "gpu=cpu_sim", "gpu.memory_gib=0.125", "max_seq_length=64", "per_device_train_batch_size=2"]
    cpu_cfg = compose(cpu + ["num_generations=2", "backend.vllm_kv_cache_memory_bytes=300000"])
    plan = vllm_cpu_plan(shapes(cpu_cfg, "trl_vllm", "cpu"), 10**6, kv_cache_bytes=300000)
    assert plan["kv_cache_bytes"] == 4 * 65536 and plan["pool_bytes"] == plan["weights_bytes"] + 4 * 65536
    est = estimate(cpu_cfg)
    assert est.assumptions["kv_cache_available_bytes"] == 4 * 65536 and est.components["vllm_pool"] == plan["pool_bytes"]


def test_kv_cache_bytes_known_impossible_before_loading_are_one_line():
    """backend.vllm_kv_cache_memory_bytes larger than the card, or too small for one max_model_len
    sequence of this model (its block bytes from the model's numbers), is refused in one line before
    anything loads; the smallest value that holds one sequence passes. vLLM-CPU: 128-token blocks of
    float32 (64 KiB for the tiny model); a card: 16-token blocks in the model's bf16."""
    from grpo_sweep.config.schema import ConfigError
    from grpo_sweep.memory.vllm import check_kv_cache_bytes

    def refusal(overrides):
        try:
            check_kv_cache_bytes(compose(["backend=trl_vllm", "max_seq_length=256", *overrides]))
        except ConfigError as err:
            assert "\n" not in str(err)
            return str(err)
        return None

    huge = refusal(["gpu=cpu_sim", f"backend.vllm_kv_cache_memory_bytes={10**15}"])
    assert huge.startswith(f"backend.vllm_kv_cache_memory_bytes={10**15}: more than the card's 1.00 GiB (gpu=cpu_sim")
    assert "use at most 1073741824, or null" in huge
    small = refusal(["gpu=cpu_sim", "backend.vllm_kv_cache_memory_bytes=1"])
    assert small == (
        "backend.vllm_kv_cache_memory_bytes=1: too small for one sequence of max_model_len 256 tokens (2 + 1 blocks "
        "of 128 tokens, 64.00 KiB each for this model); use at least 196608, or null (vLLM sizes it from "
        "gpu_memory_utilization)"
    )
    assert refusal(["gpu=cpu_sim", "backend.vllm_kv_cache_memory_bytes=196608"]) is None
    assert refusal(["gpu=cpu_sim", "backend.vllm_kv_cache_memory_bytes=196607"]) is not None
    card = refusal(["gpu=l4_24g", "backend.vllm_kv_cache_memory_bytes=1"])
    assert "(16 + 1 blocks of 16 tokens" in card and "use at least" in card
    assert refusal(["gpu=l4_24g", f"backend.vllm_kv_cache_memory_bytes={10**9}"]) is None
    assert refusal(["gpu=cpu_sim"]) is None  # null: vLLM sizes it
    assert refusal(["gpu=cpu_sim", "gpu.memory_gib=null", "backend.vllm_kv_cache_memory_bytes=196608"]) is None


def _qwen3_8b(**kw):
    """Qwen3-8B's published config (hidden 4096, intermediate 12288, 36 layers, 32 heads, 8 KV heads, head_dim
    128, vocabulary 151936, untied head) as the Unsloth DeepSeek-R1-0528-Qwen3-8B GRPO notebook ran it: 4-bit,
    max_seq_length 2048, LoRA rank 32."""
    from grpo_sweep.memory.shapes import Shapes

    base = dict(family="llama", H=4096, L=36, nh=32, nkv=8, hd=128, I=12288, V=151936, tied=False, qkv_bias=False)
    run = dict(sliding_window=None, B=4, GA=1, G=4, S=2048, P=256, C=1792, rank=32, targets=("q_proj",))
    return Shapes(**base, **run, device="cuda", wb=2, four_bit=True, ckpt=True, **kw)


def test_vllm_pool_split_reproduces_vllms_own_kv_log_line():
    """Unsloth's DeepSeek-R1-0528-Qwen3-8B GRPO notebook on an RTX 4090 (unslothai/notebooks, its recorded
    outputs): gpu_memory_utilization=0.7, load_in_4bit, max_lora_rank=32; vLLM 0.8.5 logged "GPU KV cache
    size: 66,464 tokens". The engine settings are the ones that run's log prints (Unsloth 2025.5: "Chunked
    prefill tokens = 2048. Num Sequences = 128", CUDA graphs on, the checkpoint quantised by vLLM in flight
    with BitsAndBytes' defaults: no double quantisation); the card is the 23.635 GiB torch reported.
    vLLM 0.8 accounted its pool the "0.8" way (all non-torch memory, graphs after the KV cache).

    Tolerance 3 %: the CUDA context is a constant (512 MiB of the 300-600 MiB drivers take: +-150 MiB is
    +-1,100 tokens, 1.6 %), and so is the forward's non-torch growth; the flat split this replaces
    predicted 71,633 (+7.8 %) and fails it."""
    from grpo_sweep.memory.shapes import kv_bytes_per_token
    from grpo_sweep.memory.vllm import unsloth_utilization, vllm_kv_available, vllm_non_kv_bytes, vllm_pool_bytes

    s = _qwen3_8b()
    card = int(23.635 * GiB)
    pool = vllm_pool_bytes(unsloth_utilization(0.7, card), card)
    assert abs(pool / card - 0.6875) < 0.003  # the log's "actual GPU utilization = 68.75%"
    engine = {"max_num_batched_tokens": 2048, "max_num_seqs": 128, "enforce_eager": False, "lora_rank": 32}
    terms = vllm_non_kv_bytes(s, "unsloth", engine, "0.8", double_quant=False)
    tokens = (pool - sum(terms.values())) // kv_bytes_per_token(s, 2)
    assert abs(tokens - 66_464) / 66_464 <= 0.03, (tokens, terms)
    # The pinned vLLM (0.31) charges no CUDA context but subtracts its CUDA-graph estimate before the KV cache.
    now = vllm_non_kv_bytes(s, "unsloth", engine, "0.31", double_quant=False)
    assert now["cuda_graphs"] > 0 and now["non_torch"] == terms["non_torch"] - 512 * 2**20
    assert vllm_kv_available(s, pool, "unsloth", engine) == pool - sum(vllm_non_kv_bytes(s, "unsloth", engine).values())


def test_vllm_engine_knobs_move_the_kv_cache_as_vllm_does():
    """More tokens or sequences in vLLM's profile run leave less KV cache; enforce_eager captures no graphs;
    kv_cache_memory_bytes is the KV cache, exactly; Unsloth's engine tier follows the card."""
    from grpo_sweep.memory.vllm import vllm_engine, vllm_kv_available, vllm_non_kv_bytes

    s = _qwen3_8b()
    pool = 16 * GiB

    def kv(**engine):
        return vllm_kv_available(s, pool, "trl_vllm", {"max_num_batched_tokens": 4096, "max_num_seqs": 256, **engine})

    assert kv(max_num_batched_tokens=8192) < kv() < kv(max_num_batched_tokens=2048)
    assert kv(max_num_batched_tokens=16384) < kv()  # the forward's peak outgrows the sampler's
    assert kv(max_num_seqs=512) < kv() < kv(max_num_seqs=64)
    eager = vllm_non_kv_bytes(s, "trl_vllm", {"max_num_seqs": 256, "enforce_eager": True})
    assert eager["cuda_graphs"] == 0 and kv(enforce_eager=True) > kv()
    assert kv(kv_cache_memory_bytes=3 * 10**9) == 3 * 10**9
    # Unsloth's own tiers: more card, more batched tokens and sequences
    small = vllm_engine(s, "unsloth", {}, budget=int(23.635 * GiB), utilization=0.7, server=False)
    large = vllm_engine(s, "unsloth", {}, budget=80 * GiB, utilization=0.7, server=False)
    assert (small["max_num_batched_tokens"], small["max_num_seqs"], small["lora_rank"]) == (4096, 48, 32)
    assert large["max_num_batched_tokens"] > small["max_num_batched_tokens"] and large["max_num_seqs"] > small["max_num_seqs"]


def test_vllm_max_num_seqs_reaches_the_estimate():
    """backend.vllm_max_num_seqs moves the estimate's KV cache (the profile's sampler rows) and its waves."""
    card = [*SEED, "backend=trl_vllm", "max_seq_length=1024", "max_prompt_length=256", "per_device_train_batch_size=16"]
    many = estimate(compose(card + ["backend.vllm_max_num_seqs=256"])).assumptions
    few = estimate(compose(card + ["backend.vllm_max_num_seqs=8"])).assumptions
    assert many["kv_cache_available_bytes"] < few["kv_cache_available_bytes"]
    assert many["generation_waves"] == 1 and few["generation_waves"] == 2
