"""`grpo-sweep estimate`: predict a config's peak memory on its target card, without a GPU.

Never imports torch: the prediction is pure arithmetic (grpo_sweep.memory.estimator) and is for
the target card, so it runs on a laptop for an L4 as well as on the L4.
"""

from __future__ import annotations

import sys

from ..config.compose import compose_train_config
from ..config.model_arch import check_hub_lora_targets
from ..config.schema import ConfigError, validate
from ..config.trl_config import expand
from ..memory.estimator import (
    LOGITS_MODES,
    estimate,
    fmt_gib,
    format_rank_table,
    format_table,
    target_device,
    verdict,
    waves_note,
)

USAGE = """usage: grpo-sweep estimate [HYDRA_OVERRIDES ...] [trl_config=my.yaml] [logits_mode=chunked|full] [--json]

Predict peak memory for a config without a GPU, e.g.
  grpo-sweep estimate model=gemma3_1b gpu=l4_24g gpu.memory_gib=22 preset=seed_baseline logits_mode=full
  grpo-sweep estimate model=gemma3_1b gpu=l4_24g trial.num_processes=4 trial.strategy=zero3   (per rank)
  grpo-sweep estimate trl_config=my_grpo.yaml gpu=l4_24g   (your `trl grpo --config` file as the recipe)"""


def split_args(argv: list[str]) -> tuple[list[str], str | None, bool]:
    """Hydra overrides (a `trl_config=my.yaml` read as its overrides), the CLI-level logits_mode, and --json."""
    overrides, mode, as_json = [], None, False
    for arg in argv:
        if arg == "--json":
            as_json = True
        elif arg.startswith("logits_mode="):
            mode = arg.split("=", 1)[1]
            if mode not in LOGITS_MODES:
                raise ConfigError(f"logits_mode={mode}: must be one of {', '.join(LOGITS_MODES)}")
        else:
            overrides.append(arg)
    return expand(overrides), mode, as_json


def cli(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    try:
        overrides, mode, as_json = split_args(argv)
        cfg = compose_train_config(overrides)
        # The estimate is for the target machine: CUDA rules as on a card, no local install check.
        validate(cfg, cuda=target_device(cfg) == "cuda")
        check_hub_lora_targets(cfg)  # model=hub: from its config.json where it is here (no download)
        est = estimate(cfg, logits_mode=mode)
    except (ConfigError, ValueError) as exc:
        print(f"grpo-sweep estimate: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - Hydra's override/composition errors
        print(f"grpo-sweep estimate: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(est.to_json())
        return 0
    a = est.assumptions
    print(
        f"model={cfg.model.name} gpu={cfg.gpu.name} backend={a['backend']} device={a['device']} "
        f"logits_mode={a['logits_mode']} ({a['logits_mode_source']}) peak phase={est.peak_phase}"
    )
    print(format_table(est))
    if a.get("world_size", 1) > 1:
        print(f"\nlargest rank of {a['world_size']} ({a['strategy']}; every rank holds the same shares) vs one process:")
        print(format_rank_table(est))
    if a.get("vllm_weights_bytes") is not None:  # vLLM-CPU (estimator.vllm_cpu_plan): exact bytes
        print(
            f"vLLM-CPU: KV cache {a['kv_cache_available_bytes']:,} B in the share after its fp32 weights "
            f"({a['vllm_weights_bytes']:,} B); vLLM starts with >= {a['kv_cache_needed_bytes']:,} B "
            f"(one {cfg.max_seq_length}-token sequence + its null block); holds {a['kv_cache_sequences']} "
            f"of the {a['generation_batch']} sequences at once"
        )
    elif a.get("kv_cache_needed_bytes") is not None:
        print(
            f"vLLM KV cache: {fmt_gib(a['kv_cache_available_bytes'])} available; vLLM starts with >= "
            f"{fmt_gib(a['kv_cache_needed_bytes'])} (one {cfg.max_seq_length}-token sequence + the null block); "
            f"the whole generation batch ({a['generation_batch']} sequences) needs {fmt_gib(a['kv_cache_batch_bytes'])}, "
            f"{a['kv_cache_sequences']} fit at once"
        )
        if a.get("vllm_non_kv_bytes"):  # what vLLM takes from its pool first (estimator.vllm_non_kv_bytes)
            terms = ", ".join(f"{k.replace('_', ' ')} {fmt_gib(v)}" for k, v in a["vllm_non_kv_bytes"].items())
            print(f"vLLM's pool before the KV cache: {terms}")
    if a.get("vllm_server_bytes") is not None:
        print(
            f"vLLM server (backend.vllm_mode=server, tensor parallel {a['vllm_tensor_parallel_size']}): "
            f"{fmt_gib(a['vllm_server_bytes'])} per server device, on its own devices (trial.vllm_devices), "
            "outside the training budget above"
        )
    note = waves_note(est)
    if note:
        print(f"note: {note}: feasible, slower (the throughput model charges the waves)")
    for key in ("backend_note", "weights"):
        if key in a:
            print(f"note: {a[key]}")
    print(verdict(est))
    return 0
