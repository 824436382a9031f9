"""The parent side of a trial: start the worker process, contain whatever happens, return metrics.

An OOM, an exception, a fatal signal or a hang all end as a metrics.json with a status; the
parent (the Hydra job, the sweep) never dies with the trial and never holds GPU memory; and the trial never outlives the
parent: the child holds the read end of a lifeline pipe whose EOF (the parent died, SIGKILL
included) makes the child's guardian stop the trial and kill its process group (worker.py), after
which the forkserver exits too (it lives while any client holds its "alive" pipe). A trial stopped
on purpose (timeout, the sweep interrupted) gets SIGTERM first: the worker writes metrics.json and
ends its W&B run as failed with the reason, then the group is killed after STOP_GRACE_S. Workers
are forked from a forkserver that has already imported torch/transformers/trl (and has run no
torch compute and initialised no CUDA), so every trial after the first starts in about a second.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ..config import backends
from ..config.local import cuda_available, installed
from ..config.model_arch import fill_arch
from ..config.schema import ConfigError
from ..config.split import resolve_split
from ..levers import recipe_of, requested_levers
from ..metrics import MetricsError, empty_metrics, read_metrics, write_metrics
from ..study.attrs import Status
from ..units import GIB
from . import faults, process, worker

WANDB_CLOSE_TIMEOUT_S = 120.0  # closing a killed trial's offline W&B run from outside
STOP_GRACE_S = 20.0  # SIGTERM -> SIGKILL: time to write metrics.json and finish the W&B run
# package_map and without_vllm first, before transformers and TRL load (see the modules).
# trl.trainer.grpo_trainer too: `trl` is a lazy module, and GRPOTrainer's first use imports it (and W&B
# through trl.extras.profiling), ~1 s a trial on a 2-core machine when each forked trial did it again.
PRELOAD = [
    "grpo_sweep.trial.package_map",
    "grpo_sweep.trial.without_vllm",
    "torch",
    "transformers",
    "trl",
    "trl.trainer.grpo_trainer",
    "peft",
    "datasets",
    "grpo_sweep.trial.worker",
    "grpo_sweep.trial.frozen",  # last: gc.freeze() on everything above (see the module)
]


def _context(start_method: str):
    if mp.get_start_method(allow_none=True) not in (None, *mp.get_all_start_methods()):
        # Inside a joblib (loky) worker the global method is "loky", which our child cannot resolve.
        mp.set_start_method(None, force=True)
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


class _InheritedFd:
    """A descriptor the trial gets a duplicate of (forkserver, spawn), not a number that means
    something else in its process: multiprocessing sends it along with the trial's arguments."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup) -> int:
    return dup.detach()


def parents_view(start_method: str) -> dict:
    """worker.main's `environ` and `stdio` for a forkserver child (process.take_parents_view says why);
    spawn and fork children start from this process as it is now anyway."""
    if start_method != "forkserver":
        return {}
    try:
        stdio = tuple(_InheritedFd(fd) for fd in (1, 2) if os.fstat(fd))
    except OSError:  # no console here (closed descriptors): the trial keeps the forkserver's
        stdio = None
    return {"environ": dict(os.environ), "stdio": stdio}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_trial(proc, run_dir: Path, status: str, reason: str, grace_s: float = STOP_GRACE_S) -> None:
    """Ask the worker to stop (reason file + SIGTERM: it records `reason`, ends W&B), then kill its group.

    Args:
        proc: The worker's process.
        run_dir: The trial's folder, where the reason file goes.
        status: The status the worker records.
        reason: Why it stops.
        grace_s: Seconds it gets before its group is killed.
    """
    process.write_stop_request(run_dir, status, reason)
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    proc.join(grace_s)
    _kill_group(proc.pid)
    proc.join(5.0)


def wandb_note(record: dict, run_dir: Path) -> None:
    """A W&B run the worker started but could not finish (killed first): say so in metrics.json and
    in the run directory, next to the run files."""
    if record.get("wandb_finished"):
        return
    where = record.get("wandb_dir")
    if not where:  # killed before metrics.json named the run: W&B's own directory says it was started
        runs = sorted(p for p in (Path(run_dir) / "wandb").glob("*run-*") if p.is_dir() and not p.is_symlink())
        if not runs:
            return
        where = str(runs[-1])
    note = (
        f"W&B run in {where} was not finished: the trial process ended ({record.get('status')}: "
        f"{(record.get('error') or 'no error recorded').splitlines()[0][:300]}) before closing it."
    )
    closed = None
    if record.get("wandb_mode") in (None, "offline"):
        write_metrics(run_dir, record)  # the closing process reads the outcome from metrics.json
        closed = _close_offline_run(run_dir)
    if closed:
        record["wandb_dir"] = closed
        note += f" The parent closed it as failed, with this reason, in {closed} (same run id)."
    else:
        note += " Its files may stop early (`wandb sync` uploads what is there); metrics.json is the trial's record."
    record["wandb_note"] = note
    (Path(run_dir) / worker.WANDB_NOTE_FILE).write_text(note + "\n")


def _close_offline_run(run_dir: Path) -> str | None:
    """wandb_logger.close_unfinished in a fresh process (the parent never starts W&B itself)."""
    code = (
        "import sys; from grpo_sweep.trial.wandb_logger import close_unfinished; print('CLOSED', close_unfinished(sys.argv[1]))"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True, timeout=WANDB_CLOSE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return None
    last = [line for line in out.stdout.splitlines() if line.startswith("CLOSED ")]
    closed = last[-1].split(" ", 1)[1] if last else "None"
    return None if closed == "None" else closed


def format_summary(record: dict, run_dir: Path) -> str:
    gib = (record.get("peak_memory_bytes") or 0) / GIB
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
    try:  # model=hub: the architecture from the model's config.json, recorded in config.yaml
        fill_arch(cfg)
    except ConfigError as exc:
        print(f"[trial] architecture not known here ({exc}); the trial loads the model by name", flush=True)
    resolve_split(cfg)  # gradient_accumulation_steps from completions_per_step (validate did it already for train.py)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    for stale in (run_dir / "metrics.json", run_dir / process.STOP_FILE, run_dir / worker.WANDB_NOTE_FILE):
        stale.unlink(missing_ok=True)
    container = OmegaConf.to_container(cfg, resolve=True)
    cuda = cuda_available()
    backend = backends.resolve(cfg.backend.name, cuda=cuda, installed=installed)
    start_method = backends.start_method(backend, cfg.trial.start_method, cuda)
    ctx = _context(start_method)
    # The child's lifeline: we hold the write end and never write; its EOF means we are gone.
    lifeline, keep_alive = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=worker.main,
        args=(container, str(run_dir), lifeline, STOP_GRACE_S),
        kwargs=parents_view(start_method),
        name="grpo-sweep-trial",
    )
    started = time.monotonic()
    proc.start()
    lifeline.close()  # the child has its copy; only the child may hold the read end
    try:
        try:
            proc.join(cfg.trial.timeout_s)
        except BaseException as exc:  # interrupted (SIGINT/SIGTERM in a sweep): the trial must not outlive us
            stop_trial(
                proc, run_dir, Status.FAILED, f"the trial was stopped: its parent was interrupted ({type(exc).__name__} {exc})"
            )
            raise
        timed_out = proc.is_alive()
        if timed_out:
            reason = f"trial exceeded trial.timeout_s={cfg.trial.timeout_s} s and was killed"
            stop_trial(proc, run_dir, Status.TIMEOUT, reason)
            proc.join()
        _kill_group(proc.pid)  # reap anything the trial left running (vLLM workers, dataloaders, the guardian)
    finally:
        keep_alive.close()
    try:
        record = read_metrics(run_dir)
    except MetricsError as err:  # the child's record is broken: the trial failed, and says which file
        record = empty_metrics(Status.FAILED, str(err), requested_levers(cfg), recipe_of(cfg))
    if timed_out:
        record = record or empty_metrics(Status.TIMEOUT, None, requested_levers(cfg), recipe_of(cfg))
        record["status"] = Status.TIMEOUT
        record["error"] = reason
    elif record is None:
        code = proc.exitcode
        reason = (
            f"trial process killed by signal {signal.Signals(-code).name}"
            if code is not None and code < 0
            else f"trial process exited with code {code} without writing metrics"
        )
        record = empty_metrics(Status.FAILED, reason, requested_levers(cfg), recipe_of(cfg))
    record["exitcode"] = proc.exitcode
    record["wall_time_s"] = time.monotonic() - started
    first_step = record.get("first_step_begin_unix")
    # "Trial requested" to "first GRPO step starts": process start, model build, trainer set-up.
    record["start_latency_s"] = first_step - requested_unix if first_step else None
    record["run_dir"] = str(run_dir)
    wandb_note(record, run_dir)
    write_metrics(run_dir, record)
    faults.tear_metrics(cfg.trial.debug_fault, run_dir)
    print(format_summary(record, run_dir), flush=True)
    return record
