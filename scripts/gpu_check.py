"""One prepared device check: the seed's own case (Gemma 3 1B on an emulated 22 GiB L4) for real.

Run through scripts/gpu_check.sh (which installs the carried wheels). Every trial is a
`python train.py ...` subprocess, exactly as a user types it, with random weights on a real
architecture (`model.source=random model.tokenizer=local`), so nothing is downloaded. Each case
has its own time cap (subprocess and `trial.timeout_s`); a case that would start with less time
left than it needs is recorded as skipped, never half-run.

  seed_baseline     Gemma 3 1B, gpu=l4_24g, backend=trl, preset=seed_baseline     (part a)
  seed_optimized    the same with preset=seed_optimized (4-bit: needs bitsandbytes) (part a)
  oom               a config the estimator sizes to ~1.3x the cap: must end `oom` with a parsed
                    deficit; then `grpo-sweep doctor --message <its metrics.json> --json --verify`
                    must print overrides that fit when run                           (part a)
  oom_2x            only if `oom` did not end oom (the estimate too high): the same at ~2x (part a)
  unsloth           backend=unsloth on Qwen2.5-0.5B's architecture with backend.fast_inference=false
                    (HF generation, no pool); its peak against the estimate          (part b)
  alloc_default     one near-the-wall config (~0.95x the cap by the estimator) with the default
  alloc_expandable  allocator, then PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (part b)
  sweep             5 trials through hydra/sweeper=grpo_optuna on Gemma 3 1B, gpu=l4_24g (part b)
  knob_*            the CUDA-only speed knobs, one trial each at the seed's baseline with gradient
                    checkpointing on (knob_ckpt, the reference): every 2nd layer, checkpoints offloaded
                    to pinned host memory, eager attention, the fused AdamW                  (part d)

Part a needs the base wheels + bitsandbytes, part b the base wheels + Unsloth's (two carries of
< 64 MiB, scripts/gpu_wheels.sh); `--part all` runs both where everything is installed.
`--part landscape` (base wheels only) runs scripts/gpu_landscape.py instead: one recipe's knob
landscape for the speed model, written as landscape_gpu_<card>_<date>.json.

`--cpu-dry-run` runs the same flow on CPU: the tiny model, simulated budgets (gpu=cpu_sim), and
"skipped: needs CUDA" for what needs a card (4-bit, Unsloth, the CUDA allocator). Writes
OUT/gpu_check_<card>_<date>.json (every case: status, tokens/s, allocator and NVML peaks, the
estimate, versions) and OUT/gpu_check.log, and prints a table. `--merge A.json B.json` joins the
two parts' files into one (bench/results/ by default).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
WORK = Path(os.environ.get("GPU_CHECK_WORK", "/tmp/gpu_check"))
SWEEP_CONF = ROOT / "scripts" / "gpu_check_conf"
NEEDS_CUDA = "skipped: needs CUDA"
NO_VLLM_NOTE = (
    "gpu_memory_utilization is a vLLM lever: backend=trl generates with HF generate and reserves "
    "nothing for it, so the preset's value is irrelevant here (effective.gpu_memory_utilization null)"
)

GEMMA = ["model=gemma3_1b", "model.source=random", "model.tokenizer=local", "backend=trl", "task.num_prompts=32"]
QWEN = ["model=qwen2_5_0_5b", "model.source=random", "model.tokenizer=local", "task.num_prompts=32"]
# The CPU dry run's model: random weights, built in memory. The check is about memory and the flow, not
# rewards; a warm model's key changes with every case's max_prompt_length, and its first build (~35 s)
# would run inside a case's time cap on a fresh machine.
TINY = ["model=tiny", "model.init=random", "backend=trl", "task.num_prompts=32"]

# name -> (part, cap in seconds for the whole subprocess, the least time worth starting it with),
# in the order they run (the most decisive first: what is cut at the end of a part is the least).
# Caps from the H200 run (bench/results/gpu_check_h200_2026-12-04.json): a trial starts in 20-26 s and HF
# generate costs ~3 ms per layer per token (conf/gpu/h200_141g.yaml), so seed_baseline's 768-token step takes
# ~88 s (two steps and the start: ~205 s) and seed_optimized's 4-bit 256-token step ~38 s (~105 s).
CASES = {
    "seed_baseline": ("a", 260, 230),
    "oom": ("a", 90, 50),
    "oom_2x": ("a", 90, 50),  # only when `oom` did not end oom (the estimate was too high): ~2x the cap
    "doctor": ("a", 150, 80),
    "seed_optimized": ("a", 150, 120),
    "unsloth": ("b", 240, 150),
    "alloc_default": ("b", 75, 50),
    "alloc_expandable": ("b", 75, 50),
    "sweep": ("b", 240, 90),
    # part c: a machine with >= 2 GPUs (docs/multi-gpu.md): one trial over 2 ranks, per strategy,
    # and vLLM on its own GPU. zero2/zero3 need DeepSpeed on the machine (carry its wheel).
    "multi_ddp": ("c", 150, 100),
    "multi_fsdp": ("c", 150, 100),
    "multi_zero2": ("c", 150, 100),
    "multi_zero3": ("c", 150, 100),
    "vllm_server": ("c", 200, 140),
    # part d: the speed knobs that need a card (trial/backends/trl.py grpo_args), against knob_ckpt, at
    # 128-token completions (KNOB_SHAPE): ~10 s of HF generate a step on an H200, ~55 s a case with its start.
    # vLLM's engine settings need vLLM's CUDA wheel, which the device machine cannot install.
    "knob_ckpt": ("d", 90, 70),
    "knob_every2": ("d", 90, 70),
    "knob_offload": ("d", 90, 70),
    "knob_eager_attn": ("d", 90, 70),
    "knob_fused": ("d", 90, 70),
}
MULTI_GPU_CASES = ("multi_ddp", "multi_fsdp", "multi_zero2", "multi_zero3", "vllm_server")
# Seconds of cases per device call (each call stays under 600 s with its install): 15 minutes of device time
# hold one machine start (~1.5 min), two transfers and installs (~1 min) and two parts' cases (b then d: 370 +
# ~320 s; part a alone takes ~400 s of its 520 s at the caps above).
PART_BUDGET_S = {"a": 520, "b": 370, "c": 560, "d": 450, "landscape": 400}
# The landscape part on CPU (--cpu-dry-run): a few points, the best two run twice: the flow, not the numbers.
LANDSCAPE_DRY_RUN = {"max_points": 4, "top": 2, "repeats": 2}
# Part d's shape: the seed's preset at 128-token completions (its 768 take ~88 s a step of HF generate on an H200).
KNOB_SHAPE = ["max_seq_length=384", "max_prompt_length=256"]
KNOB_CASES = {
    "knob_ckpt": [],
    "knob_every2": ["gradient_checkpointing_every_n_layers=2"],
    "knob_offload": ["gradient_checkpointing_offload=true"],
    "knob_eager_attn": ["attn_implementation=eager"],
    "knob_fused": ["optim=adamw_torch_fused"],
}


def steps_and_cap(cap: int) -> list[str]:
    """Two optimiser steps (the first is warm-up, excluded from tokens/s); the trial records a
    `timeout` itself 25 s before the subprocess would be killed."""
    return ["trial.steps=2", f"trial.timeout_s={max(cap - 25, 30)}"]


def size_to(
    base: list[str], ratio: float, batches=(4, 8, 12, 16, 24, 32), seqs=range(128, 4097, 128), completion: int = 64
) -> list[str]:
    """Batch and prompt length (completions stay `completion` tokens: one prefill, a short
    generate) whose estimated peak / cap is closest to `ratio`, by grpo_sweep's estimator (pure
    arithmetic, the same the `estimate` CLI prints; composed once, then the levers are varied)."""
    from omegaconf import OmegaConf

    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.memory.estimator import estimate
    from grpo_sweep.units import budget_bytes

    cfg = compose_train_config(base)
    budget = budget_bytes(cfg)
    best = None
    for b in batches:
        for seq in seqs:
            OmegaConf.update(cfg, "per_device_train_batch_size", b)
            OmegaConf.update(cfg, "max_seq_length", seq)
            OmegaConf.update(cfg, "max_prompt_length", seq - completion)
            r = estimate(cfg).total_bytes / budget
            if best is None or abs(r - ratio) < abs(best[0] - ratio):
                best = (r, b, seq)
    _, b, seq = best
    return [f"per_device_train_batch_size={b}", f"max_seq_length={seq}", f"max_prompt_length={seq - completion}"]


def plan(cpu: bool) -> dict:
    """Overrides per case (None: skipped on this flavour). Sized cases ask the estimator."""
    if cpu:
        sim = ["gpu=cpu_sim"]
        oom_base = [*TINY, *sim, "gpu.memory_gib=0.25", "num_generations=4"]
        short = ["max_seq_length=96", "max_prompt_length=64"]  # the presets' shapes, cut for a CPU
        return {
            "seed_baseline": [*TINY, *sim, "gpu.memory_gib=1.0", "preset=seed_baseline", *short, *steps_and_cap(100)],
            "seed_optimized": None,  # load_in_4bit: bitsandbytes kernels run on CUDA only
            "oom": [*oom_base, *size_to(oom_base, 1.3, seqs=range(64, 1025, 32), completion=16), *steps_and_cap(90)],
            "oom_2x": [*oom_base, *size_to(oom_base, 2.0, seqs=range(64, 1025, 32), completion=16), *steps_and_cap(90)],
            "unsloth": None,  # Unsloth runs on CUDA only
            "alloc_default": None,  # the CUDA caching allocator
            "alloc_expandable": None,
            "sweep": [*TINY, *sim, "gpu.memory_gib=1.0", *steps_and_cap(60)],
            # 2 ranks over gloo: DDP only (accelerate enables FSDP on accelerators only; ZeRO needs CUDA)
            "multi_ddp": [*TINY, *sim, "gpu.memory_gib=1.0", "trial.num_processes=2", "trial.strategy=ddp", *steps_and_cap(150)],
            "multi_fsdp": None,
            "multi_zero2": None,
            "multi_zero3": None,
            "vllm_server": [
                *TINY,
                *sim,
                "gpu.memory_gib=1.0",
                "backend=trl_vllm",
                "backend.vllm_mode=server",
                *steps_and_cap(200),
            ],
            **dict.fromkeys(KNOB_CASES),  # pinned host memory, CUDA kernels: their speed is a card's
        }
    l4 = ["gpu=l4_24g"]
    oom_base = [*GEMMA, *l4, "num_generations=4"]
    near = [*oom_base, *size_to(oom_base, 0.95)]
    return {
        "seed_baseline": [*GEMMA, *l4, "preset=seed_baseline", *steps_and_cap(CASES["seed_baseline"][1])],
        "seed_optimized": [*GEMMA, *l4, "preset=seed_optimized", *steps_and_cap(CASES["seed_optimized"][1])],
        "oom": [*oom_base, *size_to(oom_base, 1.3), *steps_and_cap(CASES["oom"][1])],
        "oom_2x": [*oom_base, *size_to(oom_base, 2.0), *steps_and_cap(CASES["oom_2x"][1])],
        # The earlier H200 TRL case's shape (bench/results/gpu_check_h200.json: 325 tok/s), under Unsloth.
        "unsloth": [
            *QWEN,
            "backend=unsloth",
            "backend.fast_inference=false",  # HF generation, no vLLM pool: the trial and the estimate alike
            *l4,
            "max_seq_length=384",
            "max_prompt_length=128",
            "per_device_train_batch_size=8",
            "num_generations=4",
            "lora_rank=16",
            *steps_and_cap(CASES["unsloth"][1]),
        ],
        "alloc_default": [*near, *steps_and_cap(CASES["alloc_default"][1])],
        "alloc_expandable": [*near, *steps_and_cap(CASES["alloc_expandable"][1])],
        # Per trial: 2 steps of 128-token completions (~10 s of HF generate a step on an H200; 256 took ~20 s, past
        # a 75 s trial's cap with its start); the sweeper's space is in gpu_check_conf/.
        "sweep": [*GEMMA, *l4, "max_seq_length=384", "max_prompt_length=256", "num_generations=4", *steps_and_cap(90)],
        # Full fine-tuning, where sharding matters; each rank's peak against the per-rank estimate.
        **{
            f"multi_{s}": [*GEMMA, *l4, "trial.full_finetune=true", "trial.num_processes=2", f"trial.strategy={s}",
                           "max_seq_length=256", "max_prompt_length=128", *steps_and_cap(CASES[f"multi_{s}"][1])]
            for s in ("ddp", "fsdp", "zero2", "zero3")
        },  # fmt: skip
        # vLLM on GPU 1 (`trl vllm-serve`), training on GPU 0 with no vLLM pool.
        "vllm_server": [*GEMMA, *l4, "backend=trl_vllm", "backend.vllm_mode=server", "trial.vllm_devices=[1]",
                        "max_seq_length=384", "max_prompt_length=128", *steps_and_cap(CASES["vllm_server"][1])],
        **{
            name: [*GEMMA, *l4, "preset=seed_baseline", *KNOB_SHAPE, "gradient_checkpointing=true", *knob,
                   *steps_and_cap(CASES[name][1])]
            for name, knob in KNOB_CASES.items()
        },
    }  # fmt: skip


class Log:
    def __init__(self, path: Path):
        self.file = open(path, "w", buffering=1)  # noqa: SIM115 - open for the whole check

    def section(self, title: str, text: str) -> None:
        self.file.write(f"\n===== {title} =====\n{text}\n")


def run(cmd: list[str], timeout: float, log: Log, title: str, env: dict | None = None, cwd: Path = ROOT) -> dict:
    """Run `cmd` in its own process group; at the cap kill the whole group (a trial's child too,
    so no process keeps card memory into the next case)."""
    started = time.monotonic()
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None}  # None: unset it
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = "timeout"
    wall = time.monotonic() - started
    log.section(f"{title}: {' '.join(cmd[1:])} (rc={rc}, {wall:.1f} s)", (out or "")[-30000:])
    return {"rc": rc, "wall_s": round(wall, 1), "output": out or ""}


# Every metrics.json key (grpo_sweep.metrics, the one definition) but the per-step history, the
# W&B bookkeeping and the error (kept shortened).
DROP = {"history", "error", "run_dir"}


def metrics_summary(m: dict) -> dict:
    """The fields of a metrics.json that the check reports (absent ones stay absent)."""
    from grpo_sweep.metrics import KEYS

    out = {k: m[k] for k in sorted(KEYS - DROP) if k in m and not k.startswith("wandb_")}
    if m.get("error"):
        out["error"] = m["error"][:800]
    return out


def parse_deficit(m: dict) -> dict:
    """Deficit from metrics.json, else parsed from the recorded error with oom_message."""
    if m.get("deficit_bytes") is not None:
        return {"deficit_source": "metrics.json"}
    from grpo_sweep.memory.oom_message import parse_oom_message

    parsed = parse_oom_message(m.get("error") or "")
    return {**parsed, "deficit_source": "parsed error"} if parsed else {"deficit_source": None}


def start_estimate(args: list[str]) -> subprocess.Popen:
    """`grpo-sweep estimate ARGS --json` in the background (it never touches the card)."""
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_sweep.cli", "estimate", *args, "--json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish_estimate(proc: subprocess.Popen, log: Log) -> dict:
    try:
        text, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        return {"error": "estimate timed out"}
    log.section(f"estimate: {' '.join(proc.args[3:])} (rc={proc.returncode})", text)
    try:
        data = json.loads(text[text.find("{") : text.rfind("}") + 1])
    except ValueError:
        return {"rc": proc.returncode, "error": text[-800:]}
    keep = ("fits", "total_bytes", "budget_bytes", "headroom_bytes", "components", "peak_phase", "logits_mode", "assumptions")
    return {k: data[k] for k in keep if k in data}


def trial(name: str, overrides: list[str], timeout: float, log: Log, env: dict | None = None, estimates=None) -> dict:
    """One `python train.py` trial plus its estimate(s) ({key: estimate args}, default the trial's
    own overrides as `estimate`), computed while it runs."""
    run_dir = WORK / name
    shutil.rmtree(run_dir, ignore_errors=True)  # a rerun on a warm machine starts clean
    pending = {key: start_estimate(args) for key, args in (estimates or {"estimate": overrides}).items()}
    res = run([sys.executable, "train.py", *overrides, f"hydra.run.dir={run_dir}"], timeout, log, name, env)
    out = {"overrides": overrides, "parent_rc": res["rc"], "wall_s": res["wall_s"], "cap_s": timeout}
    summary = [ln for ln in res["output"].splitlines() if ln.startswith("trial ")]
    out["summary_line"] = summary[-1][:300] if summary else None
    path = run_dir / "metrics.json"
    if path.exists():
        m = json.loads(path.read_text())
        out.update(metrics_summary(m))
        out["metrics_json"] = str(path)
        if m.get("status") == "oom":
            out.update(parse_deficit(m))
    else:
        out["status"] = "timeout (killed at cap)" if res["rc"] == "timeout" else "no metrics.json"
        out["tail"] = res["output"][-2000:]
    for key, proc in pending.items():
        out[key] = finish_estimate(proc, log)
    est = (out.get("estimate") or {}).get("total_bytes")
    if est and out.get("peak_memory_bytes"):
        out["measured_over_estimate"] = round(out["peak_memory_bytes"] / est, 3)
    return out


def doctor(oom: dict, timeout: float, log: Log) -> dict:
    """`grpo-sweep doctor --message <metrics.json> --json --verify`: its overrides, then a real
    trial with them (run by the doctor itself, under its cwd's outputs/doctor/: WORK here)."""
    res = run(
        [sys.executable, "-m", "grpo_sweep.cli", "doctor", "--message", oom["metrics_json"], "--json", "--verify"],
        timeout,
        log,
        "doctor",
        cwd=WORK,
    )
    out = {"parent_rc": res["rc"], "wall_s": res["wall_s"], "cap_s": timeout}
    text = res["output"]
    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("{")), None)
    if line is None:
        out.update(status="no doctor output", tail=text[-2000:])
        return out
    data = json.loads(line)
    out["overrides"] = data.get("overrides")
    out["estimate_before"] = data.get("estimate")  # the OOM's config, as the doctor estimated it
    out["estimate_after"] = data.get("after")  # with its overrides: total_bytes, speed_cost_pct
    verify = data.get("verify") or {}
    out["verify"] = {k: v for k, v in verify.items() if k != "error"}
    if verify.get("error"):
        out["verify"]["error"] = verify["error"][:600]
    run_dir = verify.get("run_dir")
    if run_dir and (WORK / run_dir / "metrics.json").exists():
        m = json.loads((WORK / run_dir / "metrics.json").read_text())
        out["verify"].update(
            {k: m.get(k) for k in ("peak_allocated_bytes", "peak_reserved_bytes", "nvml_peak_bytes", "budget_bytes")}
        )
    out["status"] = verify.get("status", "no verify")
    return out


def sweep(overrides: list[str], timeout: float, log: Log, cpu: bool) -> dict:
    """`python train.py -m` through the grpo_optuna sweeper (its space: gpu_check_conf/)."""
    sweep_dir = WORK / "sweep"
    shutil.rmtree(sweep_dir, ignore_errors=True)  # else a rerun resumes the finished study and runs nothing
    how = [f"hydra.searchpath=[file://{SWEEP_CONF}]", "+gpu_check=sweep_cpu" if cpu else "+gpu_check=sweep_l4"]
    res = run([sys.executable, "train.py", "-m", *overrides, *how, f"hydra.sweep.dir={sweep_dir}"], timeout, log, "sweep")
    trials = []
    for path in sorted(glob.glob(str(sweep_dir / "**" / "metrics.json"), recursive=True)):
        m = json.loads(Path(path).read_text())
        row = {k: m.get(k) for k in ("status", "tokens_per_s", "peak_memory_bytes", "nvml_peak_bytes", "predicted_peak_bytes")}
        row["wall_time_s"] = m.get("wall_time_s")
        row["levers"] = {k: (m.get("levers") or {}).get(k) for k in ("per_device_train_batch_size", "lora_rank")}
        row["gradient_checkpointing"] = (m.get("effective") or {}).get("gradient_checkpointing")
        trials.append(row)
    # The sweeper's own account (pre-screened points, the table it prints at the end).
    decisions = [ln for ln in res["output"].splitlines() if re.search(r"prescreen|pruned|frontier|best|infeasible", ln, re.I)]
    return {
        "sweeper": "grpo_optuna",
        "overrides": [*overrides, *how],
        "parent_rc": res["rc"],
        "wall_s": res["wall_s"],
        "cap_s": timeout,
        "trials": trials,
        "sweeper_lines": decisions[-30:],
        "status": "ok" if res["rc"] == 0 else f"parent rc {res['rc']}",
        "tail": res["output"][-1500:] if res["rc"] != 0 else None,
    }


VERSIONS = (
    "deepspeed",
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "hydra-core",
    "optuna",
    "bitsandbytes",
    "unsloth",
    "unsloth_zoo",
    "vllm",
    "xformers",
    "cut_cross_entropy",
    "triton",
    "nvidia-ml-py",
)
PROBE = """
import json, platform, sys, importlib.metadata as md
out = {'python': platform.python_version()}
for d in sys.argv[1].split(','):
    try: out[d] = md.version(d)
    except Exception: out[d] = None
if sys.argv[2] == 'cuda':
    import torch
    c = torch.cuda.is_available()
    p = torch.cuda.get_device_properties(0) if c else None
    out.update(cuda=c, gpu=p.name if c else None, total_memory_bytes=int(p.total_memory) if c else None,
               cuda_version=torch.version.cuda, gpu_count=torch.cuda.device_count())
else:
    out['cuda'] = False  # the dry run never asks for a card (and skips importing torch for it)
print(json.dumps(out))
"""


def environment(cpu: bool) -> dict:
    """Versions and the card, read in throw-away processes: this one never holds a CUDA context.
    `versions_unsloth_case`: what the Unsloth case's interpreter sees (its own site first)."""
    env = {"cpu_dry_run": cpu}
    probes = [("versions", {})]
    if os.environ.get("GPU_CHECK_UNSLOTH_SITE"):
        probes.append(("versions_unsloth_case", unsloth_env()))
    for key, extra in probes:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, ",".join(VERSIONS), "cpu" if cpu else "cuda"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, **extra},
        )
        try:
            env[key] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            env[key] = {"probe_error": proc.stderr[-500:]}
    env["cuda"] = bool(env["versions"].get("cuda"))
    env["gpu"] = env["versions"].get("gpu")
    env["total_memory_bytes"] = env["versions"].get("total_memory_bytes")
    env["gpu_count"] = env["versions"].get("gpu_count") or (0 if not cpu else None)
    return env


def unsloth_env() -> dict:
    """The Unsloth case's environment: its wheels' site (trl 1.15 with it) before the base one."""
    site = os.environ.get("GPU_CHECK_UNSLOTH_SITE")
    extra = {"UNSLOTH_DISABLE_STATISTICS": "1", "HF_HUB_OFFLINE": "1"}
    if site:
        extra["PYTHONPATH"] = f"{site}:{os.environ.get('PYTHONPATH', '')}"
    return extra


def card_slug(env: dict) -> str:
    if not env.get("cuda"):
        return "cpu"
    name = (env.get("gpu") or "gpu").lower().replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "_", name).strip("_") or "gpu"


def gib(x) -> str:
    return "-" if x is None else f"{x / GIB:.2f}"


def table(results: dict) -> str:
    head = f"{'case':<17} {'status':<22} {'tok/s':>7} {'alloc':>6} {'resvd':>6} {'NVML':>6} {'est':>6} {'deficit':>7} {'wall':>5}"
    rows = [head, "(GiB; est = grpo-sweep estimate --json total)"]

    def row(name, r):
        est = (r.get("estimate") or {}).get("total_bytes")
        tps = r.get("tokens_per_s")
        rows.append(
            f"{name:<17} {str(r.get('status'))[:22]:<22} {('-' if tps is None else f'{tps:.0f}'):>7} "
            f"{gib(r.get('peak_allocated_bytes') or r.get('peak_memory_bytes')):>6} {gib(r.get('peak_reserved_bytes')):>6} "
            f"{gib(r.get('nvml_peak_bytes')):>6} {gib(est):>6} {gib(r.get('deficit_bytes')):>7} {r.get('wall_s', '-')!s:>5}"
        )

    for name, r in results["cases"].items():
        if name == "sweep":
            for i, t in enumerate(r.get("trials", [])):
                # est: the trial's own prediction (metrics.json predicted_peak_bytes)
                est = {"total_bytes": t.get("predicted_peak_bytes")}
                row(f"sweep/{i}", {**t, "wall_s": round(t.get("wall_time_s") or 0), "estimate": est})
        elif name == "doctor":
            v = r.get("verify") or {}
            est = {"total_bytes": (r.get("estimate_after") or {}).get("total_bytes")}
            row("doctor --verify", {**v, "status": f"verify {v.get('status')}", "wall_s": r.get("wall_s"), "estimate": est})
            rows.append(f"{'':<17} the doctor's overrides: {' '.join(r.get('overrides') or []) or '-'}")
        else:
            row(name, r)
    for name, why in results["skipped"].items():
        rows.append(f"{name:<17} {why}")
    return "\n".join(rows)


def checks(results: dict) -> dict:
    """The verdicts the device check exists for (absent: the case did not run)."""
    c = results["cases"]
    out = {}
    for name in ("seed_baseline", "seed_optimized", "unsloth", "alloc_default", "alloc_expandable"):
        if name in c:
            out[f"{name}_status"] = c[name].get("status")
    oom = c.get("oom_2x") if c.get("oom", {}).get("status") != "oom" and "oom_2x" in c else c.get("oom")
    if oom:
        out["oom_case"] = "oom_2x" if oom is c.get("oom_2x") else "oom"
        out["oom_recorded"] = oom.get("status") == "oom"
        out["oom_deficit_parsed"] = (oom.get("deficit_bytes") or 0) > 0
        out["parent_survived_oom"] = oom.get("parent_rc") == 0
    if "doctor" in c:
        v = c["doctor"].get("verify") or {}
        budget = v.get("budget_bytes") or (oom or {}).get("budget_bytes")
        out["doctor_overrides"] = c["doctor"].get("overrides")
        out["doctor_verify_fits"] = v.get("status") == "ok" and (budget is None or (v.get("peak_memory_bytes") or 0) <= budget)
    if "sweep" in c:
        out["sweep_trials"] = len(c["sweep"]["trials"])
        out["sweep_statuses"] = [t.get("status") for t in c["sweep"]["trials"]]
    return out


def notes(results: dict) -> dict:
    c, out = results["cases"], {}
    if "seed_baseline" in c or "seed_optimized" in c:
        out["gpu_memory_utilization"] = NO_VLLM_NOTE
    u = c.get("unsloth")
    if u:
        fast = (u.get("effective") or {}).get("fast_inference")
        out["unsloth"] = (
            f"fast_inference={fast}: without vLLM Unsloth keeps no engine and generates with HF generate on the "
            "training model; nothing is reserved up front (gpu_memory_utilization ignored). `estimate` is the tool's "
            "prediction for backend=unsloth with backend.fast_inference=false (no pool, the weights once, HF "
            "generation, no vLLM pool); `estimate_hf` is the "
            "same levers with backend=trl and chunked log-probs (HF generation, the model's own weights); "
            "`estimate_without_vllm_bytes` is `estimate` less its vLLM pool, plus the weights."
        )
    return out


def merge(paths: list[str], out_dir: Path) -> Path:
    """Join the parts' JSON files (one device call each) into one gpu_check_<card>_<date>.json."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    merged = {**parts[0], "cases": {}, "skipped": {}, "parts": []}
    for p in parts:
        merged["cases"].update(p["cases"])
        merged["skipped"].update({k: v for k, v in p["skipped"].items() if k not in merged["cases"]})
        merged["parts"] += p.get("parts", [])
        merged.setdefault("env_by_part", {})[",".join(p.get("parts", []))] = p["env"]
    merged["skipped"] = {k: v for k, v in merged["skipped"].items() if k not in merged["cases"]}
    merged["elapsed_s"] = round(sum(p.get("elapsed_s", 0) for p in parts), 1)
    merged["checks"], merged["notes"] = checks(merged), notes(merged)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / Path(paths[0]).name
    path.write_text(json.dumps(merged, indent=2, sort_keys=True, default=str))
    print(table(merged))
    print(f"wrote {path}")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-dry-run", action="store_true", help="same flow on CPU: tiny model, simulated budgets")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "outputs" / "gpu_check"))
    ap.add_argument(
        "--part",
        default="all",
        choices=("a", "b", "c", "d", "landscape", "all"),
        help="a: TRL + bitsandbytes cases, b: Unsloth's, c: >= 2 GPUs, d: the CUDA-only speed knobs, "
        "landscape: one recipe's knob landscape (scripts/gpu_landscape.py)",
    )
    ap.add_argument("--only", default=None, help="comma-separated cases (default: all of the part)")
    ap.add_argument("--budget-s", type=float, default=None, help=f"skip cases that would not fit (default {PART_BUDGET_S})")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="join the parts' files into --out (default bench/results)")
    args = ap.parse_args()
    if args.merge:
        merge(args.merge, Path(args.out if "--out" in sys.argv else ROOT / "bench" / "results"))
        return 0
    t0 = time.monotonic()
    cpu = args.cpu_dry_run
    parts = ["a", "b"] if args.part == "all" else [args.part]
    budget = args.budget_s or sum(PART_BUDGET_S[p] for p in parts)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    log = Log(out_dir / "gpu_check.log")
    env = environment(cpu)
    if not cpu and not env["cuda"]:
        print("gpu_check: no CUDA device; use --cpu-dry-run", file=sys.stderr)
        return 2
    if parts == ["landscape"]:
        import gpu_landscape

        gpu_landscape.record(
            cpu=cpu, budget_s=budget, out_dir=out_dir, env=env, work=WORK / "landscape", **(LANDSCAPE_DRY_RUN if cpu else {})
        )
        return 0
    cases = plan(cpu)
    wanted = [n for n, (part, _, _) in CASES.items() if part in parts]
    if args.only:
        wanted = [n for n in wanted if n in args.only.split(",")]
    results = {"env": env, "parts": parts, "cases": {}, "skipped": {}, "plan": {k: v for k, v in cases.items() if k in wanted}}
    path = out_dir / f"gpu_check_{card_slug(env)}_{time.strftime('%Y-%m-%d')}.json"

    def left() -> float:
        return budget - (time.monotonic() - t0)

    def save():
        results["elapsed_s"] = round(time.monotonic() - t0, 1)
        results["checks"], results["notes"] = checks(results), notes(results)
        path.write_text(json.dumps(results, indent=2, sort_keys=True, default=str))

    def cap(name: str) -> float | None:
        """This case's cap, shortened to what is left; None (and recorded) when it cannot start."""
        _, full, least = CASES[name]
        if left() < least:
            results["skipped"][name] = f"skipped: time budget ({left():.0f} s left, needs {least} s)"
            return None
        return min(full, left())

    def ended_oom(name: str) -> bool:
        return results["cases"].get(name, {}).get("status") == "oom" and bool(results["cases"][name].get("metrics_json"))

    for name in wanted:
        overrides = cases.get(name)
        if name == "oom_2x" and (ended_oom("oom") or "oom" not in results["cases"]):
            results["skipped"][name] = "not needed: the oom case ended oom" if ended_oom("oom") else "skipped: no oom case"
            save()
            continue
        if name == "doctor":
            oom = results["cases"].get("oom" if ended_oom("oom") else "oom_2x")
            if not oom or oom.get("status") != "oom" or not oom.get("metrics_json"):
                results["skipped"][name] = "skipped: no case ended oom"
            elif (c := cap(name)) is not None:
                results["cases"][name] = doctor(oom, c, log)
            save()
            continue
        if overrides is None:
            results["skipped"][name] = NEEDS_CUDA
            save()
            continue
        if name in MULTI_GPU_CASES and not cpu and env.get("gpu_count", 1) < 2:
            results["skipped"][name] = f"skipped: needs 2 GPUs, this machine has {env.get('gpu_count')}"
            save()
            continue
        if name in ("multi_zero2", "multi_zero3") and importlib.util.find_spec("deepspeed") is None:
            results["skipped"][name] = "skipped: deepspeed not installed (carry its wheel)"
            save()
            continue
        if name == "seed_optimized" and importlib.util.find_spec("bitsandbytes") is None:
            results["skipped"][name] = "skipped: bitsandbytes not installed (carry it: scripts/gpu_wheels.sh bnb)"
            save()
            continue
        if (c := cap(name)) is None:
            save()
            continue
        if name == "sweep":
            results["cases"][name] = sweep(overrides, c, log, cpu)
        elif name == "unsloth":
            # What ran without vLLM: HF generation, the model's own weights, Unsloth's chunked log-probs.
            hf = [*(o for o in overrides if o != "backend=unsloth"), "backend=trl", "logits_mode=chunked"]
            r = trial(name, overrides, c, log, env=unsloth_env(), estimates={"estimate": overrides, "estimate_hf": hf})
            est_u, est_hf = r.get("estimate") or {}, r.get("estimate_hf") or {}
            if est_u.get("components") and est_hf.get("components"):
                # The unsloth estimate with no vLLM pool and the weights held by the model itself.
                comp = est_u["components"]
                r["estimate_without_vllm_bytes"] = (
                    est_u["total_bytes"] - comp.get("vllm_pool", 0) - comp.get("weights", 0) + est_hf["components"]["weights"]
                )
            if r["estimate_hf"].get("total_bytes") and r.get("peak_memory_bytes"):
                r["measured_over_estimate_hf"] = round(r["peak_memory_bytes"] / r["estimate_hf"]["total_bytes"], 3)
            results["cases"][name] = r
        else:
            alloc = {"alloc_default": None, "alloc_expandable": "expandable_segments:True"}
            extra_env = {"PYTORCH_CUDA_ALLOC_CONF": alloc[name]} if name in alloc else None
            r = trial(name, overrides, c, log, env=extra_env)
            if name in alloc:
                r["pytorch_cuda_alloc_conf"] = alloc[name]  # None: unset, PyTorch's default
                if r.get("peak_reserved_bytes") and r.get("peak_allocated_bytes"):
                    r["reserved_minus_allocated_bytes"] = r["peak_reserved_bytes"] - r["peak_allocated_bytes"]
            if name in ("oom", "oom_2x", "alloc_default"):
                est = (r.get("estimate") or {}).get("total_bytes")
                r["estimate_over_cap"] = round(est / r["budget_bytes"], 3) if est and r.get("budget_bytes") else None
            results["cases"][name] = r
        save()
    save()
    print(table(results))
    print(json.dumps({"checks": results["checks"], "elapsed_s": results["elapsed_s"]}, indent=1, default=str))
    print(f"wrote {path} and {out_dir / 'gpu_check.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
