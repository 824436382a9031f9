"""Many workers on one study: the same command in two processes against PostgreSQL or a shared journal.

PostgreSQL comes from `.ci/run` (it installs and starts the server and exports GRPO_SWEEP_TEST_POSTGRES);
without that variable the PostgreSQL case is skipped with the reason. The journal case needs nothing.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
import yaml
from test_sweeper_helpers import (
    SMALL,
    counted,
    load_study,
    read_csv,
    run,
    start,
    sweep_cmd,
    trials_so_far,
    wait_for,
)

POSTGRES = os.environ.get("GRPO_SWEEP_TEST_POSTGRES")


def _storage(kind: str, tmp_path: Path) -> str:
    if kind == "journal":
        return f"journal:{tmp_path / 'shared' / 'study.journal'}"
    if not POSTGRES:
        pytest.skip("GRPO_SWEEP_TEST_POSTGRES is not set (.ci/run installs and starts PostgreSQL and sets it)")
    return POSTGRES


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgres", "journal"])
def test_two_workers_share_one_study(tmp_path, kind):
    storage = _storage(kind, tmp_path)
    name = f"workers-{uuid.uuid4().hex[:8]}"
    args = [
        f"hydra.sweeper.storage={storage}",
        f"hydra.sweeper.study_name={name}",
        "hydra.sweeper.n_trials=3",
        "max_seq_length=64",
        "lora=qv",
        "lora_rank=8",
    ]
    # Each worker its own sweep dir (as on two machines); the study is the shared state.
    procs = [start(sweep_cmd(tmp_path / f"w{i}", *args), tmp_path / f"w{i}.log") for i in range(2)]
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = [(tmp_path / f"w{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    study = load_study(storage, name)
    trials = counted(study)
    assert len(trials) == 3 and sorted(t.number for t in trials) == sorted({t.number for t in trials})
    assert all(t.state.name == "COMPLETE" for t in trials)
    # Which worker gets which trial is up to timing (one may finish the study before the other asks):
    # assert what holds regardless. Each trial ran once, in the sweep directory of the worker that
    # recorded it, and one worker id never spans two directories.
    run_dirs = [t.user_attrs["run_dir"] for t in trials]
    assert len(set(run_dirs)) == 3
    home = {}
    for t in trials:
        (sweep_dir,) = [i for i in range(2) if Path(t.user_attrs["run_dir"]).is_relative_to(tmp_path / f"w{i}")]
        assert home.setdefault(t.user_attrs["worker"], sweep_dir) == sweep_dir, (t.number, t.user_attrs)
    # Every worker's report describes the whole study.
    for i in range(2):
        rows = read_csv(tmp_path / f"w{i}" / "trials.csv")
        assert sorted(int(r["number"]) for r in rows if r["state"] == "COMPLETE") == sorted(t.number for t in trials)
    if kind == "postgres":
        secret = storage.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
        written = [
            p
            for i in range(2)
            for p in (tmp_path / f"w{i}").rglob("*")
            if p.is_file() and p.suffix in (".yaml", ".csv", ".json", ".log")
        ]
        for path in written:
            assert secret not in path.read_text(errors="ignore"), f"storage password leaked into {path}"
        for log in logs:
            assert secret not in log
        assert "***" in yaml.safe_load((tmp_path / "w0" / "best.yaml").read_text())["storage"]


@pytest.mark.slow
def test_killed_worker_trial_is_retried(tmp_path):
    """SIGKILL (no chance to clean up) mid-trial: the heartbeat goes stale, the trial is failed and re-run."""
    journal = f"journal:{tmp_path / 'study.journal'}"
    cmd = sweep_cmd(
        tmp_path, "hydra.sweeper.n_trials=2", "hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=3", *SMALL
    )
    proc = start(cmd, tmp_path / "first.log")
    try:

        def running():
            numbers = [t.number for t in trials_so_far(journal) if t.state.name == "RUNNING"]
            return numbers[0] + 1 if numbers else None  # +1: trial 0 is falsy

        number = wait_for(running, timeout=300, proc=proc) - 1
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_orphan_trials(tmp_path)
    assert load_study(journal).trials[number].state.name == "RUNNING"  # nobody left to say otherwise

    result = run(cmd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "stopped beating" in result.stdout + result.stderr
    study = load_study(journal)
    stale = study.trials[number]
    assert stale.state.name == "FAIL"
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == stale.number]
    assert len(retried) == 1 and retried[0].state.name == "COMPLETE"
    assert retried[0].params == stale.params
    assert len(counted(study)) == 2


def _kill_orphan_trials(sweep_dir: Path) -> None:
    """SIGKILL the killed sweeper's trial child (its own process group): found by its open trial.log."""
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit() or int(proc_dir.name) == os.getpid():
            continue
        try:
            targets = [os.readlink(fd) for fd in (proc_dir / "fd").iterdir()]
        except OSError:
            continue
        if any(t.startswith(str(sweep_dir)) and t.endswith("trial.log") for t in targets):
            try:
                os.kill(int(proc_dir.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow
def test_joblib_launcher_runs_trials_in_parallel_processes(tmp_path):
    """hydra/launcher=joblib: the sweeper asks n_jobs trials at once and joblib runs them side by side."""
    result = run(
        sweep_cmd(
            tmp_path,
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.n_trials=2",
            *SMALL[:1],
            "lora=qv",
        )
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(f"journal:{tmp_path / 'study.journal'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert all(t.user_attrs["status"] == "ok" and t.value > 0 for t in study.trials)
    assert "Joblib" in result.stdout + result.stderr
