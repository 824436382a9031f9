"""`grpo-sweep estimate`: predict a config's peak memory and its speed on its target card, without a GPU.

Never imports torch: the prediction is pure arithmetic (grpo_sweep.memory.estimator) and is for
the target card, so it runs on a laptop for an L4 as well as on the L4.
"""

from __future__ import annotations

import json
import sys

from ..config.compose import compose_train_config
from ..config.model_arch import check_hub_lora_targets
from ..config.schema import ConfigError
from ..config.trl_config import expand
from ..config.validate import validate
from ..memory.estimator import LOGITS_MODES, Estimate, estimate, verdict, waves_note
from ..memory.shapes import target_device
from ..memory.throughput import SWEEP_N_TRIALS, speed_forecast, speed_lines
from ..units import GIB

USAGE = """usage: grpo-sweep estimate [HYDRA_OVERRIDES ...] [trl_config=my.yaml] [logits_mode=chunked|full] [n_trials=N] [--json]

Predict peak memory and speed for a config without a GPU; the speed includes a sweep's cost in GPU-minutes if
its n_trials trials (default: hydra.sweeper.n_trials's) all ran this config. E.g.
  grpo-sweep estimate model=gemma3_1b gpu=l4_24g gpu.memory_gib=22 preset=seed_baseline logits_mode=full
  grpo-sweep estimate model=gemma3_1b gpu=l4_24g trial.num_processes=4 trial.strategy=zero3   (per rank)
  grpo-sweep estimate trl_config=my_grpo.yaml gpu=l4_24g   (your `trl grpo --config` file as the recipe)"""


def fmt_gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f} GiB"


def format_table(est: Estimate) -> str:
    rows = [f"{'component':<18}{'bytes':>14}  {'GiB':>8}  share"]
    total = est.total_bytes or 1
    for key, value in est.components.items():
        rows.append(f"{key:<18}{value:>14,}  {value / GIB:>8.3f}  {100 * value / total:5.1f} %")
    rows.append(f"{'total':<18}{est.total_bytes:>14,}  {est.total_bytes / GIB:>8.3f}")
    rows.append(
        f"{'budget':<18}{'' if est.budget_bytes is None else f'{est.budget_bytes:,}':>14}  {fmt_gib(est.budget_bytes):>8}"
    )
    return "\n".join(rows)


def format_rank_table(est: Estimate) -> str:
    """One process beside the largest rank of N (`trial.num_processes`), component by component."""
    a = est.assumptions
    one = a.get("single_process_components") or est.components
    n, strategy = a.get("world_size", 1), a.get("strategy", "ddp")
    head = f"per rank ({n} x {strategy})"
    rows = [f"{'component':<18}{'1 process':>14}  {head:>22}"]
    for key in est.components:
        rows.append(f"{key:<18}{fmt_gib(one.get(key, 0)):>14}  {fmt_gib(est.components[key]):>22}")
    rows.append(f"{'total':<18}{fmt_gib(a.get('single_process_bytes', est.total_bytes)):>14}  {fmt_gib(est.total_bytes):>22}")
    rows.append(f"{'budget per card':<18}{fmt_gib(est.budget_bytes):>14}  {fmt_gib(est.budget_bytes):>22}")
    return "\n".join(rows)


def split_args(argv: list[str]) -> tuple[list[str], str | None, bool, int]:
    """Hydra overrides (a `trl_config=my.yaml` read as its overrides), the CLI-level logits_mode and n_trials,
    and --json."""
    overrides, mode, as_json, n_trials = [], None, False, SWEEP_N_TRIALS
    for arg in argv:
        if arg == "--json":
            as_json = True
        elif arg.startswith("logits_mode="):
            mode = arg.split("=", 1)[1]
            if mode not in LOGITS_MODES:
                raise ConfigError(f"logits_mode={mode}: must be one of {', '.join(LOGITS_MODES)}")
        elif arg.startswith("n_trials="):
            value = arg.split("=", 1)[1]
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"n_trials={value}: must be an integer >= 1 (the sweep's trials to price)")
            n_trials = int(value)
        else:
            overrides.append(arg)
    return expand(overrides), mode, as_json, n_trials


def cli(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    try:
        overrides, mode, as_json, n_trials = split_args(argv)
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
    speed, no_speed = None, None
    try:
        speed = speed_forecast(cfg, mode, n_trials)
    except ConfigError as exc:  # a card without datasheet speeds
        no_speed = str(exc)
    if as_json:
        print(json.dumps({**est.to_dict(), "speed": speed, **({"speed_error": no_speed} if no_speed else {})}, sort_keys=True))
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
    if a.get("vllm_weights_bytes") is not None:  # vLLM-CPU (memory/vllm.py vllm_cpu_plan): exact bytes
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
        if a.get("vllm_non_kv_bytes"):  # what vLLM takes from its pool first (memory/vllm.py vllm_non_kv_bytes)
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
    print("\n".join(speed_lines(speed, cfg.gpu.name)) if speed else f"speed: not modelled ({no_speed})")
    print(verdict(est))
    return 0
