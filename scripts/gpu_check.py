"""One prepared device check: real GRPO trials on CUDA, as users run them, summarised in one JSON.

Run through scripts/gpu_check.sh (which installs the carried wheels). Every case is a
`python train.py ...` subprocess, exactly as a user types it, with random weights on a real
architecture (Qwen2.5-0.5B's config) and the local tokenizer, so nothing is downloaded:

  l4        a trial under `gpu=l4_24g` emulation: measured peak next to `grpo-sweep estimate`
  oom       a config over a small emulated budget: the trial must end `oom` with a parsed
            deficit and the parent (the Hydra job) must exit 0. If the budget is not enforced
            (status ok), `oom_card` runs a config too big for the whole physical card.
  nf4       the same trial as `l4` with 4-bit weights, when bitsandbytes is importable
  sweep     3 trials with `python train.py -m` (the grpo_optuna sweeper when present, else basic)

`--cpu-dry-run` runs the same flow on CPU with the tiny model and simulated budgets, to check the
script's logic before device time is spent. Writes OUT/gpu_check.json and OUT/gpu_check.log, and
prints a table. Each case is bounded in time; the whole check aims at < 6 minutes on an H200.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
WORK = Path(os.environ.get("GPU_CHECK_WORK", "/tmp/gpu_check"))

# Random weights on a real architecture, local tokenizer: no download, real memory shapes.
GPU_BASE = [
    "model=qwen2_5_0_5b",
    "model.source=random",
    "model.tokenizer=local",
    "backend=trl",
    "task.num_prompts=64",
    "trial.steps=3",
    "trial.timeout_s=240",
    "max_seq_length=384",
    "max_prompt_length=128",
    "per_device_train_batch_size=8",
    "num_generations=4",
    "lora_rank=16",
]
CPU_BASE = ["model=tiny", "backend=trl", "task.num_prompts=64", "trial.steps=2", "trial.timeout_s=240"]


def plan(cpu: bool) -> dict:
    """Overrides per case. The OOM case keeps completions short (fast generation) and the
    training batch x sequence far over the budget, so it fails in the training forward."""
    if cpu:
        return {
            "l4": [*CPU_BASE, "gpu=cpu_sim", "gpu.memory_gib=1.0"],
            "oom": [*CPU_BASE, "gpu=cpu_sim", "gpu.memory_gib=0.001"],
            # No giant allocation on a shared CPU box: a real allocator failure on demand instead.
            "oom_card": [*CPU_BASE, "gpu=cpu", "trial.debug_fault=oom"],
            "nf4": None,  # bitsandbytes 4-bit needs CUDA (validation refuses it on CPU)
            "sweep": [*CPU_BASE, "gpu=cpu_sim", "gpu.memory_gib=1.0"],
        }
    return {
        "l4": [*GPU_BASE, "gpu=l4_24g"],
        "oom": [
            *GPU_BASE,
            "gpu=t4_16g",
            "gpu.memory_gib=2.0",
            "per_device_train_batch_size=16",
            "max_seq_length=1024",
            "max_prompt_length=960",
        ],
        # ~1M tokens in one training micro-batch: terabytes of activations, over any card.
        "oom_card": [
            *GPU_BASE,
            "gpu=h200_141g",
            "gpu.memory_gib=null",
            "per_device_train_batch_size=64",
            "max_seq_length=16448",
            "max_prompt_length=16384",
        ],
        "nf4": [*GPU_BASE, "gpu=l4_24g", "quant=nf4"],
        "sweep": [*GPU_BASE, "gpu=l4_24g"],
    }


class Log:
    def __init__(self, path: Path):
        self.file = open(path, "w", buffering=1)  # noqa: SIM115 - open for the whole check

    def section(self, title: str, text: str) -> None:
        self.file.write(f"\n===== {title} =====\n{text}\n")


def run(cmd: list[str], timeout: float, log: Log, title: str) -> dict:
    started = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env, check=False)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = "timeout"
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    wall = time.monotonic() - started
    log.section(f"{title}: {' '.join(cmd[1:])} (rc={rc}, {wall:.1f} s)", out[-20000:])
    return {"rc": rc, "wall_s": round(wall, 1), "output": out}


def metrics_summary(m: dict) -> dict:
    """The fields of a metrics.json that the check reports (absent ones stay absent)."""
    keep = (
        "status",
        "backend",
        "device",
        "tokens_per_s",
        "samples_per_s",
        "step_time_s",
        "steps",
        "peak_memory_bytes",
        "memory_source",
        "predicted_peak_bytes",
        "peak_memory_breakdown",
        "peak_phase",
        "budget_bytes",
        "simulated_device",
        "oom_phase",
        "requested_bytes",
        "free_bytes",
        "deficit_bytes",
        "lever_mismatch",
        "effective",
        "levers",
        "wall_time_s",
        "exitcode",
        "cuda_reserved_peak_bytes",
        "nvml_peak_bytes",
    )
    out = {k: m[k] for k in keep if k in m}
    if m.get("error"):
        out["error"] = m["error"][:600]
    return out


def parse_deficit(m: dict) -> dict:
    """Deficit from metrics.json, else parsed from the recorded error with oom_message."""
    if m.get("deficit_bytes") is not None:
        return {"deficit_bytes": m["deficit_bytes"], "deficit_source": "metrics.json"}
    try:
        from grpo_sweep.memory.oom_message import parse_oom_message
    except ImportError:
        return {}
    parsed = parse_oom_message(m.get("error") or "")
    return {**parsed, "deficit_source": "parsed error"} if parsed else {}


def trial(name: str, overrides: list[str], timeout: float, log: Log) -> dict:
    run_dir = WORK / name
    res = run([sys.executable, "train.py", *overrides, f"hydra.run.dir={run_dir}"], timeout, log, name)
    out = {"overrides": overrides, "parent_rc": res["rc"], "wall_s": res["wall_s"]}
    summary = [ln for ln in res["output"].splitlines() if ln.startswith("trial ")]
    out["summary_line"] = summary[-1][:300] if summary else None
    path = run_dir / "metrics.json"
    if path.exists():
        m = json.loads(path.read_text())
        out.update(metrics_summary(m))
        if m.get("status") == "oom":
            out.update(parse_deficit(m))
    else:
        out["status"] = "no metrics.json"
        out["tail"] = res["output"][-1500:]
    return out


def estimate(overrides: list[str], log: Log) -> dict:
    """`grpo-sweep estimate ... --json` when the estimator exists in this build."""
    if importlib.util.find_spec("grpo_sweep.memory.estimator") is None:
        return {"available": False}
    res = run([sys.executable, "-m", "grpo_sweep.cli", "estimate", *overrides, "--json"], 120, log, "estimate")
    text = res["output"]
    start = text.find("{")
    try:
        data = json.loads(text[start : text.rfind("}") + 1])
    except ValueError:
        return {"available": True, "rc": res["rc"], "error": text[-800:]}
    keep = ("fits", "total_bytes", "budget_bytes", "headroom_bytes", "components", "logits_mode")
    return {"available": True, **{k: data[k] for k in keep if k in data}}


def sweep(overrides: list[str], timeout: float, log: Log) -> dict:
    sweep_dir = WORK / "sweep"
    optuna = importlib.util.find_spec("hydra_plugins.grpo_optuna_sweeper") is not None
    if optuna:  # hydra.sweeper.params cannot be set from the command line: a config file sets it
        how = [f"hydra.searchpath=[file://{ROOT / 'scripts' / 'gpu_check_conf'}]", "+gpu_check=optuna3"]
    else:
        how = ["lora_rank=8,16,32"]
    res = run([sys.executable, "train.py", "-m", *overrides, *how, f"hydra.sweep.dir={sweep_dir}"], timeout, log, "sweep")
    trials = []
    for path in sorted(glob.glob(str(sweep_dir / "**" / "metrics.json"), recursive=True)):
        m = json.loads(Path(path).read_text())
        row = {k: m.get(k) for k in ("status", "tokens_per_s", "peak_memory_bytes", "wall_time_s")}
        row["lora_rank"] = (m.get("levers") or {}).get("lora_rank")
        trials.append(row)
    return {
        "sweeper": "grpo_optuna" if optuna else "basic",
        "parent_rc": res["rc"],
        "wall_s": res["wall_s"],
        "trials": trials,
        "tail": res["output"][-1200:] if res["rc"] != 0 else None,
    }


def environment(cpu: bool) -> dict:
    """Versions and the card, read in a throw-away process: this one never holds a CUDA context."""
    probe = (
        "import json, platform, torch; c = torch.cuda.is_available(); p = c and torch.cuda.get_device_properties(0);"
        "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__, 'cuda': c,"
        " 'gpu': p.name if c else None, 'total_memory_bytes': int(p.total_memory) if c else None,"
        " 'cuda_version': torch.version.cuda}))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    env = (
        json.loads(proc.stdout.strip().splitlines()[-1])
        if proc.returncode == 0
        else {"probe_error": proc.stderr[-500:], "cuda": False}
    )
    env["cpu_dry_run"] = cpu
    for mod in ("trl", "transformers", "peft", "hydra", "optuna", "bitsandbytes", "vllm", "unsloth"):
        spec = importlib.util.find_spec(mod)
        env[f"has_{mod}"] = spec is not None
    for mod in ("grpo_sweep.memory.estimator", "grpo_sweep.trial.measure.enforce", "grpo_sweep.trial.measure.tracker"):
        env[f"has_{mod.split('.')[-1]}"] = importlib.util.find_spec(mod) is not None
    return env


def gib(x) -> str:
    return "-" if x is None else f"{x / GIB:.2f}"


def table(results: dict) -> str:
    rows = [f"{'case':<9} {'status':<16} {'tok/s':>9} {'peak GiB':>9} {'est GiB':>8} {'deficit GiB':>11} {'wall s':>7}"]
    for name in ("l4", "oom", "oom_card", "nf4"):
        r = results["cases"].get(name)
        if not r:
            continue
        est = (r.get("estimate") or {}).get("total_bytes") or r.get("predicted_peak_bytes")
        tps = r.get("tokens_per_s")
        rows.append(
            f"{name:<9} {str(r.get('status'))[:16]:<16} {('-' if tps is None else f'{tps:.0f}'):>9} "
            f"{gib(r.get('peak_memory_bytes')):>9} {gib(est):>8} {gib(r.get('deficit_bytes')):>11} "
            f"{r.get('wall_s', '-'):>7}"
        )
    sw = results["cases"].get("sweep")
    if sw:
        for i, t in enumerate(sw["trials"]):
            tps = t.get("tokens_per_s")
            rows.append(
                f"{'sweep/' + str(i):<9} {t.get('status')!s:<16} {('-' if tps is None else f'{tps:.0f}'):>9} "
                f"{gib(t.get('peak_memory_bytes')):>9} {'-':>8} {'-':>11} {round(t.get('wall_time_s') or 0, 1):>7}"
            )
    return "\n".join(rows)


def checks(results: dict) -> dict:
    """The verdicts the device check exists for."""
    c = results["cases"]
    out = {}
    if "l4" in c:
        out["l4_ok"] = c["l4"].get("status") == "ok"
    oom = c.get("oom_card") if c.get("oom", {}).get("status") != "oom" else c.get("oom")
    if oom:
        out["oom_recorded"] = oom.get("status") == "oom"
        out["oom_deficit_parsed"] = (oom.get("deficit_bytes") or 0) > 0
        out["parent_survived_oom"] = oom.get("parent_rc") == 0 and "trial oom" in (oom.get("summary_line") or "")
    if "oom" in c:
        out["budget_enforced"] = c["oom"].get("status") == "oom"
    if c.get("nf4"):
        out["nf4_ok"] = c["nf4"].get("status") == "ok"
    if "sweep" in c:
        trials = c["sweep"]["trials"]
        out["sweep_3_trials"] = len(trials) == 3 and c["sweep"]["parent_rc"] == 0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-dry-run", action="store_true", help="same flow on CPU: tiny model, simulated budgets")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "outputs" / "gpu_check"))
    ap.add_argument("--only", default="l4,oom,nf4,sweep", help="comma-separated cases to run")
    ap.add_argument("--budget-s", type=float, default=330, help="skip cases that would start after this")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    log = Log(out_dir / "gpu_check.log")
    t0 = time.monotonic()
    cases = plan(args.cpu_dry_run)
    only = set(args.only.split(","))
    results = {"env": environment(args.cpu_dry_run), "cases": {}, "skipped": {}}
    if not args.cpu_dry_run and not results["env"]["cuda"]:
        print("gpu_check: no CUDA device; use --cpu-dry-run", file=sys.stderr)
        return 2

    def left() -> float:
        return args.budget_s - (time.monotonic() - t0)

    def save():
        results["elapsed_s"] = round(time.monotonic() - t0, 1)
        results["checks"] = checks(results)
        (out_dir / "gpu_check.json").write_text(json.dumps(results, indent=2, sort_keys=True, default=str))

    if "l4" in only:
        r = trial("l4", cases["l4"], 200, log)
        r["estimate"] = estimate(cases["l4"], log)
        est = r["estimate"].get("total_bytes")
        if est and r.get("peak_memory_bytes"):
            r["measured_over_estimate"] = round(r["peak_memory_bytes"] / est, 3)
        results["cases"]["l4"] = r
        save()
    if "oom" in only:
        r = trial("oom", cases["oom"], 200, log)
        r["estimate"] = estimate(cases["oom"], log)
        results["cases"]["oom"] = r
        save()
        if r.get("status") != "oom":
            # The emulated budget did not bite (not enforced in this build): force a real OOM.
            results["cases"]["oom_card"] = trial("oom_card", cases["oom_card"], max(60, min(200, left())), log)
            save()
    if "nf4" in only:
        has_bnb = importlib.util.find_spec("bitsandbytes") is not None
        if cases["nf4"] is None or not has_bnb:
            results["skipped"]["nf4"] = "CPU dry run" if cases["nf4"] is None else "bitsandbytes not carried"
        elif left() < 60:
            results["skipped"]["nf4"] = "time budget"
        else:
            results["cases"]["nf4"] = trial("nf4", cases["nf4"], min(200, left()), log)
        save()
    if "sweep" in only:
        if left() < 60:
            results["skipped"]["sweep"] = "time budget"
        else:
            results["cases"]["sweep"] = sweep(cases["sweep"], max(60, left() + 60), log)
        save()
    save()
    print(table(results))
    print(json.dumps({"checks": results["checks"], "skipped": results["skipped"], "elapsed_s": results["elapsed_s"]}, indent=1))
    print(f"wrote {out_dir / 'gpu_check.json'} and gpu_check.log")
    return 0


if __name__ == "__main__":
    sys.exit(main())
