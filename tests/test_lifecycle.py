"""A trial never outlives the process that started it, and a stopped trial still ends its W&B run.

The parent (`python train.py`, the sweep) is killed with SIGKILL while its trial hangs
(`trial.debug_fault=hang`): every process of the trial (the worker, its guardian, the forkserver)
must be gone within seconds, the trial's metrics.json and offline W&B run must say why, and a
resumed sweep must finish its study with nothing lost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from helpers.runners import (
    FAST,
    IN_PROCESS_TRIALS,
    OFFLINE_ENV,
    SMALL,
    load_metrics,
    log_text,
    start_train,
    sweep_args,
    train_here,
    wait_for,
)
from helpers.studies import counted, load_study, trials_so_far
from helpers.wandb_runs import read_run

GONE_WITHIN_S = 30  # the guardian's SIGTERM, metrics.json and W&B's offline finish, then SIGKILL


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return out


def _hanging(log: Path) -> bool:
    return "debug_fault=hang: hanging until stopped" in log_text(log)


def _hanging_under(root: Path) -> Path | None:
    return next((log.parent for log in root.glob("*/trial.log") if _hanging(log)), None)


def _kill_parent_during_hang(
    args: list[str], log: Path, trial_log, env: dict | None = None, started_by: str = "forkserver", seen: list | None = None
) -> list[psutil.Process]:
    """Start `python train.py ARGS`, wait until its trial hangs (`trial_log`: a path, or a callable),
    SIGKILL it; return the trial's processes as they were."""
    hanging = trial_log if callable(trial_log) else (lambda: _hanging(trial_log))
    proc = start_train(args, log, env=env)
    try:
        wait_for(hanging, timeout=300, proc=proc)
        trial = _descendants(proc.pid)
        names = " ".join(" ".join(p.cmdline()) for p in trial)
        assert len(trial) >= 2 and started_by in names, names  # the forkserver (or spawn) and the worker (and its guardian)
        if seen is not None:  # the command lines, read while the processes are alive
            seen.extend(" ".join(p.cmdline()) for p in trial)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return trial


def _stubborn_worker(ready) -> None:
    """A worker as the trial's is (the leader of its own process group, with a child of its own) that
    ignores SIGTERM, as one stuck in native code does."""
    os.setpgrp()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "60"])
    ready.put(child.pid)
    time.sleep(60)


def test_stopping_a_worker_that_ignores_sigterm_kills_its_whole_group(tmp_path):
    """parent.stop_trial (a timeout, an interrupted sweep): the reason is on disk for the worker to
    record, SIGTERM first, and after the grace period the worker's process group is killed, its
    children included, without waiting out anything longer."""
    import multiprocessing as mp

    from grpo_sweep.trial import process
    from grpo_sweep.trial.parent import stop_trial

    ctx = mp.get_context("fork")
    ready = ctx.Queue()
    proc = ctx.Process(target=_stubborn_worker, args=(ready,))
    proc.start()
    try:
        child = psutil.Process(ready.get(timeout=30))
        t0 = time.monotonic()
        stop_trial(proc, tmp_path, "timeout", "trial.timeout_s=1 reached", grace_s=0.5)
        stopped_s = time.monotonic() - t0
    finally:  # nothing of the test's own outlives it, whatever failed above
        if proc.is_alive():
            os.killpg(proc.pid, signal.SIGKILL)
    assert stopped_s < 5
    assert proc.exitcode == -signal.SIGKILL  # SIGTERM was ignored; the group kill ended it
    try:
        child.wait(timeout=5)
    except psutil.NoSuchProcess:
        pass
    assert not _alive([child])
    assert process.read_stop_request(tmp_path) == ("timeout", "trial.timeout_s=1 reached")


def test_a_killed_trials_open_wandb_run_gets_a_note_and_a_finished_one_none(tmp_path):
    """parent.wandb_note: a run the worker finished needs no note; one it left open (killed first) is
    named in the trial's record (metrics.json's wandb_note) and in a file beside the run, with the
    trial's status and error."""
    from grpo_sweep.trial import worker
    from grpo_sweep.trial.parent import wandb_note

    finished = {"status": "ok", "wandb_finished": True, "wandb_dir": str(tmp_path / "wandb" / "run-1")}
    wandb_note(finished, tmp_path)
    assert "wandb_note" not in finished and not (tmp_path / worker.WANDB_NOTE_FILE).exists()
    nothing_started = {"status": "failed", "error": "killed"}
    wandb_note(nothing_started, tmp_path)  # no run named, none on disk: nothing to say
    assert "wandb_note" not in nothing_started
    killed = {"status": "failed", "error": "SIGKILL\nmore", "wandb_mode": "online", "wandb_dir": "/runs/run-2"}
    wandb_note(killed, tmp_path)
    note = (tmp_path / worker.WANDB_NOTE_FILE).read_text().strip()
    assert note == killed["wandb_note"]
    assert note.startswith("W&B run in /runs/run-2 was not finished: the trial process ended (failed: SIGKILL)")
    assert "`wandb sync` uploads what is there" in note  # online: nothing this process can close


@pytest.mark.slow
def test_sigkill_of_train_py_stops_the_trial_and_ends_its_wandb_run(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [*FAST, "trial.debug_fault=hang", "logger=wandb", f"hydra.run.dir={run_dir}"]
    trial = _kill_parent_during_hang(cmd, tmp_path / "train.log", run_dir / "trial.log", env=OFFLINE_ENV)

    wait_for(lambda: not _alive(trial), timeout=GONE_WITHIN_S, every=0.2)
    # The worker recorded why it stopped, and closed its W&B run as failed with the reason.
    m = load_metrics(run_dir)
    assert m["status"] == "failed" and "the process that started it died" in m["error"]
    assert m["wandb_finished"] is True
    summary, _ = read_run(m["wandb_dir"])
    assert summary["state"] == "failed"
    assert "the process that started it died" in summary["summary"]["error"]


def _two_ranks_hanging(run_dir: Path) -> list[str]:
    """`python train.py`'s arguments for a two-process trial whose ranks both hang (trial.debug_fault=hang)."""
    return [
        *FAST,
        "trial.num_processes=2",
        "trial.debug_fault=hang",
        f"hydra.run.dir={run_dir}",
    ]


@pytest.mark.slow
def test_sigkill_of_train_py_leaves_no_rank_of_a_two_process_trial(tmp_path):
    """trial.num_processes=2: the worker leads torchrun, torchrun starts the ranks in their own
    sessions; SIGKILL of train.py must still leave no process behind, and the record says why. Over 20 s: a two-process
    trial: torchrun starts two ranks that each import torch and TRL from scratch."""
    run_dir = tmp_path / "run"
    cmd = _two_ranks_hanging(run_dir)
    hanging = lambda: all(_hanging(run_dir / "ranks" / str(k) / "trial.log") for k in range(2))  # noqa: E731
    names: list[str] = []
    trial = _kill_parent_during_hang(cmd, tmp_path / "train.log", hanging, seen=names)
    assert sum("grpo_sweep.trial.rank" in n and "torch.distributed.run" not in n for n in names) == 2, names
    assert any("torch.distributed.run" in n for n in names), names

    wait_for(lambda: not _alive(trial), timeout=GONE_WITHIN_S, every=0.2)
    m = load_metrics(run_dir)
    assert m["status"] == "failed" and "the process that started it died" in m["error"]
    assert m["world_size"] == 2 and len(m["rank_status"]) == 2


# vLLM engine settings the server trial passes, each away from its default: the tiny model's KV block is 64 KiB
# on vLLM-CPU (128 tokens), so 4 MiB is 64 whole blocks and reaches vLLM unrounded.
SERVER_ENGINE = {
    "max_num_seqs": 2,
    "max_num_batched_tokens": 256,
    "enable_prefix_caching": False,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 4 * 2**20,
    "kv_cache_dtype": "auto",
    "model_impl": "transformers",  # transformers' modeling code inside vLLM: server mode only (validate.check_vllm_engine)
}


@pytest.mark.slow
def test_a_server_mode_trial_trains_through_its_server_and_sigkill_leaves_none_behind(tmp_path):
    """backend.vllm_mode=server on CPU, one real `trl vllm-serve` for both checks: the engine settings
    (backend.vllm_*) reach the server (its own VllmConfig, /server_info, holds them), every step generates
    through it and the trial ends ok (trial.debug_fault=hang_after_train: it then hangs with the server
    up); SIGKILL of train.py then leaves no server (nor vLLM's engine process) behind, and the worker
    stops and measures it. Over 20 s: a vLLM server (CPU build) started in its own process, which
    imports vLLM, and a real trial through it from a fresh train.py."""
    from grpo_sweep.metrics import KEYS

    run_dir = tmp_path / "run"
    engine = [f"backend.vllm_{k}={str(v).lower()}" for k, v in SERVER_ENGINE.items() if k != "kv_cache_dtype"]
    cmd = [
        *FAST, "backend=trl_vllm", "backend.vllm_mode=server", *engine,
        "trial.debug_fault=hang_after_train", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    trained = "debug_fault=hang_after_train: trained (status ok), hanging until stopped"
    hanging = lambda: "debug_fault=hang_after_train" in log_text(run_dir / "trial.log")  # noqa: E731
    names: list[str] = []
    trial = _kill_parent_during_hang(cmd, tmp_path / "train.log", hanging, started_by="spawn_main", seen=names)
    assert trained in log_text(run_dir / "trial.log")  # every step ran and the trial reached ok before the kill
    assert any("grpo_sweep.trial.vllm_serve" in n for n in names), names  # the server was running
    assert any("EngineCore" in n for n in names), names  # and vLLM's engine process

    wait_for(lambda: not _alive(trial), timeout=GONE_WITHIN_S, every=0.2)
    m = load_metrics(run_dir)
    assert m["status"] == "failed" and "the process that started it died" in m["error"]
    assert set(m) <= KEYS and m["backend"] == "trl_vllm" and m["effective"]["vllm_mode"] == "server"
    assert m["steps"] == 2 and m["tokens_per_s"] > 0
    assert m["vllm_pool_bytes"] is None  # nothing of vLLM's inside the training process
    assert m["vllm_server_peak_rss_bytes"] > 100 * 2**20 and m["vllm_server_start_s"] > 0  # stopped by the worker, measured apart
    assert "skipped on CPU" in m["vllm_weight_sync"]
    assert m["effective"]["vllm_engine"] == SERVER_ENGINE  # read back from the server engine's VllmConfig
    assert (run_dir / "vllm_server.log").read_text().count("POST /v1/completions") >= 2  # every step generated through the server
    port = m["vllm_server_url"].rsplit(":", 1)[1]
    left = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "grpo_sweep.trial.vllm_serve" in " ".join(p.info["cmdline"] or []) and port in " ".join(p.info["cmdline"] or [])
    ]
    assert not left, left  # torn down


@IN_PROCESS_TRIALS  # its trial comes from the forkserver the other short in-process trials share
def test_timeout_ends_the_wandb_run_as_failed_with_the_reason(tmp_path, warm_model, deadline_when):
    """The deadline (trial.timeout_s=20) passes once the trial hangs with its offline W&B run open
    (conftest.deadline_when), not after 20 s of wall clock: the stop, the record and the W&B run's end
    are the real ones."""
    from grpo_sweep.trial.worker import WANDB_NOTE_FILE

    run_dir = tmp_path / "run"
    deadline_when(lambda: _hanging(run_dir / "trial.log"), 20)
    cmd = [*FAST, "trial.debug_fault=hang", "trial.timeout_s=20", "logger=wandb", f"hydra.run.dir={run_dir}"]
    result = train_here(cmd, env=OFFLINE_ENV)
    assert result.returncode == 1, result.stderr[-3000:]  # one run whose trial timed out: the command failed
    m = load_metrics(run_dir)
    assert m["status"] == "timeout" and "trial.timeout_s=20" in m["error"], m["error"]
    assert _hanging(run_dir / "trial.log"), "the trial was stopped before its W&B run was open"
    assert m["wandb_finished"] is True and not (run_dir / WANDB_NOTE_FILE).exists()
    summary, _ = read_run(m["wandb_dir"])
    assert summary["state"] == "failed" and "timeout" in summary["tags"]
    assert "trial.timeout_s=20" in summary["summary"]["error"]


@pytest.mark.slow
def test_sigkill_of_the_sweep_leaves_no_trial_and_the_resumed_sweep_loses_nothing(tmp_path):
    """A finished trial; a second run whose trial hangs is SIGKILLed; the same command finishes the study. Over 20 s: three
    sweeps (the first trial, the killed one in its own process, the resume), and the grace period waited out."""
    journal = f"journal:{tmp_path / 'study.journal'}"
    beat = ["hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=2", *SMALL]
    result = train_here(sweep_args(tmp_path, *beat, "hydra.sweeper.n_trials=1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    kept = load_study(journal).trials[0]
    assert kept.state.name == "COMPLETE"

    cmd = sweep_args(tmp_path, *beat, "hydra.sweeper.n_trials=2")
    trial = _kill_parent_during_hang([*cmd, "trial.debug_fault=hang"], tmp_path / "killed.log", lambda: _hanging_under(tmp_path))
    wait_for(lambda: not _alive(trial), timeout=GONE_WITHIN_S, every=0.2)
    killed_dir = _hanging_under(tmp_path)
    assert load_metrics(killed_dir)["status"] == "failed"  # the worker recorded why it stopped
    killed = load_study(journal).trials[1]
    assert killed.state.name == "RUNNING"  # SIGKILL: nobody told the study

    # Resume once the killed sweep's heartbeat is older than the grace period (what a real resume sees).
    wait_for(lambda: time.time() - _last_beat(journal, 1) > 2.5, timeout=30, every=0.5)
    result = train_here(cmd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(journal)
    assert study.trials[0].value == kept.value and study.trials[0].user_attrs["run_dir"] == kept.user_attrs["run_dir"]
    assert study.trials[1].state.name == "FAIL"  # the killed trial, failed as stale and retried
    retry = [t for t in study.trials if t.system_attrs.get("failed_trial") == 1]
    assert len(retry) == 1 and retry[0].state.name == "COMPLETE" and retry[0].params == killed.params
    assert len(counted(study)) == 2


def _last_beat(journal: str, number: int) -> float:
    from hydra_plugins.grpo_optuna_sweeper.workers import HEARTBEAT_ATTR

    trial = next(t for t in trials_so_far(journal) if t.number == number)
    return max(trial.system_attrs.get(HEARTBEAT_ATTR) or 0.0, trial.datetime_start.timestamp())


@pytest.mark.slow
def test_a_trial_killed_before_closing_its_wandb_run_leaves_a_note(tmp_path):
    """SIGKILL from outside (trial.debug_fault=signal, after the W&B run started): nothing can finish
    the run, so metrics.json and the run directory say so."""
    from grpo_sweep.trial.worker import WANDB_NOTE_FILE

    result = train_here([*FAST, "trial.debug_fault=signal", "logger=wandb", f"hydra.run.dir={tmp_path}"], env=OFFLINE_ENV)
    assert result.returncode == 1, result.stderr[-3000:]  # the one run's trial failed
    m = load_metrics(tmp_path)
    assert m["status"] == "failed" and "SIGKILL" in m["error"]
    assert "was not finished" in m["wandb_note"] and "SIGKILL" in m["wandb_note"]
    assert (tmp_path / WANDB_NOTE_FILE).read_text().strip() == m["wandb_note"]
    # The parent closed the run from outside (same id, resumed offline): complete, failed, with the reason.
    assert "The parent closed it as failed" in m["wandb_note"] and not m.get("wandb_finished")
    summary, _ = read_run(m["wandb_dir"])
    assert summary["state"] == "failed" and m["wandb_dir"].endswith(summary["run_id"])
    assert summary["summary"]["status"] == "failed" and "SIGKILL" in summary["summary"]["error"]


@pytest.mark.slow
def test_ctrl_c_of_a_two_process_run_is_one_quiet_line(tmp_path):
    """Over 20 s: a two-process trial (two ranks import torch and TRL). Ctrl-C (SIGINT to train.py)
    while both ranks run: exit 130, the stop said once, no traceback (neither ours nor torchrun's
    SignalException) and no fatal error on the console, the record written, no rank left."""
    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"
    cmd = _two_ranks_hanging(run_dir)
    proc = start_train(
        cmd,
        log,
        # a terminal's Ctrl-C: SIGINT at its default, whatever this test process inherited (a suite started
        # in the background of a non-interactive shell ignores SIGINT, and so would train.py: exec keeps it)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for(lambda: all(_hanging(run_dir / "ranks" / str(k) / "trial.log") for k in range(2)), timeout=300, every=0.5)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    console = log.read_text()
    assert console.count("[trial] stopping the ranks: the trial was stopped: its parent was interrupted") == 1, console
    assert f"Interrupted: the trial was stopped; {run_dir}/metrics.json says so" in console
    for noise in ("Traceback", "SignalException", "Fatal Python error", "Received 15 death signal"):
        assert noise not in console, (noise, console[-3000:])
    assert "SignalException" in (run_dir / "trial.log").read_text()  # kept where it belongs: the trial's log
    assert load_metrics(run_dir)["status"] == "failed"
    left = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    assert not left, left
