"""Memory per rank when a trial runs on N processes (`trial.num_processes`): DDP or FSDP sharding.

`rank_terms` gives the largest rank's components; the estimator reports that rank.
"""

from __future__ import annotations

from .shapes import Shapes, gradient_bytes, param_counts, trainable_param_count


def layer_param_count(s: Shapes) -> int:
    """One decoder layer's parameters (projections, q/k/v biases, norms): an FSDP unit."""
    n = param_counts(s)
    norms = 4 * s.H + 2 * s.hd if s.family == "gemma3" else 2 * s.H
    bias = (s.qd + 2 * s.kd) if s.qkv_bias else 0
    return n["linear"] // s.L + norms + bias


def root_param_count(s: Shapes) -> int:
    """What is not in a decoder layer: embeddings, the (untied) LM head, the final norm: FSDP's root
    unit (accelerate's transformer auto-wrap policy wraps each decoder layer, the rest stays at the root)."""
    return param_counts(s)["total"] - s.L * layer_param_count(s)


def _shard(nbytes: int, n: int) -> int:
    """The largest rank's share: FSDP pads each flat parameter to a multiple of the world size,
    DeepSpeed ZeRO its partitions; rank 0 holds ceil(bytes / n)."""
    return -(-int(nbytes) // n)


def _master_copy(s: Shapes, strategy: str) -> bool:
    """Whether DeepSpeed's bf16 optimiser keeps an fp32 master copy beside AdamW's two fp32 moments:
    12 bytes per trainable parameter (the engine casts the model, adapters included, to bf16)."""
    return strategy in ("zero2", "zero3") and s.wb == 2


def rank_terms(
    s: Shapes,
    n: int,
    strategy: str,
    phase: str,
    comps: dict,
    *,
    hf_generate: bool = True,
    offload: bool = False,
    gather: bool = True,
) -> dict:
    """The largest rank's components of a trial of `n` processes, from one process's. Sources:

    - ddp (torch DistributedDataParallel as accelerate wraps the model): every rank holds the whole
      replica; the Reducer allocates flat gradient buckets the size of every trainable gradient
      (`gradient_as_bucket_view=False`, the default), alive from the wrap to the end: `ddp_buckets`.
    - zero2 (DeepSpeed ZeRO stage 2): gradients and optimiser state partitioned (1/n each), weights
      replicated; gradients are reduced through an IPG bucket of `reduce_bucket_size` elements
      (HF's "auto": hidden_size^2), at most the gradients' size: `ddp_buckets`.
    - fsdp (FSDP, full shard, one unit per decoder layer): weights, trainable parameters, gradients
      and optimiser state 1/n; the root unit (embeddings, final norm, untied LM head) stays gathered
      through forward and backward (FSDP does not reshard the root after forward), plus two decoder
      layers at once (the running one and the one prefetched, BACKWARD_PRE): `gathered_params`.
      TRL generates under `summon_full_params(recurse=False)`: the root only, the layers as they run.
    - zero3 (DeepSpeed ZeRO stage 3): sharded like fsdp; parameters are fetched per module, with a
      prefetch bucket of 0.9 x hidden_size^2 elements (TRL's `prepare_deepspeed`): the largest module
      (a layer or the embedding) + that bucket. TRL's `ds3_gather_for_generation=True` (the default)
      gathers the whole model for HF `generate`: generation holds every weight; false generates from the
      shards, fetching module by module as in training.
    - trial.offload (fsdp, zero2, zero3): DeepSpeed's `offload_optimizer` keeps the optimiser state (and
      the fp32 master copy) in host memory, `offload_param` (zero3) the parameter shards; FSDP2's
      CPUOffloadPolicy keeps parameter, gradient and optimiser shards there. The card still holds what
      a step gathers (`gathered_params`) and, under ZeRO, the gradient partitions before they are copied.
    Activations, logits and inputs are per micro-batch: the same on every rank. n == 1 changes nothing.

    Args:
        s: The model's and the run's shapes.
        n: The number of processes.
        strategy: "ddp", "fsdp", "zero2" or "zero3".
        phase: "training" or "generation".
        comps: The single-process components, in bytes.
        hf_generate: Generation runs HF `generate` (not vLLM).
        offload: trial.offload: the optimiser state (and ZeRO-3 parameters) in host memory.
        gather: TRL's ds3_gather_for_generation.

    Returns:
        The largest rank's components, in bytes.
    """
    out = dict(comps)
    if n <= 1:
        return out
    trains = phase == "training"
    grads = gradient_bytes(s)
    gathers_all = phase == "generation" and hf_generate and gather  # ZeRO-3 + HF generate: the whole model
    if strategy == "ddp":
        out["ddp_buckets"] = grads
        return out
    # zero2, fsdp, zero3: gradients (training only) and optimiser state sharded
    out["gradients"] = _shard(out["gradients"], n)
    optimizer = 12 * trainable_param_count(s) if _master_copy(s, strategy) else out["optimizer_state"]
    out["optimizer_state"] = 0 if offload else _shard(optimizer, n)
    if strategy == "zero2":
        out["ddp_buckets"] = min(grads, s.H * s.H * (4 if not s.full else s.wb)) if trains else 0
        return out
    # fsdp, zero3: parameters sharded too
    full_weights = out["weights"]
    out["weights"] = 0 if offload else _shard(out["weights"], n)
    out["lora_params"] = 0 if offload else _shard(out["lora_params"], n)
    if offload and strategy == "fsdp":
        out["gradients"] = 0
    layer = layer_param_count(s) * s.wb
    root = root_param_count(s) * s.wb
    if strategy == "fsdp":
        out["gathered_params"] = root + 2 * layer
    elif gathers_all:  # ds3_gather_for_generation gathers the whole model for HF generate
        out["gathered_params"] = full_weights
    else:
        out["gathered_params"] = max(layer, root) + min(layer, int(0.9 * s.H * s.H) * s.wb)
    return out
