"""The parent side of a trial: start the worker process, contain whatever happens, return metrics.

An OOM, an exception, a fatal signal or a hang all end as a metrics.json with a status; the
parent (the Hydra job, the sweep) never dies with the trial and never holds GPU memory. Workers
are forked from a forkserver that has already imported torch/transformers/trl (and has run no
torch compute and initialised no CUDA), so every trial after the first starts in about a second.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ..config import backends
from ..config.local import cuda_available, installed
from ..levers import requested_levers
from ..metrics import empty_metrics, read_metrics, write_metrics
from . import worker

# without_vllm first: the forkserver serves trl trials; TRL there loads without vLLM (see the module).
PRELOAD = ["grpo_sweep.trial.without_vllm", "torch", "transformers", "trl", "peft", "datasets", "grpo_sweep.trial.worker"]


def _context(start_method: str):
    if mp.get_start_method(allow_none=True) not in (None, *mp.get_all_start_methods()):
        # Inside a joblib (loky) worker the global method is "loky", which our child cannot resolve.
        mp.set_start_method(None, force=True)
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def format_summary(record: dict, run_dir: Path) -> str:
    gib = (record.get("peak_memory_bytes") or 0) / 2**30
    parts = [f"trial {record['status']}"]
    if record.get("tokens_per_s") is not None:
        parts.append(f"tokens/s {record['tokens_per_s']:.1f}")
    if record.get("reward_mean") is not None:
        parts.append(f"reward {record['reward_mean']:.3f}")
    parts.append(f"peak {gib:.2f} GiB ({record.get('memory_source')})")
    if record.get("error"):
        parts.append(f"error: {record['error'].splitlines()[0][:160]}")
    parts.append(str(run_dir))
    return " | ".join(parts)


def run_trial(cfg: DictConfig, run_dir: str | Path) -> dict:
    """Run one trial of `cfg` in a child process; always returns (and writes) its metrics record."""
    requested_unix = time.time()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    stale = run_dir / "metrics.json"
    if stale.exists():
        stale.unlink()
    container = OmegaConf.to_container(cfg, resolve=True)
    cuda = cuda_available()
    backend = backends.resolve(cfg.backend.name, cuda=cuda, installed=installed)
    ctx = _context(backends.start_method(backend, cfg.trial.start_method, cuda))
    proc = ctx.Process(target=worker.main, args=(container, str(run_dir)), name="grpo-sweep-trial")
    started = time.monotonic()
    proc.start()
    try:
        proc.join(cfg.trial.timeout_s)
    except BaseException:  # interrupted (SIGINT/SIGTERM in a sweep): the trial must not outlive us
        _kill_group(proc.pid)
        raise
    timed_out = proc.is_alive()
    if timed_out:
        _kill_group(proc.pid)
        proc.join()
    _kill_group(proc.pid)  # reap anything the trial left running (vLLM workers, dataloaders)
    record = read_metrics(run_dir)
    if timed_out:
        record = record or empty_metrics("timeout", None, requested_levers(cfg))
        record["status"] = "timeout"
        record["error"] = f"trial exceeded trial.timeout_s={cfg.trial.timeout_s} s and was killed"
    elif record is None:
        code = proc.exitcode
        reason = (
            f"trial process killed by signal {signal.Signals(-code).name}"
            if code is not None and code < 0
            else f"trial process exited with code {code} without writing metrics"
        )
        record = empty_metrics("failed", reason, requested_levers(cfg))
    record["exitcode"] = proc.exitcode
    record["wall_time_s"] = time.monotonic() - started
    first_step = record.get("first_step_begin_unix")
    # "Trial requested" to "first GRPO step starts": process start, model build, trainer set-up.
    record["start_latency_s"] = first_step - requested_unix if first_step else None
    record["run_dir"] = str(run_dir)
    write_metrics(run_dir, record)
    print(format_summary(record, run_dir), flush=True)
    return record
