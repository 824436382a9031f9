"""One rank of a multi-process trial (trial.num_processes > 1): `python -m grpo_sweep.trial.rank RUN_DIR`.

torchrun (started by trial/ranks.py in the trial's worker) runs this once per rank with RANK,
LOCAL_RANK, WORLD_SIZE and MASTER_ADDR/PORT set; accelerate reads them (gloo on CPU, NCCL on CUDA).
Each rank runs the same trial body as a one-process trial (worker.main) in `RUN_DIR/ranks/<rank>/`,
with its own meters: the CPU tensor tracker or CUDA allocator measures this rank's peak, and
its metrics.json is merged by the worker (ranks.merge).

torchrun starts each rank in a new session, out of reach of the trial's process-group kill, so a
rank binds its life to torchrun's: PR_SET_PDEATHSIG delivers SIGKILL when torchrun dies (the trial's
guardian or parent kills torchrun with the worker's group).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

from ..study.attrs import Status

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent (torchrun's agent) dies, even by SIGKILL."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: torchrun's own SIGTERM on failure still applies
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def main(argv: list[str] | None = None) -> None:
    die_with_parent()
    run_dir = Path((argv or sys.argv[1:])[0])
    rank = int(os.environ["RANK"])
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)
    if rank != 0:
        container["logger"]["name"] = "none"  # one W&B run per trial: rank 0's
    trial = container["trial"]
    if trial.get("debug_fault_rank") is not None and int(trial["debug_fault_rank"]) != rank:
        trial["debug_fault"] = None  # a fault injected on one rank only (tests)
    # The sweeper's early stop compares the whole trial's tokens/s; one rank stopping alone would leave
    # the others waiting at the next all-reduce. The merged record is judged instead (outcome.py).
    trial["stop_below"] = None
    if "LOCAL_RANK" in os.environ:
        import torch

        if torch.cuda.is_available():  # before the memory meter caps "the" device: this rank's own
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    from .ranks import rank_dir

    out = rank_dir(run_dir, rank)
    out.mkdir(parents=True, exist_ok=True)
    from . import worker

    worker.main(container, str(out), lifeline=None, as_rank=True)
    from ..metrics import read_metrics

    record = read_metrics(out) or {}
    sys.stdout.flush()
    sys.stderr.flush()
    # A failed rank exits non-zero so that torchrun stops the others (they would wait at the next
    # collective); os._exit: the trial's record and W&B run are closed, nothing else may block exit.
    os._exit(0 if record.get("status") in (Status.OK, Status.SLOW) else 1)


if __name__ == "__main__":
    main()
