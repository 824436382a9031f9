"""Every patch grpo-sweep applies to vLLM and to TRL's vLLM integration (trl.generation), each in
the trial process (or its vLLM server's process) only.

Each patch names the upstream version it targets and the condition for its removal.
tests/test_backends.py reads each target as the patch reads it, so an upgrade that moves one fails
there, in seconds; tests/test_vllm_cpu.py runs them for real. TRL's trainer is patched in
trl_patches.py, and transformers in transformers_patches.py.
"""

from __future__ import annotations

import importlib.metadata as metadata


def inject_engine_kwargs(engine_kwargs: dict) -> None:
    """TRL 1.16 colocate builds `vllm.LLM(...)` itself with no pass-through for engine arguments
    (trl/generation/vllm_generation.py: max_num_seqs derived, max_num_batched_tokens=4096): `engine_kwargs`
    are set over its own in the module-level `LLM` it calls, in this trial process only.

    Targets: TRL 1.16 `trl.generation.vllm_generation.LLM`. Remove once TRL colocate passes
    engine arguments through (its `vllm_*` settings cover max_num_seqs and kv_cache_memory_bytes)."""
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
       cache is reset, as TRL does. Sleep mode is refused on CPU by vLLM itself (validate.validate
       refuses it earlier), so TRL's wake_up step is not needed.
    2. Engine arguments: `cpu_engine_kwargs`, injected into the module-level `LLM` TRL calls (`inject_engine_kwargs`).

    Targets: TRL 1.16 `VLLMGeneration.sync_weights` and `_iter_named_params`; vllm-cpu 0.31.0
    `Worker.reload_weights(weights_iterator, is_checkpoint_format)`. Remove once TRL's colocate sync
    loads through `reload_weights`, or vLLM's CPU linear layers keep `weight_loader` after repacking.
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


def patch_server_for_cpu() -> None:
    """Server mode on CPU: TRL 1.16 refuses to open its weight-transfer group without CUDA
    (`VLLMClient.init_communicator` raises NotImplementedError) and its sync streams over NCCL. In
    this trial process only: no group, no sync (recorded as `vllm_weight_sync`); generation through
    the server is real.

    Targets: TRL 1.16 `VLLMClient.init_communicator(device)` and `VLLMGeneration.sync_weights`.
    Remove once TRL's server-mode weight transfer runs without CUDA."""
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


def watch_scheduler(llm) -> dict | None:
    """What vLLM's own scheduler does with the generation batch, counted as it schedules.

    vLLM admits the requests its KV cache can hold and queues or preempts the rest
    (vllm/v1/core/sched/scheduler.py). After each `Scheduler.schedule()` this reads the numbers its
    SchedulerStats report (`make_stats`: num_running_reqs = len(running), num_waiting_reqs =
    len(waiting), kv_cache_usage = kv_cache_manager.usage) and keeps their maxima; each
    `_preempt_request` (what RequestStateStats.num_preemptions counts) adds one preemption. The
    engine core runs in this process (TRL colocate: external_launcher, InprocClient); elsewhere None.

    Targets: vllm 0.31 `Scheduler.schedule`, `Scheduler._preempt_request`, `running`, `waiting`,
    `kv_cache_manager.usage`. This wraps one engine's scheduler instance to read it; it changes
    nothing vLLM does. Remove once vLLM's SchedulerStats reach the caller of `LLM.generate`.
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


def untrack_generation(generation) -> None:
    """Run TRL's vLLM generation and weight sync outside the CPU tensor tracker (any TorchDispatchMode):
    vLLM's forward passes and its weight reload allocate inside vLLM's pool, which is charged to the
    card as one block (`vllm_pool_bytes`), not as training memory. This shadows the two methods on
    one `VLLMGeneration` instance.

    Targets: TRL 1.16 `VLLMGeneration.generate` and `VLLMGeneration.sync_weights`; torch's
    `torch.utils._python_dispatch._disable_current_modes`. Remove once TRL runs vLLM outside the
    trainer's dispatch modes, or the tracker charges vLLM's pool itself."""
    generation.generate = _untracked(generation.generate)
    generation.sync_weights = _untracked(generation.sync_weights)


def _untracked(fn):
    import functools

    from torch.utils._python_dispatch import _disable_current_modes

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with _disable_current_modes():
            return fn(*args, **kwargs)

    return run


def answer_cpu_build_version() -> None:
    """vLLM's CLI asks `importlib.metadata.version("vllm")`, but the CPU build's distribution is
    `vllm-cpu`, so `vllm serve` dies before parsing its arguments (PackageNotFoundError). After this,
    a lookup of "vllm" that finds no such distribution answers with vllm-cpu's version, in this
    process only (the server's: trial/vllm_serve.py).

    Targets: vllm-cpu 0.31.0 (distribution `vllm-cpu`, package `vllm`) and its
    `vllm.entrypoints.cli.main.main`. Remove once the CPU build installs as the `vllm` distribution,
    or vLLM's CLI stops asking for its own version by that name."""
    stock = getattr(metadata.version, "grpo_sweep_stock", metadata.version)

    def version(name: str) -> str:
        try:
            return stock(name)
        except metadata.PackageNotFoundError:
            if name == "vllm":
                return stock("vllm-cpu")
            raise

    version.grpo_sweep_stock = stock  # type: ignore[attr-defined]
    metadata.version = version
