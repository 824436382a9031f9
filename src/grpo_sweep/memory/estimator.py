"""Predict a GRPO trial's peak memory from the config alone: pure arithmetic, no torch, no GPU.

`estimate(cfg)` takes the composed train config (the same one train.py runs) and returns bytes per
component at the predicted peak, the budget of the target card (`gpu.memory_gib`) and the verdict.
Every term is derived from the model's `arch` numbers (conf/model/*.yaml) and the levers, following
what the code that really runs (TRL 1.16, transformers 5.x, PEFT, PyTorch autograd) allocates; each
function's docstring names its source. `bench/estimator_accuracy.py` measures the error against the
CPU tensor tracker, `bench/fake_trace.py` against a FakeTensorMode trace of Gemma 3 1B.

Two phases are modelled and the larger one is the peak:
- training (one micro-batch forward + backward, then AdamW): weights, LoRA parameters, their
  gradients and optimiser state, saved activations, the logits computation, inputs;
- generation (HF `generate` for `trl`, vLLM's pool for `trl_vllm` / `unsloth`).

Device: `gpu=cpu` / `gpu=cpu_sim` (or any `gpu.simulated=true`) is the CPU path (float32, TRL's
torch fallback for the fused LM head); every real card is CUDA (bfloat16, Triton fused LM head).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import backends
from ..config.backends import generates_with_vllm
from ..config.split import processes_of
from ..units import GIB as GiB
from ..units import budget_bytes
from .activations import (
    activation_bytes,
    checkpointed_layers,
    continuous_batching_bytes,
    hf_generation_bytes,
    input_bytes,
    logits_bytes,
    offloaded_checkpoint_bytes,
)
from .ranks import rank_terms
from .shapes import (
    CUDA_CONTEXT_BYTES,
    Shapes,
    gradient_bytes,
    kv_bytes_per_token,
    lora_bytes,
    optimizer_bytes,
    param_counts,
    resolve_backend_for,
    shapes,
    target_device,
    trainable_param_count,
    weights_bytes,
)
from .vllm import (
    VLLM_CPU_BLOCK_TOKENS,
    VLLM_GPU_BLOCK_TOKENS,
    kv_cache_capacity,
    unsloth_utilization,
    vllm_cpu_plan,
    vllm_engine,
    vllm_fixed_kv_pool,
    vllm_kv_available,
    vllm_kv_element_bytes,
    vllm_non_kv_bytes,
    vllm_pool_bytes,
)

LOGITS_MODES = ("chunked", "full")


@dataclass
class Estimate:
    """Bytes per component at the predicted peak; they sum to `total_bytes`."""

    components: dict[str, int]
    total_bytes: int
    budget_bytes: int | None
    headroom_bytes: int | None
    fits: bool
    kv_cache_ok: bool | None
    assumptions: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)  # phase -> total bytes
    peak_phase: str = "training"

    @property
    def dominant(self) -> str:
        return max(self.components, key=lambda k: self.components[k])

    def to_dict(self) -> dict:
        out = asdict(self)
        out["dominant"] = self.dominant
        return out


# ----------------------------------------------------------------------------- estimate


def processes(cfg: Any) -> tuple[int, str]:
    """(trial.num_processes, trial.strategy): 1 and ddp when the config names neither."""
    trial = cfg.get("trial") or {}
    return processes_of(cfg), str(trial.get("strategy", "ddp") or "ddp")


@functools.lru_cache(maxsize=1)
def trl_version() -> str | None:
    """The installed TRL's version (None: not installed here). Read from the package metadata,
    never by importing TRL (the estimator does not import torch); once per process: reading the
    metadata cost a fifth of each estimate, and a sweep's start estimates hundreds of points."""
    try:
        from importlib.metadata import version

        return version("trl")
    except Exception:  # noqa: BLE001 - not installed
        return None


def default_logits_mode(backend: str) -> tuple[str, str]:
    """What the chosen backend really does, and why.

    trl / trl_vllm: TRL >= 1.16 patches the model with `add_fused_lm_head` (chunked); older TRL
    materialised full logits. unsloth: Unsloth's GRPO computes log-probs in chunks.
    """
    if backend == "unsloth":
        return "chunked", "Unsloth's chunked GRPO log-prob computation"
    installed = trl_version() or "unknown"
    try:
        parts = tuple(int(p) for p in installed.split(".")[:2])
    except ValueError:  # odd version string: assume the pinned range
        parts = (1, 16)
    if len(parts) < 2 or installed == "unknown":  # not installed here: assume the pinned range
        parts = (1, 16)
    if parts >= (1, 16):
        return "chunked", f"TRL {installed} >= 1.16 fused chunked LM head (add_fused_lm_head)"
    return "full", f"TRL {installed} < 1.16 materialises full-vocabulary logits"


@dataclass(frozen=True)
class _Modelled:
    """What one estimate models, resolved once from the config and read by every step."""

    s: Shapes
    device: str  # "cpu" | "cuda"
    backend: str  # the resolved backend
    logits_mode: str  # chunked | full
    why_mode: str  # where logits_mode came from
    budget: int | None  # the card's bytes (None: gpu.memory_gib is null)
    vllm: bool  # generation runs in vLLM
    sleep: bool  # vLLM sleeps (trl_vllm) or Unsloth stands by while training
    server: bool  # backend.vllm_mode=server: vLLM in its own process on its own devices
    world: int  # trial.num_processes
    strategy: str  # trial.strategy
    offload: bool  # trial.offload: sharded state in host memory (fsdp, zero2, zero3)
    gather: bool  # ds3_gather_for_generation: ZeRO-3 gathers the whole model for HF generation
    engine: dict  # backend.vllm_* engine settings as vLLM takes them (trl_vllm only; config/backends.py)
    vllm_engine: dict  # the settings vLLM's profile runs with: `engine` over the launcher's (`vllm_engine`)
    continuous_batching: bool  # use_transformers_continuous_batching: HF generation's paged pool


def _modelled(cfg: Any, logits_mode: str | None, device: str | None, backend: str | None) -> _Modelled:
    """Resolve the device, backend and logits mode; a logits mode not in LOGITS_MODES is an error.

    Args:
        cfg: The composed train config.
        logits_mode: "chunked", "full", or None (what the backend does).
        device: "cpu" or "cuda"; None: the target card's.
        backend: The resolved backend; None: resolved here.

    Returns:
        The shapes, device, backend and mode the estimate models.
    """
    device = device or target_device(cfg)
    backend = backend or resolve_backend_for(cfg, device)
    why_mode = "given on the command line"
    if logits_mode is None:
        logits_mode, why_mode = default_logits_mode(backend)
    if logits_mode not in LOGITS_MODES:
        raise ValueError(f"logits_mode={logits_mode}: must be one of {', '.join(LOGITS_MODES)}")
    vllm = generates_with_vllm(cfg, backend)
    s = shapes(cfg, backend, device)
    budget = budget_bytes(cfg)
    engine = backends.vllm_engine_settings(cfg) if backend == "trl_vllm" else {}
    server = vllm and backend == "trl_vllm" and cfg.backend.get("vllm_mode", "colocate") == "server"
    sleep_key = "vllm_enable_sleep_mode" if backend == "trl_vllm" else "unsloth_standby"
    world, strategy = processes(cfg)
    return _Modelled(
        s=s,
        device=device,
        backend=backend,
        logits_mode=logits_mode,
        why_mode=why_mode,
        budget=budget,
        vllm=vllm,
        sleep=bool(cfg.backend.get(sleep_key, False)),
        server=server,
        world=world,
        strategy=strategy,
        offload=bool((cfg.get("trial") or {}).get("offload", False)),
        gather=bool(cfg.get("ds3_gather_for_generation", True)),
        engine=engine,
        vllm_engine=(
            vllm_engine(s, backend, engine, budget=budget, utilization=cfg.gpu_memory_utilization, server=server) if vllm else {}
        ),
        continuous_batching=bool(cfg.get("use_transformers_continuous_batching")),
    )


def _vllm_pool(cfg: Any, m: _Modelled) -> tuple[int, dict | None]:
    """vLLM's pool in bytes (0 without vLLM or without a budget): util x card (Unsloth: the utilization it
    rescales, `unsloth_utilization`), and on vLLM-CPU (trl_vllm on the CPU) its plan: the share's weights
    plus whole KV blocks (`vllm_cpu_plan`), whose pool it is."""
    pool = 0
    if m.vllm and m.budget is not None:
        util = cfg.gpu_memory_utilization
        pool = vllm_pool_bytes(unsloth_utilization(util, m.budget) if m.backend == "unsloth" else util, m.budget)
    if m.vllm and m.device == "cpu" and m.backend == "trl_vllm":  # vLLM-CPU: the share's weights + whole KV blocks
        kv_bytes = m.engine.get("kv_cache_memory_bytes")
        cpu_plan = vllm_cpu_plan(m.s, pool if m.budget is not None else None, kv_cache_bytes=kv_bytes)
        return cpu_plan["pool_bytes"], cpu_plan
    if m.vllm and m.engine.get("kv_cache_memory_bytes"):  # a card: the KV bytes as given, not util x card
        return vllm_fixed_kv_pool(m.s, m.backend, m.vllm_engine), None
    return pool, None


def _single_process_phases(cfg: Any, m: _Modelled, pool: int) -> dict[str, dict[str, int]]:
    """Each phase's components in one process: training (forward + backward + AdamW) and generation
    (HF generate's KV cache and temporaries, or vLLM's pool).

    Args:
        cfg: The composed train config.
        m: What the estimate models.
        pool: vLLM's pool in bytes (0 without vLLM).

    Returns:
        Each phase's components, in bytes.
    """
    s = m.s
    weights = weights_bytes(s)
    act = activation_bytes(s) - offloaded_checkpoint_bytes(s)
    train = {
        "weights": 0 if (m.backend == "unsloth" and m.vllm) else weights,  # Unsloth with vLLM shares its weights
        "lora_params": lora_bytes(s),
        "gradients": gradient_bytes(s),
        "optimizer_state": optimizer_bytes(s),
        "activations": act + input_bytes(s),
        "logits": logits_bytes(s, m.logits_mode),
        "generation": 0,
        "vllm_pool": 0,
        "cuda_context": CUDA_CONTEXT_BYTES if m.device == "cuda" else 0,
    }
    gen = dict(train, activations=input_bytes(s), logits=0, gradients=0)
    # backend.vllm_mode=server: vLLM runs in its own process on its own devices (trial.vllm_devices);
    # the training card holds no pool and the trainer generates nothing itself.
    if m.vllm and not m.server:
        # Asleep while training, vLLM keeps nothing (trl_vllm) or the weights it shares (Unsloth's standby).
        train["vllm_pool"] = (weights if m.backend == "unsloth" else 0) if m.sleep else pool
        gen["vllm_pool"] = pool
    elif not m.vllm:  # HF generation: its paged pool (continuous batching) or generate's KV cache
        gen["generation"] = (
            continuous_batching_bytes(cfg, s, m.budget, sum(gen.values())) if m.continuous_batching else hf_generation_bytes(s)
        )
    return {"training": train, "generation": gen}


def _rank_phases(m: _Modelled, single: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Each phase's components on the largest rank (`rank_terms`); both phases list the same keys."""
    phases = {
        p: rank_terms(m.s, m.world, m.strategy, p, c, hf_generate=not m.vllm, offload=m.offload, gather=m.gather)
        for p, c in single.items()
    }
    train, gen = phases["training"], phases["generation"]
    for key in set(train) | set(gen):
        train.setdefault(key, 0)
        gen.setdefault(key, 0)
    return phases


def _kv_cache(cfg: Any, m: _Modelled, pool: int, cpu_plan: dict | None) -> tuple[bool | None, dict]:
    """Whether vLLM's KV cache holds one max_seq_length sequence (None: no vLLM, or no budget on a
    card), and the numbers behind it for the assumptions.

    Args:
        cfg: The composed train config.
        m: What the estimate models.
        pool: vLLM's pool in bytes.
        cpu_plan: vLLM-CPU's plan (`vllm_cpu_plan`), or None on a card.

    Returns:
        (whether one sequence fits, the numbers behind it).
    """
    s = m.s
    if cpu_plan is not None:
        capacity = kv_cache_capacity(s, cpu_plan["kv_cache_bytes"], VLLM_CPU_BLOCK_TOKENS, 4, m.engine.get("max_num_seqs"))
        kv_info = {
            "kv_cache_available_bytes": cpu_plan["kv_cache_bytes"],
            "kv_cache_tokens": cpu_plan["kv_cache_bytes"] // kv_bytes_per_token(s, 4),
            "vllm_weights_bytes": cpu_plan["weights_bytes"],
            "vllm_share_bytes": None if m.budget is None else vllm_pool_bytes(cfg.gpu_memory_utilization, m.budget),
        }
    elif m.vllm and (m.budget is not None or m.engine.get("kv_cache_memory_bytes")):
        available = vllm_kv_available(s, pool, m.backend, m.vllm_engine)
        kv_elem = vllm_kv_element_bytes(m.engine, 2)
        capacity = kv_cache_capacity(s, available, VLLM_GPU_BLOCK_TOKENS, kv_elem, m.vllm_engine.get("max_num_seqs"))
        kv_info = {
            "vllm_non_kv_bytes": vllm_non_kv_bytes(s, m.backend, m.vllm_engine),
            "kv_cache_available_bytes": int(available),
            "kv_cache_tokens": max(int(available // kv_bytes_per_token(s, kv_elem)), 0),
        }
    else:
        return None, {}
    # Feasible when one max_seq_length sequence fits (vLLM's rule); fewer sequences than the
    # generation batch only means generation runs in waves.
    kv_ok = capacity["one_sequence_ok"]
    kv_info.update(
        kv_cache_needed_bytes=capacity["min_bytes"],
        kv_cache_batch_bytes=capacity["batch_bytes"],
        kv_cache_one_sequence_ok=kv_ok,
        kv_cache_block_tokens=capacity["block_tokens"],
        kv_cache_sequences=capacity["sequences"],
        generation_waves=capacity["waves"],
    )
    # server mode: the pool is on its own devices; no budget (kv_cache_memory_bytes alone): nothing to check
    if m.backend == "trl_vllm" and cpu_plan is None and not m.server and m.budget is not None:
        free_at_start = m.budget - weights_bytes(s) - CUDA_CONTEXT_BYTES
        kv_info["vllm_startup_ok"] = free_at_start >= pool
    return kv_ok, kv_info


def _assumptions(cfg: Any, m: _Modelled, pool: int, single: dict[str, dict[str, int]], kv_info: dict) -> dict:
    """What the estimate assumed, for the table's notes and metrics.json's `estimate`.

    Args:
        cfg: The composed train config.
        m: What the estimate models.
        pool: vLLM's pool in bytes.
        single: Each phase's components in one process.
        kv_info: The KV cache's numbers (`_kv_cache`).

    Returns:
        The assumptions, by name.
    """
    s = m.s
    assumptions = {
        "device": m.device,
        "dtype_bytes": s.wb,
        "backend": m.backend,
        "backend_requested": cfg.backend.name,
        "logits_mode": m.logits_mode,
        "logits_mode_source": m.why_mode,
        "logits_mode_trl_version": trl_version(),  # the TRL version the logits term was chosen for
        "gradient_checkpointing": s.ckpt,
        "checkpointed_layers": checkpointed_layers(s),
        "checkpoints_offloaded": s.ckpt and s.ckpt_offload,
        "worst_case_lengths": "prompt = max_prompt_length, completion = max_seq_length - max_prompt_length",
        "prompt_tokens": s.P,
        "completion_tokens": s.C,
        "micro_batch_tokens": s.B * s.S,
        "generation_batch": s.G,
        "per_device_train_batch_size_counts": "completions (TRL 1.x); num_generations only groups them",
        "trainable_params": trainable_param_count(s),
        "full_finetune": s.full,
        "world_size": m.world,
        "strategy": m.strategy,
        "params": param_counts(s)["total"],
        "vllm_sleep": m.sleep if m.vllm else None,
        "vllm_mode": (cfg.backend.get("vllm_mode", "colocate") if m.vllm else None),
        # server mode: the server's pool on its own devices, outside the training budget
        "vllm_server_bytes": int(pool) if m.server else None,
        "vllm_tensor_parallel_size": int(cfg.backend.get("vllm_tensor_parallel_size", 1)) if m.server else None,
        "vllm_engine_settings": m.engine or None,  # backend.vllm_* as vLLM takes them (config/backends.py)
        "vllm_engine_resolved": m.vllm_engine or None,  # what vLLM's profile runs with (`vllm_engine`)
        **kv_info,
    }
    if m.world > 1:  # the same config in one process, to show what the ranks save
        one = max(single.values(), key=lambda c: sum(c.values()))
        assumptions["single_process_components"] = {k: int(v) for k, v in one.items()}
        assumptions["single_process_bytes"] = int(sum(one.values()))
        assumptions["ranks"] = (
            f"{m.world} ranks, {m.strategy}: every rank holds the same shares (rank 0 the rounding); "
            "the table is the largest rank"
        )
    if m.backend == "unsloth":
        assumptions["fast_inference"] = m.vllm
        assumptions["weights"] = (
            "shared with vLLM (inside vllm_pool)"
            if m.vllm
            else "backend.fast_inference=false: HF generation, no vLLM pool (weights on the card once)"
        )
    if cfg.backend.name == "auto" and m.device == "cuda" and m.backend == "trl":
        assumptions["backend_note"] = (
            "backend=auto resolved to trl because neither unsloth nor vllm is installed here; "
            "pass backend=trl_vllm or backend=unsloth to model vLLM colocate"
        )
    return assumptions


def estimate(cfg: Any, logits_mode: str | None = None, *, device: str | None = None, backend: str | None = None) -> Estimate:
    """Predict the peak for `cfg` (a composed train config). `logits_mode`: chunked | full | None
    (None: what the backend really does, see `default_logits_mode`). `device` ("cpu" | "cuda")
    overrides the target card's device, and `backend` the resolved backend, for a trial predicting
    the process it runs in.

    The peak is the larger phase on the largest rank; it fits when it leaves headroom on the card
    and vLLM (if any) can start: its KV cache holds one sequence, its share is free at start.

    Args:
        cfg: A composed train config.
        logits_mode: "chunked", "full", or None (what the backend does, see `default_logits_mode`).
        device: "cpu" or "cuda": overrides the target card's device.
        backend: The resolved backend, for a trial predicting the process it runs in.

    Returns:
        The Estimate.
    """
    m = _modelled(cfg, logits_mode, device, backend)
    pool, cpu_plan = _vllm_pool(cfg, m)
    single = _single_process_phases(cfg, m, pool)
    phases = _rank_phases(m, single)  # rank_terms copies: `single` stays one process's
    peak_phase = max(phases, key=lambda p: sum(phases[p].values()))
    components = {k: int(v) for k, v in phases[peak_phase].items()}
    total = sum(components.values())
    headroom = None if m.budget is None else m.budget - total
    kv_ok, kv_info = _kv_cache(cfg, m, pool, cpu_plan)
    fits = headroom is None or (headroom >= 0 and kv_ok is not False and kv_info.get("vllm_startup_ok", True))
    return Estimate(
        components=components,
        total_bytes=total,
        budget_bytes=m.budget,
        headroom_bytes=headroom,
        fits=bool(fits),
        kv_cache_ok=kv_ok,
        assumptions=_assumptions(cfg, m, pool, single, kv_info),
        phases={p: int(sum(c.values())) for p, c in phases.items()},
        peak_phase=peak_phase,
    )


def waves_note(est: Estimate) -> str | None:
    """'generation runs in about N waves ...' when vLLM's KV cache holds fewer sequences than the
    generation batch (feasible, slower: memory/throughput.py charges the waves); else None."""
    a = est.assumptions
    waves = a.get("generation_waves")
    if not waves or waves <= 1:
        return None
    return (
        f"generation runs in about {waves} waves (vLLM's KV cache holds {a['kv_cache_sequences']} of the "
        f"{a['generation_batch']} max_seq_length sequences at once; its scheduler queues the rest)"
    )


def verdict(est: Estimate) -> str:
    dom = f"dominant: {est.dominant} ({est.components[est.dominant] / GiB:.2f} GiB)"
    if est.budget_bytes is None:
        return f"no budget (gpu.memory_gib is null): needs {est.total_bytes / GiB:.2f} GiB; {dom}"
    extra = ""
    if est.kv_cache_ok is False and est.assumptions.get("vllm_weights_bytes") is not None:
        extra = "; vLLM would refuse to start: its share leaves no KV cache for one max_seq_length sequence"
    elif est.kv_cache_ok is False:
        extra = "; vLLM would refuse to start: its KV cache cannot hold one max_seq_length sequence"
    elif note := waves_note(est):
        extra = "; " + note
    if est.assumptions.get("vllm_startup_ok") is False:
        extra += "; vLLM would refuse to start (free memory < gpu_memory_utilization x total)"
    headroom = est.headroom_bytes
    assert headroom is not None  # set whenever the budget is
    if headroom >= 0:
        word = "fits" if est.fits else "memory fits but"
        return f"{word} with {headroom / GiB:.2f} GiB headroom{extra}; {dom}"
    return f"short by {-headroom / GiB:.2f} GiB{extra}; {dom}"
