"""One family of runners for `python train.py ARGS` and `grpo-sweep ARGS`: each takes train.py's
arguments (`sweep_args` builds a sweep's), and each returns what subprocess would.

- `train_here(args)`: train.py's own entry point in the test process (its trials come from this
  process's warm forkserver); the default for a run that is not killed, interrupted or run beside
  another one.
- `run_train(args)`: a fresh interpreter, waited for (a timeout, a fresh interpreter's imports).
- `start_train(args, log)`: a fresh interpreter left running (killed, interrupted, run beside another).
- `cli(*args)`: `grpo-sweep ARGS` in the test process.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN_PY = ROOT / "train.py"
FAST = ["trial.steps=2"]  # the default task: its warm model (model.init=warm) is built once and shared
DEAD_URL = "http://127.0.0.1:9"  # the discard port: connection refused, nothing leaves the host
# W&B with no network anywhere: offline, no API key, no netrc, and a base URL nothing listens on.
OFFLINE_ENV = {"WANDB_MODE": "offline", "WANDB_API_KEY": "", "NETRC": os.devnull, "WANDB_BASE_URL": DEAD_URL}
# The short tests that run a trial in the test process itself (trial.parent.run_trial): on one worker,
# so one trial forkserver (its ~6 s import of torch, TRL and W&B) serves them all.
IN_PROCESS_TRIALS = pytest.mark.xdist_group("trials")

# A test names its whole search space: sweep_args clears tiny_cpu's own list (hydra.sweeper.params=null),
# so what tiny_cpu.yaml searches for `make sweep` can grow without changing any test's study.
NO_FILE_SPACE = "hydra.sweeper.params=null"
# tiny_cpu's split and checkpointing, for a test that searches them on tiny_cpu's card and recipe.
SPLIT_SPACE = ("per_device_train_batch_size=choice(1,2,4,8)", "gradient_checkpointing=choice(false,true)")
# Each trial: two optimiser steps of 2 completions of 64 tokens; an empty space unless a test sweeps more.
SMALL = [
    "max_seq_length=64",
    "per_device_train_batch_size=2",
    "completions_per_step=2",
    "gradient_checkpointing=false",
    "lora_rank=8",
    "lora=qv",
]


def sweep_args(
    sweep_dir: Path,
    *args: str,
    sweep: str = "tiny_cpu",
    enqueue: bool = False,
    frontier: bool = False,
    neighbours: bool = False,
    file_space: bool = False,
) -> list[str]:
    """train.py's arguments for the user's sweep command; without the sweep file's search space
    unless `file_space` (the test's own `key=choice(...)` arguments are its whole space:
    NO_FILE_SPACE), without tiny_cpu's enqueued probe points unless `enqueue`, without the frontier
    start unless `frontier` and without neighbour moves unless `neighbours` (tests pick their own
    points: the frontier's fullest fits are the slowest trials, and a test of workers or resume
    does not need them)."""
    extra = [] if file_space else [NO_FILE_SPACE]
    extra += [] if enqueue else ["hydra.sweeper.enqueue=[]"]
    extra += [] if frontier else ["hydra.sweeper.start_points=0"]
    extra += [] if neighbours else ["hydra.sweeper.neighbour_every=0"]
    return ["-m", f"+sweeps={sweep}", f"hydra.sweep.dir={sweep_dir}", *extra, *args]


def _env(env: dict | None) -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}


def run_train(args: list[str], cwd: Path | None = None, timeout: float = 600, env: dict | None = None):
    """`python train.py ARGS` in a subprocess, waited for; returns CompletedProcess with text output."""
    return subprocess.run(
        [sys.executable, str(TRAIN_PY), *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(env),
        check=False,
    )


def start_train(args: list[str], log: Path | None = None, env: dict | None = None, **popen) -> subprocess.Popen:
    """`python train.py ARGS` started in a subprocess and left running.

    Args:
        args: train.py's arguments.
        log: the file its console (stdout and stderr) goes to; None: a text pipe (`communicate`).
        env: its environment on top of this process's.
        **popen: more of subprocess.Popen's arguments (a `preexec_fn`, ...).
    """
    out = open(log, "w") if log is not None else subprocess.PIPE  # noqa: SIM115 - the child writes it until it exits
    try:
        proc = subprocess.Popen(
            [sys.executable, str(TRAIN_PY), *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(env),
            **popen,
        )
        proc.log = log  # wait_for quotes its tail when the sweep exits early
        return proc
    finally:
        if log is not None:
            out.close()  # the child holds its own copy


def exit_status(exc: SystemExit) -> int:
    """The exit code the interpreter would give `exc`; a message goes to stderr with code 1, as it would."""
    if isinstance(exc.code, str):
        print(exc.code, file=sys.stderr)
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def train_here(args: list[str], cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python train.py ARGS` run inside this test process: train.py's own entry point (Hydra's main,
    the sweeper, run_trial), its console captured at the descriptor level and returned as run_train's
    would be. Each trial is still its own forked process, but every call in this process shares one
    trial forkserver, so a call skips the interpreter start and the ~6 s preload of torch,
    transformers and TRL a `python train.py` pays (docs/contributing.md "Tests").

    What it cannot do, for which a test keeps run_train or start_train: be killed or interrupted
    from outside, time out, run beside another sweep, or start with a fresh interpreter's imports.
    `env` is this call's environment on top of the test process's; the trials see it
    (process.take_parents_view), and the trials' console output is in the returned stdout."""
    import tempfile

    from hydra.core.global_hydra import GlobalHydra

    from grpo_sweep.cli.train import main

    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_streams, saved_fds = (sys.stdout, sys.stderr), (os.dup(1), os.dup(2))
    code = 0
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        for stream in saved_streams:
            stream.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")  # noqa: SIM115
        os.environ.update(env or {})
        os.chdir(cwd or ROOT)
        sys.argv = [str(TRAIN_PY), *args]
        GlobalHydra.instance().clear()
        try:
            main()
        except SystemExit as exc:
            code = exit_status(exc)
        finally:
            GlobalHydra.instance().clear()
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, target in zip(saved_fds, (1, 2)):
                os.dup2(fd, target)
                os.close(fd)
            sys.stdout, sys.stderr = saved_streams
            os.environ.clear()
            os.environ.update(saved_env)
            os.chdir(saved_cwd)
            sys.argv = saved_argv
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode("utf-8", "replace"))
    return subprocess.CompletedProcess(["train.py", *args], code, *texts)


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """`grpo-sweep ARGS` in this process (grpo_sweep.cli.main, as the console script calls it), its
    output and exit code captured as subprocess.run's would be. A fresh interpreter per call costs
    ~0.6 s; test_architecture.py and test_config.py run the command in fresh interpreters."""
    import io

    from grpo_sweep.cli import main

    out, err, stdin_was = io.StringIO(), io.StringIO(), sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exit_status(exc)
    finally:
        sys.stdin = stdin_was
    return subprocess.CompletedProcess(["grpo-sweep", *args], code, out.getvalue(), err.getvalue())


def load_metrics(run_dir: Path) -> dict:
    """A run's metrics.json."""
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def log_text(path: Path) -> str:
    """A log's text so far: empty before its writer created it, undecodable bytes replaced (a log
    read while a process still writes it may end mid-character)."""
    return path.read_text(errors="replace") if path.exists() else ""


def read_csv(path: Path) -> list[dict]:
    """A CSV file's rows (trials.csv), each a dict by column."""
    with open(path) as f:
        return list(csv.DictReader(f))


def wait_for(predicate, timeout: float, every: float = 0.5, proc: subprocess.Popen | None = None):
    """Poll `predicate` until truthy; fail at once if `proc` (the sweep being watched) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            log = getattr(proc, "log", None)
            tail = log_text(log)[-3000:] if log is not None else ""
            raise AssertionError(f"the sweep exited with {proc.returncode} before the condition was met\n{tail}")
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout} s")
