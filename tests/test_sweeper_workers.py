"""Many workers on one study: the same command in three processes against PostgreSQL or a shared journal.

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
from helpers.runners import SMALL, SPLIT_SPACE, read_csv, run_train, start_train, sweep_args, train_here, wait_for
from helpers.studies import counted, load_study, new_database, trials_so_far

WORKERS = 3


@pytest.fixture
def fresh_storage(request, tmp_path):
    """A storage no worker has touched: a new journal file, or a new PostgreSQL database (created
    here, dropped after), so Optuna's schema does not exist when the workers start."""
    if request.param == "journal":
        (tmp_path / "shared").mkdir()  # a storage outside the sweep dir: its folder must exist
        yield f"journal:{tmp_path / 'shared' / 'study.journal'}"
        return
    postgres = request.getfixturevalue("postgres")  # conftest: this run's database, on .ci/run's server
    with new_database(postgres, "grpo_sweep_fresh") as url:
        yield url


def test_a_dead_workers_trial_is_failed_and_requeued_and_a_live_ones_waited_for():
    """workers.fail_dead_workers on a real Optuna study: a RUNNING trial whose worker (host:pid) ran on
    this host and is gone is failed (worker_died) and its point enqueued again at once; the trial of a
    live worker stays RUNNING, and the waiting line names it and its worker."""
    import socket
    import subprocess
    import sys

    import optuna

    from hydra_plugins.grpo_optuna_sweeper.workers import fail_dead_workers, waiting_line

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid no longer runs
    host = socket.gethostname()
    live_worker = f"{host}:{os.getppid()}"  # the process that started this one: alive, started earlier
    study = optuna.create_study(direction="maximize")
    space = {"lora_rank": optuna.distributions.CategoricalDistribution([8, 16])}
    dead, live = study.ask(space), study.ask(space)
    dead.set_user_attr("worker", f"{host}:{gone.pid}")
    live.set_user_attr("worker", live_worker)
    assert fail_dead_workers(study, max_retry=2) == [dead.number]
    trials = study.get_trials(deepcopy=False)
    assert trials[dead.number].state.name == "FAIL" and trials[dead.number].user_attrs["status"] == "worker_died"
    (again,) = [t for t in trials if t.state.name == "WAITING"]
    assert again.params == dead.params and again.system_attrs["failed_trial"] == dead.number
    assert "worker" not in again.user_attrs  # the failed attempt's outcome stays with it
    assert trials[live.number].state.name == "RUNNING"
    assert waiting_line(study, [live.number]) == f"waiting for 1 running in other workers: trial {live.number} ({live_worker})"
    assert fail_dead_workers(study, max_retry=2) == []  # nothing more to fail


@pytest.mark.slow
@pytest.mark.parametrize("fresh_storage", ["postgres", "journal"], indirect=True)
def test_three_workers_started_together_on_a_fresh_storage(tmp_path, fresh_storage):
    """Three workers started at the same moment on a storage with no schema and no study: all exit 0
    (the schema-creation and study-creation races are lost gracefully), the study holds exactly
    n_trials counted trials, no trial or start point is run twice, and each worker's report
    describes the whole study. Over 20 s: three sweeps at once, each its own process and forkserver, on 2 cores."""
    storage, name = fresh_storage, f"workers-{uuid.uuid4().hex[:8]}"
    args = [
        f"hydra.sweeper.storage={storage}",
        f"hydra.sweeper.study_name={name}",
        "hydra.sweeper.n_trials=3",
        *SPLIT_SPACE,
        "max_seq_length=64",
        "lora=qv",
        "lora_rank=8",
        # Start points, which every worker queues at the same moment (each must run once).
        "hydra.sweeper.enqueue=[{per_device_train_batch_size:2},{per_device_train_batch_size:4}]",
    ]
    # Each worker its own sweep dir (as on three machines); the study is the shared state.
    cmds = [sweep_args(tmp_path / f"w{i}", *args, enqueue=True) for i in range(WORKERS)]
    procs = [start_train(cmd, tmp_path / f"w{i}.log") for i, cmd in enumerate(cmds)]
    try:
        codes = [p.wait(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = [(tmp_path / f"w{i}.log").read_text() for i in range(WORKERS)]
    assert codes == [0] * WORKERS, "\n".join(log[-3000:] for log in logs)
    study = load_study(storage, name)
    trials = counted(study)
    assert len(trials) == 3, [(t.number, t.state.name, t.user_attrs.get("status")) for t in study.trials]
    assert all(t.state.name == "COMPLETE" and t.user_attrs["status"] in ("ok", "oom") for t in trials)
    run_dirs = [t.user_attrs["run_dir"] for t in trials]
    assert len(set(run_dirs)) == 3  # each counted trial ran once, in its own directory
    ran = [p for i in range(WORKERS) for p in (tmp_path / f"w{i}").glob("trial_*/metrics.json")]
    assert len(ran) == 3, f"trials run: {ran}"  # nothing ran that the study does not count
    # Each start point (the two enqueued, then the frontier start's pick in the room left) ran once,
    # however many workers queued it.
    probes = [t.system_attrs["fixed_params"]["per_device_train_batch_size"] for t in trials if "fixed_params" in t.system_attrs]
    assert len(probes) == len(set(probes)) and {2, 4} <= set(probes), [
        (t.number, t.system_attrs.get("fixed_params")) for t in trials
    ]
    # Every worker's report describes the whole study.
    for i in range(WORKERS):
        rows = read_csv(tmp_path / f"w{i}" / "trials.csv")
        assert sorted(int(r["number"]) for r in rows if r["state"] == "COMPLETE") == sorted(t.number for t in trials)
    if not storage.startswith("journal:"):
        secret = storage.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
        written = [
            p
            for i in range(WORKERS)
            for p in (tmp_path / f"w{i}").rglob("*")
            if p.is_file() and p.suffix in (".yaml", ".csv", ".json", ".log", ".html")
        ]
        for path in written:
            assert secret not in path.read_text(errors="ignore"), f"storage password leaked into {path}"
        for log in logs:
            assert secret not in log
        assert "***" in yaml.safe_load((tmp_path / "w0" / "best.yaml").read_text())["storage"]


@pytest.mark.slow
def test_killed_worker_trial_is_retried(tmp_path):
    """SIGKILL (no chance to clean up) mid-trial: the worker is gone, the trial is failed and re-run. Over 20 s: two sweeps
    (the SIGKILLed one in its own process, the resume)."""
    journal = f"journal:{tmp_path / 'study.journal'}"
    cmd = sweep_args(
        tmp_path, "hydra.sweeper.n_trials=2", "hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=3", *SMALL
    )
    proc = start_train(cmd, tmp_path / "first.log")
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

    result = train_here(cmd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # Same host, its pid gone: failed at once (workers.fail_dead_workers), before its heartbeat is even stale.
    assert "belonged to a worker of this host that is gone" in result.stdout + result.stderr
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
    """hydra/launcher=joblib: the sweeper asks n_jobs trials at once and joblib runs them side by side. Over 20 s: joblib's
    launcher: two job processes at once, each importing torch and TRL."""
    result = run_train(
        sweep_args(
            tmp_path,
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.n_trials=2",
            *SPLIT_SPACE,
            *SMALL[:1],
            "lora=qv",
        )
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(f"journal:{tmp_path / 'study.journal'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert all(t.user_attrs["status"] == "ok" and t.value > 0 for t in study.trials)
    assert "Joblib" in result.stdout + result.stderr
    assert "leaked semaphore" not in result.stdout + result.stderr  # process.quiet_progress
