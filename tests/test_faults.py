"""Faults a careful user's bad day brings, injected into real tiny sweeps (issue #30, docs/crash-safety.md).

Each test asserts what is kept and what is counted afterwards, not only that nothing raised:
- a journal torn mid-append (a kill, a full disk on a tiny tmpfs) is repaired on the next run, which
  keeps every finished trial and ends with exactly n_trials counted;
- a broken metrics.json is one failed trial naming the file, the sweep goes on;
- a worker that dies releases its trial, and a re-run never waits out grace_period for it;
- a PostgreSQL restart across a trial's end is retried, nothing lost; a storage that stays away ends
  the sweep with one line;
- a study name reused for another search stops before any trial, naming each difference;
- a failure that embeds the sampled value still stops the sweep as systematic.

Storages: the journal (the default), SQLite, and the real PostgreSQL from `.ci/run`
(GRPO_SWEEP_TEST_POSTGRES; skipped with the reason without it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers.runners import SMALL, cli, start_train, sweep_args, train_here, wait_for
from helpers.studies import counted, load_study, trials_so_far

from grpo_sweep.metrics import MetricsError, read_metrics
from grpo_sweep.study.storage import StorageError

# Short heartbeats so nothing waits long; the grace period a re-run must NOT wait out is long.
QUICK = [
    *SMALL,
    "hydra.sweeper.confirm_top=0",
    "hydra.sweeper.heartbeat_interval=2",
    "hydra.sweeper.grace_period=600",
    "hydra.sweeper.storage_retry_s=20",
]


def _stopped_in_one_line(log: Path, code: int, cause: str) -> None:
    """The sweep whose output is `log` exited 1 with no traceback and one 'Sweep stopped: storage' line
    that names `cause` and says to re-run the same command."""
    out = log.read_text()
    assert code == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    last = [line for line in out.splitlines() if "Sweep stopped: storage" in line]
    assert len(last) == 1 and cause in last[0] and "re-run the same command" in last[0], out[-3000:]


def _journal_records(path: Path) -> list[dict]:
    lines = path.read_bytes().splitlines(keepends=True)
    assert all(line.endswith(b"\n") for line in lines), "a torn (unterminated) record is left"
    return [json.loads(line) for line in lines]


def _trials(storage: str, name: str) -> list:
    """The study's trials so far, or [] before the sweep created its storage."""
    try:
        return trials_so_far(storage, name)
    except StorageError:  # a SQLite file not created yet
        return []


def _done(storage: str, name: str = "tiny_cpu") -> dict[int, float]:
    return {t.number: t.value for t in _trials(storage, name) if t.state.name == "COMPLETE"}


def _wait_until_running_after(storage: str, done: int, proc: subprocess.Popen) -> None:
    """Until the sweep `proc` has `done` trials COMPLETE and the next one RUNNING with its worker
    recorded (the sweep records it right after Optuna creates the trial; a kill in between is not a
    kill mid-trial): one read of the study each time (two reads could each see a different moment),
    every 0.1 s (a warm trial can run for about a second; a sweep that finished it between two looks
    fails the test as exited)."""

    def there() -> bool:
        trials = _trials(storage, "tiny_cpu")
        done_now = sum(t.state.name == "COMPLETE" for t in trials)
        return done_now == done and any(t.state.name == "RUNNING" and t.user_attrs.get("worker") for t in trials)

    wait_for(there, timeout=600, every=0.1, proc=proc)


@pytest.fixture
def storage_of(request, tmp_path):
    """(storage, study name): the sweep dir's journal, a SQLite file, or the real PostgreSQL database
    (shared with other tests: a study name of its own)."""
    kind, name = request.param, f"faults-{uuid.uuid4().hex[:8]}"
    if kind == "journal":
        return f"journal:{tmp_path / 'sweep' / 'study.journal'}", name
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'sweep' / 'study.db'}", name
    return request.getfixturevalue("postgres"), name  # conftest: this run's database


# ------------------------------------------------------------------ 1. torn journal
@pytest.mark.slow
def test_a_journal_torn_by_a_kill_mid_append_is_repaired_by_the_same_command(tmp_path):
    """SIGKILL the sweep while its third trial runs, and leave the journal ending in half a record
    (what a kill mid-append leaves). The same command again: one line says the journal was repaired
    and where the backup is; it does not wait out grace_period=600 s for the dead worker's trial; it
    ends with exactly n_trials=3 counted, the two finished trials kept with their values, and
    `grpo-sweep report` reads the study. Over 20 s: two sweeps (the one killed mid-trial in its own process, the repairing
    resume)."""
    sweep_dir = tmp_path / "sweep"
    journal = sweep_dir / "study.journal"
    storage = f"journal:{journal}"
    cmd = sweep_args(sweep_dir, "hydra.sweeper.n_trials=3", *QUICK)
    proc = start_train(cmd, tmp_path / "first.log")
    try:
        _wait_until_running_after(storage, 2, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = _done(storage)
    lines = journal.read_bytes().splitlines(keepends=True)
    with open(journal, "ab") as f:
        f.write(lines[-1][: len(lines[-1]) // 2])  # half of a record, no newline: the append cut short

    t0 = time.monotonic()
    result = train_here(cmd)
    elapsed = time.monotonic() - t0
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    repaired = [line for line in out.splitlines() if "repaired: dropped" in line]
    assert len(repaired) == 1 and str(journal) in repaired[0] and ".torn-" in repaired[0], out[-3000:]
    assert list(sweep_dir.glob("study.journal.torn-*.bak")), "no backup of the torn journal"
    assert "belonged to a worker of this host that is gone" in out
    assert "waiting for" not in out  # no other worker is alive: nothing to wait for
    assert elapsed < 600  # never waited out grace_period
    _journal_records(journal)
    study = load_study(storage)
    assert len(counted(study)) == 3
    after = {t.number: t.value for t in study.trials if t.state.name == "COMPLETE"}
    assert {n: after[n] for n in before} == before  # every finished trial kept, with its measurement
    report = cli("report", str(sweep_dir), "--out", str(tmp_path / "rep"))
    assert report.returncode == 0, report.stdout + report.stderr
    assert (tmp_path / "rep" / "report.html").exists()


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return False
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True).returncode == 0
    )


def _fill(where: Path) -> Path:
    """Fill the filesystem at `where` to the last byte; returns the filler file."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


@pytest.mark.slow
def test_a_full_disk_under_the_journal_ends_in_one_line_and_the_same_command_resumes(tmp_path):
    """The journal lives on a tiny tmpfs the test mounts (root only; else skipped with the reason).
    The disk fills while the second trial runs: the sweep retries its writes for storage_retry_s,
    then ends with one line (no traceback) and leaves no half record; once space is freed the same
    command finishes with the first trial kept and exactly n_trials=3 counted. Over 20 s: two sweeps (the one the full disk
    stops, in its own process; the resume)."""
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "256k"):
        pytest.skip("cannot mount a tmpfs here (needs root): the disk-full case needs a real full filesystem")
    try:
        storage = f"journal:{mnt / 'study.journal'}"
        cmd = sweep_args(tmp_path / "sweep", "hydra.sweeper.n_trials=3", f"hydra.sweeper.storage={storage}", *QUICK)
        cmd = [c.replace("storage_retry_s=20", "storage_retry_s=1") for c in cmd]
        proc = start_train(cmd, tmp_path / "first.log")
        try:
            _wait_until_running_after(storage, 1, proc)
            filler = _fill(mnt)
            code = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        _stopped_in_one_line(tmp_path / "first.log", code, "No space left on device")
        _journal_records(mnt / "study.journal")  # no half record behind the failed write
        before = _done(storage)
        assert len(before) == 1
        filler.unlink()  # the user frees the disk
        result = train_here(cmd)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out[-3000:]
        study = load_study(storage)
        assert len(counted(study)) == 3
        after = {t.number: t.value for t in study.trials if t.state.name == "COMPLETE"}
        assert {n: after[n] for n in before} == before
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# ------------------------------------------------------------------ 2. broken metrics.json
BROKEN = {
    "garbage": "\x00\x01 not json at all",
    "empty": "",
    "half": '{"status": "ok", "tokens_per_s": 12',
    "a list": "[1, 2, 3]",
    "step not a number": json.dumps({"status": "ok", "tokens_per_s": 1.0, "history": [{"step": "one"}]}),
    "unknown status": json.dumps({"status": "great"}),
    "a string for a number": json.dumps({"status": "ok", "tokens_per_s": "1255"}),
}


@pytest.mark.parametrize("how", [*BROKEN, "a directory"])
def test_every_broken_metrics_json_is_one_line_naming_the_file(tmp_path, how):
    path = tmp_path / "metrics.json"
    if how == "a directory":
        path.mkdir()
    else:
        path.write_text(BROKEN[how])
    with pytest.raises(MetricsError) as err:
        read_metrics(tmp_path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_whole_record_and_no_record_still_read(tmp_path):
    assert read_metrics(tmp_path) is None
    (tmp_path / "metrics.json").write_text(json.dumps({"status": "ok", "tokens_per_s": 3.5, "history": [{"step": 1}]}))
    assert read_metrics(tmp_path)["tokens_per_s"] == 3.5


@pytest.mark.slow
@pytest.mark.parametrize("storage_of", ["journal", "sqlite", "postgres"], indirect=True)
def test_a_torn_metrics_json_fails_its_trial_and_the_sweep_goes_on(tmp_path, storage_of):
    """trial.debug_fault=bad_metrics on every trial: each is FAIL with the reason naming its
    metrics.json, none stays RUNNING, n_trials are counted, the summary is written, exit 0."""
    sweep_dir, (storage, name) = tmp_path / "sweep", storage_of
    result = train_here(
        sweep_args(
            sweep_dir,
            "hydra.sweeper.n_trials=2",
            f"hydra.sweeper.storage={storage}",
            f"hydra.sweeper.study_name={name}",
            "hydra.sweeper.max_failures_in_a_row=0",
            "trial.debug_fault=bad_metrics",
            *QUICK,
        )
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    study = load_study(storage, name)
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]
    for t in study.trials:
        assert "metrics.json: not valid JSON" in t.user_attrs["error"], t.user_attrs
        assert f"trial_{t.number:04d}" in t.user_attrs["error"]
    assert len(counted(study)) == 2
    assert (sweep_dir / "trials.csv").exists() and (sweep_dir / "report.html").exists()


# ------------------------------------------------------------------ 4. storage blips
def _pg_cluster(url: str) -> list[str] | None:
    """`pg_ctlcluster <version> main` for the local server, or None (not this machine's to restart)."""
    if "@localhost" not in url or shutil.which("pg_lsclusters") is None or os.geteuid() != 0:
        return None
    rows = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout.split()
    return ["pg_ctlcluster", rows[0], rows[1]] if len(rows) >= 2 else None


@pytest.mark.slow
def test_a_postgresql_outage_at_a_trials_end_is_retried_and_nothing_is_lost(tmp_path, postgres):
    """The real PostgreSQL server is stopped as the first trial takes its last step and started again
    as soon as the sweep says it is retrying (short: other tests may share the server). The sweep's writes in between wait
    (storage_retry_s) instead of crashing: exit 0, n_trials=2 COMPLETE, trial 0's measurement kept. Over 20 s: a real sweep
    in its own train.py process, whose trial forkserver first imports torch, TRL and W&B (~6 s on 2 cores), and the server's
    stop and restart."""
    cluster = _pg_cluster(postgres)
    if cluster is None:
        pytest.skip("needs the local PostgreSQL server (.ci/run) and root to restart it (pg_ctlcluster)")
    name, sweep_dir = f"faults-pg-{uuid.uuid4().hex[:8]}", tmp_path / "sweep"
    cmd = sweep_args(
        sweep_dir, "hydra.sweeper.n_trials=2", f"hydra.sweeper.storage={postgres}", f"hydra.sweeper.study_name={name}", *QUICK
    )
    proc = start_train(cmd, tmp_path / "sweep.log")
    trial_log = sweep_dir / "trial_0000" / "trial.log"
    try:
        wait_for(lambda: trial_log.exists() and "step 2/2" in trial_log.read_text(errors="replace"), timeout=600, proc=proc)
        subprocess.run([*cluster, "stop"], check=True, timeout=60)
        try:  # down until the sweep has met the outage (its retry line), not for a fixed time
            wait_for(lambda: "unavailable" in (tmp_path / "sweep.log").read_text(errors="replace"), timeout=120, proc=proc)
        finally:
            subprocess.run([*cluster, "start"], check=True, timeout=60)
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "sweep.log").read_text()
    assert code == 0, out[-3000:]
    assert "unavailable" in out and "retrying for up to 20 s" in out, out[-3000:]  # the outage was met
    assert "Traceback" not in out
    assert "Heartbeat of storage" not in out  # Optuna's per-trial warning, silenced once
    study = load_study(postgres, name)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert len(counted(study)) == 2
    record = json.loads((sweep_dir / "trial_0000" / "metrics.json").read_text())
    assert study.trials[0].value == pytest.approx(record["tokens_per_s"])


# ------------------------------------------------------------------ 3. a dying worker
@pytest.mark.slow
@pytest.mark.parametrize("storage_of", ["journal", "sqlite", "postgres"], indirect=True)
def test_a_sweeper_dying_of_an_error_releases_its_trial_and_the_rerun_does_not_wait(tmp_path, storage_of):
    """Not a signal: a file stands where trial 1's job directory goes, so Hydra's launcher raises
    OSError in the sweeper. Trial 1 is released before the sweeper exits (FAIL, status worker_error,
    the error named, its point re-enqueued: nothing stays RUNNING) and trial 0 is kept. With the
    file gone, the same command ends with exactly n_trials=2 counted, without waiting out
    grace_period=600 and without a "waiting for other workers" line (no other worker exists). Over 20 s: two sweeps (the
    failing one, the resume)."""
    sweep_dir, (storage, name) = tmp_path / "sweep", storage_of
    sweep_dir.mkdir()
    (sweep_dir / "trial_0001").write_text("in the way\n")
    cmd = sweep_args(
        sweep_dir, "hydra.sweeper.n_trials=2", f"hydra.sweeper.storage={storage}", f"hydra.sweeper.study_name={name}", *QUICK
    )
    first = train_here(cmd)
    out = first.stdout + first.stderr
    assert first.returncode != 0, out[-3000:]
    study = load_study(storage, name)
    states = {t.number: (t.state.name, t.user_attrs.get("status")) for t in study.trials}
    assert states[0] == ("COMPLETE", "ok") and states[1] == ("FAIL", "worker_error"), states
    assert "the sweeper failed: FileExistsError" in study.trials[1].user_attrs["error"]
    waiting = [t.system_attrs.get("failed_trial") for t in study.trials if t.state.name == "WAITING"]
    assert waiting == [1], states  # its point re-enqueued
    kept = study.trials[0].value
    (sweep_dir / "trial_0001").unlink()
    t0 = time.monotonic()
    result = train_here(cmd)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert time.monotonic() - t0 < 300 and "waiting for" not in out
    study = load_study(storage, name)
    assert len(counted(study)) == 2 and not [t for t in study.trials if t.state.name in ("RUNNING", "WAITING")]
    assert study.trials[0].value == kept


def test_a_dead_worker_is_known_only_on_this_host_by_its_pid():
    """worker_dead: this host and a pid that is gone, or reused by a process started after the
    trial; never another host's worker (its heartbeat decides), never this process."""
    import datetime
    import socket

    from hydra_plugins.grpo_optuna_sweeper.workers import worker_dead

    here, now = socket.gethostname(), datetime.datetime.now()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert worker_dead(f"{here}:{gone.pid}", now)
    assert not worker_dead(f"{here}:{os.getpid()}", now)
    assert not worker_dead(f"other-host:{gone.pid}", now)
    assert not worker_dead(None, now) and not worker_dead("garbage", now)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # The worker started before its trial: alive. A process started after the trial: a reused pid.
        assert not worker_dead(f"{here}:{alive.pid}", datetime.datetime.now() + datetime.timedelta(seconds=5))
        assert worker_dead(f"{here}:{alive.pid}", now - datetime.timedelta(hours=1))  # a pid reused since the trial began
    finally:
        alive.kill()
        alive.wait()


# ------------------------------------------------------------------ 5. one name, one search
@pytest.mark.slow
def test_a_study_name_reused_for_another_search_stops_before_any_trial(tmp_path):
    """A one-trial study over lora_rank=choice(8,16,32), maximize tokens_per_s. Re-run with a
    different choice list, an added parameter, the other direction, another objective: each stops
    with exit 1 and one line naming each difference and a new study_name, and the study still holds
    its one trial. The same search again resumes it ("Resuming study ... with 1 trial done")."""
    sweep_dir = tmp_path / "sweep"
    rank = "lora_rank=choice(8,16,32)"
    base = [a for a in QUICK if a != "lora_rank=8"] + [rank, "hydra.sweeper.concessions=[lora_rank]", "hydra.sweeper.n_trials=1"]
    first = train_here(sweep_args(sweep_dir, *base))
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    assert "New study 'tiny_cpu'" in first.stdout + first.stderr
    storage = f"journal:{sweep_dir / 'study.journal'}"
    created = load_study(storage)
    assert created.user_attrs["identity:objective"] == "tokens_per_s"
    assert created.user_attrs["identity:direction"] == "maximize"
    assert list(created.user_attrs["identity:search_space"]) == ["lora_rank"]

    others = {
        "choice list": (
            ["lora_rank=choice(8,16,32,64)"],
            ["parameter lora_rank: the study has choice(8, 16, 32), this sweep choice(8, 16, 32, 64)"],
        ),
        "added parameter": (
            ["gradient_checkpointing=choice(false,true)"],
            ["parameter gradient_checkpointing added (choice(False, True))"],
        ),
        "direction": (["hydra.sweeper.direction=minimize"], ['direction: the study has "maximize", this sweep "minimize"']),
        "objective": (
            ["hydra.sweeper.objective=samples_per_s"],
            ['objective: the study has "tokens_per_s", this sweep "samples_per_s"'],
        ),
    }
    for what, (extra, expected) in others.items():
        args = [a for a in base if not (what == "added parameter" and a == "gradient_checkpointing=false")]
        args = [a for a in args if not (what == "choice list" and a == rank)] + extra
        result = train_here(sweep_args(sweep_dir, *args))
        out = result.stdout + result.stderr
        assert result.returncode == 1, (what, out[-3000:])
        lines = [line for line in out.splitlines() if "is another search" in line]
        assert len(lines) == 1, (what, out[-3000:])
        for words in expected:
            assert words in lines[0], (what, lines[0])
        assert "hydra.sweeper.study_name=tiny_cpu-2" in lines[0]
        assert "Traceback" not in out
        assert len(load_study(storage).trials) == 1  # no trial was asked or queued
    again = train_here(sweep_args(sweep_dir, *base))
    assert again.returncode == 0 and "Resuming study 'tiny_cpu' with 1 trial done" in again.stdout + again.stderr
    assert len(load_study(storage).trials) == 1


# ------------------------------------------------------------------ 6. systematic failure by cause
@pytest.mark.slow
def test_failures_that_embed_the_sampled_value_still_stop_the_sweep(tmp_path):
    """`+foo=choice(1,2,3)` is rejected for every point with the point's own value in the message:
    the sweep still stops after max_failures_in_a_row=3 trials with exit 1, not after n_trials=8."""
    result = train_here(sweep_args(tmp_path, "hydra.sweeper.n_trials=8", "+foo=choice(1,2,3)", *QUICK))
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    study = load_study(f"journal:{tmp_path / 'study.journal'}")
    assert [t.state.name for t in study.trials] == ["FAIL"] * 3
    assert "failed in a row for the same reason" in out


def test_the_cause_of_a_failure_leaves_values_and_paths_out():
    from hydra_plugins.grpo_optuna_sweeper.failures import cause_of

    one = "invalid: foo=1: unknown key at /tmp/a/trial_0001/config.yaml ('x1')"
    two = "invalid: foo=3.5: unknown key at /tmp/a/trial_0007/config.yaml ('x2')"
    assert cause_of(one) == cause_of(two)
    assert cause_of("failed: ModuleNotFoundError: vllm") != cause_of("failed: RuntimeError: reward raised")


# ------------------------------------------------------------------ 7. smaller defects
def test_bad_ranges_name_the_parameter_and_integer_levers_sample_integers():
    from optuna.distributions import FloatDistribution, IntDistribution

    from hydra_plugins.grpo_optuna_sweeper.space import parse_space

    with pytest.raises(ValueError) as err:
        parse_space(["lora_rank=interval(10,5)"])
    assert str(err.value).startswith("hydra.sweeper.params lora_rank=interval(10,5): ") and "\n" not in str(err.value)
    dists, _ = parse_space(
        ["max_seq_length=interval(64,256)", "learning_rate=interval(1e-5,1e-4)"], is_integer=lambda k: k == "max_seq_length"
    )
    assert dists["max_seq_length"] == IntDistribution(64, 256)
    assert isinstance(dists["learning_rate"], FloatDistribution)
    assert isinstance(
        parse_space(["max_seq_length=interval(64.5,256)"], is_integer=lambda k: True)[0]["max_seq_length"], FloatDistribution
    )


@pytest.mark.parametrize(
    "args, words",
    [
        (["learning_rate=interval(1e-3,1e-5)"], "hydra.sweeper.params learning_rate=interval(1e-3,1e-5)"),
        (
            ["hydra.sweeper.sampler=grid", "learning_rate=interval(1e-5,1e-4)"],
            "hydra.sweeper.params.learning_rate: sampler=grid needs discrete values",
        ),
        (["hydra.sweeper.storage=sqlite:////nonexistent/dir/x.db"], "folder /nonexistent/dir does not exist"),
        (["hydra.sweeper.storage=postgresql://grpo_sweep_ci:wrong-secret@localhost:5999/x"], "cannot connect"),
        (["hydra.sweeper.storage=WRONG_PASSWORD_OF_THE_TEST_SERVER"], "password authentication failed"),
    ],
)
def test_bad_sweeper_input_is_one_line_before_any_trial(tmp_path, args, words):
    """A wrong password needs a server that answers: .ci/run's (GRPO_SWEEP_TEST_POSTGRES); without
    one that case is skipped, like every other PostgreSQL test."""
    if "WRONG_PASSWORD_OF_THE_TEST_SERVER" in args[0]:
        args = [f"hydra.sweeper.storage={_with_wrong_password(_test_server())}"]
    result = train_here(sweep_args(tmp_path, *QUICK, *args))
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Traceback" not in out and words in out, out[-3000:]
    assert "wrong-secret" not in out
    assert not list(tmp_path.glob("trial_*")) and not Path("/nonexistent").exists()


def _test_server() -> str:
    url = os.environ.get("GRPO_SWEEP_TEST_POSTGRES")
    if not url:
        pytest.skip("GRPO_SWEEP_TEST_POSTGRES is not set (.ci/run installs and starts PostgreSQL and sets it)")
    return url


def _with_wrong_password(url: str) -> str:
    """`url` with its password replaced by 'wrong-secret' (the user and database kept)."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(password="wrong-secret").render_as_string(hide_password=False)


def test_a_journal_lock_left_by_a_killed_sweep_of_this_host_is_released_at_once(tmp_path, caplog):
    """A sweep SIGKILLed while it held the journal's lock file leaves it behind, and a resume would wait
    out Optuna's 30 s grace period. The lock names its holder: this host's dead holder's lock is
    released at once; a live holder's, another host's, or one without its line is left alone."""
    import socket

    import optuna

    from grpo_sweep.study.journal import OwnedJournalFileLock
    from grpo_sweep.study.storage import open_storage

    journal = tmp_path / "study.journal"
    study = optuna.create_study(storage=open_storage(f"journal:{journal}", retry_s=5), study_name="s")
    lock = Path(f"{journal}.lock")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    for holder in (f"{host} {os.getppid()}", f"elsewhere-{host} {gone.pid}", ""):
        lock.write_text(holder)
        OwnedJournalFileLock(str(journal))._release_if_holder_gone()
        assert lock.read_text() == holder  # alive, another host's, or not written yet: kept
    lock.write_text(f"{host} {gone.pid}")
    started = time.monotonic()
    with caplog.at_level("WARNING"):
        study.set_user_attr("after", "the kill")  # an append: takes the lock
    assert time.monotonic() - started < 5  # not Optuna's 30 s
    assert f"held by process {gone.pid} of this host, which is gone: released" in caplog.text
    assert not lock.exists()  # released again after the append
    assert optuna.load_study(study_name="s", storage=open_storage(f"journal:{journal}")).user_attrs == {"after": "the kill"}


def test_every_call_optunas_cache_makes_past_the_public_api_is_retried(tmp_path, caplog):
    """Optuna wraps an RDBStorage in its _CachedStorage, which calls private methods of the storage
    (`_get_trials`, `_create_new_trial`, ...). A PostgreSQL outage met by one of them would end a sweep
    with a traceback, so every such call is retried; a SQLite file locked for a second while the study asks, suggests and reads is waited out
    and leaves exactly one trial."""
    import re
    import sqlite3
    import threading

    import optuna
    from optuna.storages import _cached_storage

    from grpo_sweep.study import retry
    from grpo_sweep.study import storage as st

    called = set(re.findall(r"self\._backend\.(_[a-z]\w*)\(", Path(_cached_storage.__file__).read_text()))
    assert called and called <= set(retry.CACHED_STORAGE_CALLS), called - set(retry.CACHED_STORAGE_CALLS)

    db = tmp_path / "study.db"
    url = f"sqlite:///{db}"
    # SQLite's own busy wait (5 s by default) made short: the lock must reach the retry.
    storage = retry.RetryingRDBStorage(url, retry_s=30, source=url, engine_kwargs={"connect_args": {"timeout": 0.05}})
    study = optuna.create_study(storage=storage, study_name="s")
    assert isinstance(study._storage, _cached_storage._CachedStorage)
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(1.0, lambda: holder.execute("ROLLBACK"))
    release.start()
    try:
        with caplog.at_level("WARNING", logger=st.__name__):
            trial = study.ask()
            trial.suggest_float("x", 0.0, 1.0)
            study.tell(trial, 1.0)
            assert [t.state.name for t in study.get_trials()] == ["COMPLETE"]
    finally:
        release.join()
        holder.close()
    assert "unavailable (_get_trials: " in caplog.text  # ask() read through the private call, met the lock, retried


def test_a_write_that_may_have_landed_is_not_made_twice():
    """Retrying a write after a failure that may have committed would make a second copy: a created
    trial nobody runs (RUNNING forever, waited for) or a duplicate parameter. `_create_new_trial` is
    tried again only when the failed attempt never reached the database; a parameter whose first
    attempt landed reads as set."""
    import sqlalchemy.exc as sa

    from grpo_sweep.study.retry import call_with_retry, the_write_never_landed

    def failing(*errors):
        calls = []

        def fn():
            calls.append(1)
            if len(calls) <= len(errors):
                raise errors[len(calls) - 1]
            return "done"

        return fn, calls

    dropped = sa.OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))
    refused = sa.OperationalError("connect", {}, Exception('connection to server at "db", port 5432 failed: Connection refused'))
    assert not the_write_never_landed(dropped) and the_write_never_landed(refused)
    fn, calls = failing(dropped)
    with pytest.raises(StorageError, match="while creating a trial .* re-run the same command"):
        call_with_retry(fn, "_create_new_trial", 5, "postgresql://db/x")  # one line for the sweep to print
    assert len(calls) == 1  # not tried again: the trial may exist already
    fn, calls = failing(refused)
    assert call_with_retry(fn, "_create_new_trial", 5, "postgresql://db/x") == "done" and len(calls) == 2
    fn, calls = failing(dropped)
    assert call_with_retry(fn, "_get_trials", 5, "postgresql://db/x") == "done"  # a read: always again
    duplicate = sa.IntegrityError("INSERT", {}, Exception("duplicate key value violates unique constraint"))
    fn, calls = failing(dropped, duplicate)
    assert call_with_retry(fn, "_set_trial_param", 5, "postgresql://db/x") is None and len(calls) == 2
    fn, calls = failing(duplicate)
    with pytest.raises(sa.IntegrityError):  # a duplicate on the first attempt is a real error
        call_with_retry(fn, "_set_trial_param", 5, "postgresql://db/x")


@pytest.mark.slow
def test_a_sqlite_file_locked_longer_than_the_retry_ends_in_one_line_and_the_rerun_resumes(tmp_path):
    """Another process holds the SQLite file's exclusive lock while trial 1 runs, longer than
    storage_retry_s=1: the sweep's writes fail as "database is locked", are retried, and the sweep
    ends with exit 1 and one line saying what failed and what to do (no traceback). With the lock
    released, the same command keeps trial 0 and ends with exactly n_trials=2 counted. Over 20 s: two sweeps (the one the
    lock stops after its retries, in its own process; the resume)."""
    import sqlite3

    sweep_dir = tmp_path / "sweep"
    db = sweep_dir / "study.db"
    storage = f"sqlite:///{db}"
    # SQLite's own busy wait (sqlite3's 5 s, a URL query SQLAlchemy passes to connect) made short:
    # each attempt meets the lock in 0.2 s, so the second is spent in the sweep's retries, not in one wait.
    busy = f"'{storage}?timeout=0.2'"
    cmd = sweep_args(sweep_dir, "hydra.sweeper.n_trials=2", f"hydra.sweeper.storage={busy}", *QUICK)
    cmd = [c.replace("storage_retry_s=20", "storage_retry_s=1") for c in cmd]
    proc = start_train(cmd, tmp_path / "first.log")
    holder = None
    try:
        _wait_until_running_after(storage, 1, proc)
        before = _done(storage)
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        code = proc.wait(timeout=300)
    finally:
        if holder is not None:
            holder.execute("ROLLBACK")
            holder.close()
        if proc.poll() is None:
            proc.kill()
    _stopped_in_one_line(tmp_path / "first.log", code, "database is locked")
    assert "retrying for up to 1 s" in (tmp_path / "first.log").read_text()  # met, then retried
    result = train_here(cmd)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    study = load_study(storage)
    assert len(counted(study)) == 2
    assert {n: t.value for n, t in enumerate(study.trials) if n in before} == before


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder on a read-only file system (a tmpfs mounted ro): writing there fails with EROFS, as on a
    read-only volume, whatever the user (root bypasses permission bits, not a read-only mount)."""
    where = tmp_path / "ro"
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.decode().strip()[:100]})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _remount_read_only(where: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)


def test_a_read_only_sweep_dir_or_journal_is_one_line(read_only_dir):
    import optuna

    from grpo_sweep.study.storage import open_storage

    journal = read_only_dir / "held" / "study.journal"
    journal.parent.mkdir()
    optuna.create_study(study_name="tiny_cpu", storage=open_storage(f"journal:{journal}"), direction="maximize")
    _remount_read_only(read_only_dir)
    for cmd in (
        sweep_args(read_only_dir / "new", *QUICK),  # the sweep directory cannot be made
        sweep_args(read_only_dir / "held", *QUICK),  # its journal cannot be appended to
    ):
        result = train_here(cmd)
        out = result.stdout + result.stderr
        assert result.returncode != 0 and "Traceback" not in out, out[-3000:]
        assert "cannot be written (Read-only file system)" in out and "the same command resumes it" in out, out[-3000:]


def test_a_concession_listed_twice_is_refused():
    from hydra_plugins.grpo_optuna_sweeper.concessions import check_list

    with pytest.raises(ValueError) as err:  # SweeperSettingError: one line, before the storage opens
        check_list(["lora_rank", "max_seq_length", "lora_rank"], set())
    assert type(err.value).__name__ == "SweeperSettingError"
    assert str(err.value) == (
        "hydra.sweeper.concessions=['lora_rank', 'max_seq_length', 'lora_rank']: lora_rank listed twice; name each once"
    )


@pytest.mark.slow
def test_a_failed_single_trial_exits_1_and_its_export_needs_force(tmp_path, warm_model):
    """A single run whose trial failed exits 1 (an OOM, a measurement, exits 0). Its directory exports
    only with --force, and then every file says at its top that it is no finished trial; the printed
    `trl grpo --config` path is quoted for the shell. Each export error names its cause."""
    from helpers.runners import FAST, train_here

    run_dir = tmp_path / "a run dir"  # a space: the printed command must quote it
    out = train_here([*FAST, "trial.debug_fault=raise", f"hydra.run.dir={run_dir}"])
    assert out.returncode == 1, out.stdout[-2000:]
    refused = cli("export", str(run_dir))
    assert refused.returncode == 2 and "the trial ended failed (RuntimeError: debug_fault=raise" in refused.stderr
    assert "--force" in refused.stderr
    forced = cli("export", str(run_dir), "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"trl grpo --config '{run_dir}/best.trl.yaml'" in forced.stdout
    for name in ("best.trl.yaml", "best_grpo_config.py"):
        text = (run_dir / name).read_text()
        assert "NOT A FINISHED TRIAL: it ended failed (RuntimeError: debug_fault=raise" in text.split("\n", 3)[0] + text
        assert "trial status: failed" in text
    missing = cli("export", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and f"{tmp_path / 'nowhere'}: no such directory" in missing.stderr


def test_an_atomic_write_that_fails_leaves_the_old_file_whole_and_no_temporary_file(tmp_path, monkeypatch):
    """files.write_atomic: a full disk mid-write keeps the old file as it was and leaves no temporary
    file behind; two writers never share a temporary name, so the last rename wins whole."""
    from grpo_sweep import files

    target = tmp_path / "best.yaml"
    files.write_atomic(target, "old: 1\n")
    real_replace = os.replace

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        files.write_atomic(target, "new: 2\n", durable=True)
    assert target.read_text() == "old: 1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["best.yaml"]
    names = []
    monkeypatch.setattr(os, "replace", lambda src, dst: (names.append(Path(src).name), real_replace(src, dst)))
    files.write_atomic(target, "a: 1\n")
    files.write_atomic(target, b"b: 2\n")
    assert len(set(names)) == 2 and all(n.startswith(".best.yaml.") for n in names)
    assert target.read_text() == "b: 2\n" and sorted(p.name for p in tmp_path.iterdir()) == ["best.yaml"]
