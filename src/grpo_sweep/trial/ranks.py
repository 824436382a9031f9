"""A trial of N processes (trial.num_processes > 1): launch the ranks under torchrun, merge their records.

The trial's worker (worker.main) leads: it starts `torchrun --standalone --nproc-per-node N -m
grpo_sweep.trial.rank RUN_DIR` inside its own process group, so the guarantees of a one-process
trial hold for the group:
- OOM-contained: every rank is its own process and writes `ranks/<k>/metrics.json` whatever
  happens; a rank that fails exits non-zero, torchrun stops the others (SIGTERM, then SIGKILL) and
  `merge` makes the trial `oom` when any rank ran out of memory, with that rank's message;
- timeout-bounded: the parent's timeout or interruption sends SIGTERM to this worker, which
  passes it to torchrun (which passes it to the ranks) and kills torchrun after the grace period;
- orphan-free: torchrun is in the worker's process group (the parent's and the guardian's kill
  reach it) and every rank dies with torchrun (PR_SET_PDEATHSIG, trial/rank.py);
- one model cache build: the leader builds the checkpoint the ranks load before they start
  (prepare_checkpoint; trial/cache_entry.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from ..study.attrs import Status

OOM_KEYS = ("oom_phase", "requested_bytes", "free_bytes", "total_bytes", "deficit_bytes")
PEAK_KEYS = (
    "peak_memory_breakdown",
    "category_peaks",
    "peak_phase",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "nvml_peak_bytes",
)


def rank_dir(run_dir: str | Path, rank: int) -> Path:
    """Where rank `rank` of the trial in `run_dir` keeps its own trial.log and metrics.json."""
    return Path(run_dir) / "ranks" / str(rank)


def command(cfg: Any, run_dir: str | Path) -> list[str]:
    """torchrun for this trial: one node, N ranks, no restarts (a failed rank fails the trial)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={int(cfg.trial.num_processes)}",
        "--max-restarts=0",
        "--monitor-interval=0.5",
        "-m",
        "grpo_sweep.trial.rank",
        str(run_dir),
    ]


def environment(cfg: Any) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # torchrun sets OMP_NUM_THREADS=1 unless told; the ranks set trial.cpu_threads themselves.
    env.setdefault("OMP_NUM_THREADS", str(cfg.trial.get("cpu_threads") or 1))
    return env


def _forward(stream, stopping: threading.Event) -> None:
    """torchrun's and the ranks' output, through the worker's tee (console and trial.log). Once the
    trial is being stopped, trial.log only: torchrun answers our SIGTERM with its own traceback
    (SignalException) and warnings, which the console's one stop line already says."""
    for line in stream:
        log = getattr(sys.stdout, "file", None)
        if stopping.is_set() and log is not None:
            log.write(line)
            log.flush()
        else:
            print(line, end="", flush=True)


def prepare_checkpoint(cfg: Any) -> None:
    """The cached checkpoint every rank loads (warm or saved random weights), built here by the one
    leader before torchrun starts the ranks (trial/cache_entry.py: why no rank may build it)."""
    import torch

    from ..config import backends
    from ..config.local import installed
    from .models import prepare_checkpoint as build

    on_cuda = torch.cuda.is_available()  # as each rank will see it; the checkpoint is built on CPU
    name = backends.resolve(cfg.backend.name, cuda=on_cuda, installed=installed)
    build(cfg, on_cuda=on_cuda, by_path=backends.runs_vllm(name))


def lead(cfg: Any, run_path: Path, record: dict, grace_s: float) -> dict:
    """Run the ranks, wait for them, merge their records into `record`; write metrics.json.

    Args:
        cfg: The composed train config.
        run_path: The trial's folder.
        record: The trial's record, updated in place.
        grace_s: Seconds the ranks get to stop when asked.

    Returns:
        The record.
    """
    from ..metrics import read_metrics, write_metrics
    from .stopping import TrialStopped, print_failure

    n, strategy = int(cfg.trial.num_processes), str(cfg.trial.strategy)
    try:
        prepare_checkpoint(cfg)
    except BaseException as exc:  # noqa: BLE001 - no rank started: the trial's record says why, as a rank's would
        if isinstance(exc, TrialStopped):
            record["status"], record["error"] = exc.status, exc.reason
        else:
            print_failure(exc)
            record["status"], record["error"] = Status.FAILED, f"{type(exc).__name__}: {exc}"
        record.update(world_size=n, strategy=strategy)
        write_metrics(run_path, record)
        return record
    print(f"[trial] {n} processes ({strategy}) under torchrun", flush=True)
    stopped: TrialStopped | None = None
    proc = subprocess.Popen(
        command(cfg, run_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment(cfg)
    )
    stopping = threading.Event()
    reader = threading.Thread(target=_forward, args=(proc.stdout, stopping), daemon=True)
    reader.start()
    try:
        try:
            proc.wait()
        except TrialStopped as exc:  # the parent's timeout, an interrupted sweep, the parent died
            stopped = exc
            print(f"[trial] stopping the ranks: {exc.reason}", flush=True)
            stopping.set()
            proc.send_signal(signal.SIGTERM)  # torchrun passes it on; each rank writes its record
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()  # the ranks die with it (PR_SET_PDEATHSIG)
                proc.wait()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        reader.join(5.0)
    records = [read_metrics(rank_dir(run_path, k)) for k in range(n)]
    record.update(merge(records, n, strategy, launcher_exitcode=proc.returncode))
    if stopped is not None:
        record["status"], record["error"] = stopped.status, stopped.reason
    write_metrics(run_path, record)
    return record


def merge(records: list[dict | None], world: int, strategy: str, *, launcher_exitcode: int | None = None) -> dict:
    """One trial record from the ranks' records (None: a rank that left none).

    - the peak is the largest rank's (what the memory constraint judges), with its breakdown;
      `rank_peak_memory_bytes` lists every rank's;
    - throughput is counted once: every rank's tokens and samples are already the trial's (TRL gathers
      the token count from all ranks; the samples are the global generation batch), each over its own
      step time, so the trial's tokens/s and samples/s are the slowest rank's and its tokens per step
      rank 0's; the step time is the slowest rank's (they wait for each other at every all-reduce);
    - status: `oom` when any rank ran out of memory (that rank's message and numbers), else the
      first failed rank's failure, else `slow` when a rank stopped early, else `ok`.

    Args:
        records: Each rank's record, or None for a rank that left none.
        world: The number of ranks.
        strategy: trial.strategy.
        launcher_exitcode: torchrun's exit code, or None.

    Returns:
        The trial's record.
    """
    present = [r for r in records if r]
    out: dict = dict(present[0]) if present else {}
    for key in ("run_dir", "exitcode", "wall_time_s", "wandb_note"):
        out.pop(key, None)
    out["world_size"] = world
    out["strategy"] = strategy
    peaks = [r.get("peak_memory_bytes") if r else None for r in records]
    out["rank_peak_memory_bytes"] = peaks
    out["rank_predicted_peak_bytes"] = [r.get("predicted_peak_bytes") if r else None for r in records]
    out["rank_status"] = [r.get("status") if r else None for r in records]
    out["rank_tokens_per_s"] = [r.get("tokens_per_s") if r else None for r in records]
    measured = [(p, k) for k, p in enumerate(peaks) if p is not None]
    if measured:
        peak, rank = max(measured)
        out["peak_memory_bytes"], out["peak_rank"] = peak, rank
        for key in PEAK_KEYS:
            if key in records[rank]:
                out[key] = records[rank][key]
    else:
        out["peak_memory_bytes"], out["peak_rank"] = None, None
    for key, pick in (("tokens_per_s", min), ("samples_per_s", min), ("tokens_per_step", lambda v: v[0])):
        values = [r.get(key) if r else None for r in records]
        out[key] = pick(values) if values and all(v is not None for v in values) else None
    times = [r.get("step_time_s") for r in present if r.get("step_time_s") is not None]
    out["step_time_s"] = max(times) if times else None
    out["status"], out["error"] = _status(records, launcher_exitcode)
    oom_rank = next((k for k, r in enumerate(records) if r and r.get("status") == Status.OOM), None)
    if oom_rank is not None:
        for key in OOM_KEYS:
            out[key] = records[oom_rank].get(key)
    return out


def _status(records: list[dict | None], launcher_exitcode: int | None) -> tuple[str, str | None]:
    for k, r in enumerate(records):
        if r and r.get("status") == Status.OOM:
            return Status.OOM, f"rank {k}: {r.get('error')}"
    missing = [k for k, r in enumerate(records) if not r]
    failed = [(k, r) for k, r in enumerate(records) if r and r.get("status") in (Status.FAILED, Status.TIMEOUT)]
    # The rank that failed first is the cause; the others were stopped by torchrun (SIGTERM).
    cause = [(k, r) for k, r in failed if "received SIGTERM" not in str(r.get("error"))] or failed
    if cause:
        k, r = cause[0]
        return str(r.get("status")), f"rank {k}: {r.get('error')}"
    if missing:
        return Status.FAILED, f"ranks {missing} left no metrics.json (torchrun exited with code {launcher_exitcode})"
    slow = [(k, r) for k, r in enumerate(records) if r and r.get("status") == Status.SLOW]
    if slow:
        return Status.SLOW, f"rank {slow[0][0]}: {slow[0][1].get('error')}"
    return Status.OK, None
