"""Helpers for the sweeper tests (no tests here): run `python train.py -m +sweeps=...`, read the real study."""

from __future__ import annotations

import contextlib
import csv
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from conftest import ROOT, train_here

SWEEP = "+sweeps=tiny_cpu"
# A test names its whole search space: sweep_cmd clears tiny_cpu's own list (hydra.sweeper.params=null),
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


@contextlib.contextmanager
def tiny_sweeper(*params: str, sweep: str = SWEEP, **settings):
    """The sweep of `python train.py -m +sweeps=tiny_cpu [params]` (or another `sweep`) as the sweeper
    sets it up, without launching anything: its plan (plan.build_plan on the master config, with
    `settings` in place of those hydra.sweeper values), its composer (Hydra's config loader) and a
    fresh pre-screen. A plan the sweeper refuses raises here, as the sweep would."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext
    from omegaconf import OmegaConf

    from grpo_sweep.config.compose import CONF_DIR
    from grpo_sweep.config.schema import register
    from hydra_plugins.grpo_optuna_sweeper.plan import Composer, build_plan
    from hydra_plugins.grpo_optuna_sweeper.prescreen import Prescreen

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        master = compose("train", overrides=[sweep], return_hydra_config=True)
        conf = OmegaConf.to_container(master.hydra.sweeper, resolve=True)
        conf.pop("_target_")
        conf.update(settings)
        composer = Composer(HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=None), master)
        plan = build_plan(OmegaConf.create(conf), master, [sweep, *params], composer)
        yield SimpleNamespace(plan=plan, compose=composer, prescreen=Prescreen(plan.settings))


def sweep_cmd(
    sweep_dir: Path,
    *args: str,
    sweep: str = "tiny_cpu",
    enqueue: bool = False,
    frontier: bool = False,
    neighbours: bool = False,
    file_space: bool = False,
) -> list[str]:
    """The user's command; without the sweep file's search space unless `file_space` (the test's own
    `key=choice(...)` arguments are its whole space: NO_FILE_SPACE), without tiny_cpu's enqueued probe
    points unless `enqueue`, without the frontier start unless `frontier` and without neighbour moves
    unless `neighbours` (tests pick their own points: the frontier's fullest fits are the slowest
    trials, and a test of workers or resume does not need them)."""
    extra = [] if file_space else [NO_FILE_SPACE]
    extra += [] if enqueue else ["hydra.sweeper.enqueue=[]"]
    extra += [] if frontier else ["hydra.sweeper.start_points=0"]
    extra += [] if neighbours else ["hydra.sweeper.neighbour_every=0"]
    return [sys.executable, str(ROOT / "train.py"), "-m", f"+sweeps={sweep}", f"hydra.sweep.dir={sweep_dir}", *extra, *args]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = open(log, "w")  # noqa: SIM115 - the child writes it until it exits
    return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)


def run(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env, check=False)


def run_here(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """run(cmd) inside this test process (conftest.train_here, with its `cwd` and `env`: its trials share
    this process's warm forkserver). For a sweep that is not killed, interrupted or run beside another one."""
    assert cmd[:2] == [sys.executable, str(ROOT / "train.py")], cmd[:2]
    return train_here(cmd[2:], cwd=cwd, env=env)


def load_study(storage: str, name: str = "tiny_cpu"):
    import optuna

    from grpo_sweep.study.storage import is_journal, journal_path, open_storage

    if is_journal(storage):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        return optuna.load_study(study_name=name, storage=JournalStorage(JournalFileBackend(str(journal_path(storage)))))
    return optuna.load_study(study_name=name, storage=open_storage(storage, create=False))


def trials_so_far(storage: str, name: str = "tiny_cpu") -> list:
    """The study's trials, or [] while the sweep has not created it yet (for polling a running sweep)."""
    if storage.startswith("journal:") and not Path(storage[len("journal:") :]).exists():
        return []
    try:
        return load_study(storage, name).trials
    except KeyError:
        return []


def counted(study) -> list:
    """The trials that count toward n_trials (the sweeper's rule: retried and surplus FAILs do not)."""
    trials = study.get_trials()
    retried = {n for t in trials for n in (t.system_attrs.get("retry_history") or [])}
    return [
        t
        for t in trials
        if t.state.name in ("COMPLETE", "PRUNED")
        or (t.state.name == "FAIL" and t.number not in retried and t.user_attrs.get("status") != "surplus")
    ]


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def wait_for(predicate, timeout: float, every: float = 0.5, proc: subprocess.Popen | None = None):
    """Poll `predicate` until truthy; fail at once if `proc` (the sweep being watched) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the sweep exited with {proc.returncode} before the condition was met")
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout} s")
