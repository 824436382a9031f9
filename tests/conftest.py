"""Shared helpers: compose the real Hydra config, run train.py as users do; what a test run builds once.

`make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`). What is built once
per test run lives here as a session fixture, and every test that uses one is put in that fixture's
xdist group as it is collected (pytest_itemcollected), so one worker builds it and runs its tests:

- `postgres`: a database of its own for this run on `.ci/run`'s PostgreSQL server (dropped at the
  end). Its group also keeps the one test that stops the server away from the others using it.
- `tiny_sweep`: the finished 6-trial `+sweeps=tiny_cpu` sweep (its two enqueued probes, then its
  frontier start) that test_sweeper.py and test_equal_learning.py read.
- `wandb_sweep`: a finished 4-trial multirun logged to offline W&B (test_wandb.py, test_report.py).
- in-process trials (`IN_PROCESS_TRIALS`, an xdist group, not a fixture): the short tests that run a
  trial in the test process share one worker, hence one trial forkserver.
- `train_here`: `python train.py ARGS` run in the test process, so its trials come from the worker's
  warm forkserver (a sweep that is killed, interrupted or run beside another keeps `run_train`).
- `warm_model`: the warm tiny model every default trial loads; built once per machine anyway
  (its cache and lock: trial/warmup.py). The tests with a short trial.timeout_s take it, so a cold
  cache's warm-up happens before their clocks start, not inside them.

Waiting is set short through settings in the tests (trial.timeout_s, heartbeat_interval,
grace_period, storage_retry_s); the production defaults stay. A test of trial.timeout_s waits for its
trial to reach the hang, not for the clock (`deadline_when`). docs/contributing.md says which suite
to run when.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAST = ["trial.steps=2"]  # the default task: its warm model (model.init=warm) is built once and shared
DEAD_URL = "http://127.0.0.1:9"  # the discard port: connection refused, nothing leaves the host
# W&B with no network anywhere: offline, no API key, no netrc, and a base URL nothing listens on.
OFFLINE_ENV = {"WANDB_MODE": "offline", "WANDB_API_KEY": "", "NETRC": os.devnull, "WANDB_BASE_URL": DEAD_URL}


_COMPOSED: dict[tuple[str, ...], object] = {}


def compose(overrides: list[str] | None = None):
    """The config train.py would see for these overrides (Hydra's compose API, same conf/).

    Composed once per test process and overrides, then copied: Hydra re-reads and re-parses every
    YAML file on each compose (~0.1-0.3 s on 2 cores), and the suite asks for the same few configs
    hundreds of times. A user search path (`hydra.searchpath=...`: files a test may write) is always
    composed afresh; tests that compare against a fresh compose call compose_train_config itself."""
    import copy

    from grpo_sweep.config.compose import compose_train_config

    key = tuple(overrides or ())
    if any("searchpath" in o for o in key):
        return compose_train_config(list(key))
    if key not in _COMPOSED:
        _COMPOSED[key] = compose_train_config(list(key))
    return copy.deepcopy(_COMPOSED[key])


def exit_status(exc: SystemExit) -> int:
    """The exit code the interpreter would give `exc`; a message goes to stderr with code 1, as it would."""
    if isinstance(exc.code, str):
        print(exc.code, file=sys.stderr)
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def run_train(args: list[str], cwd: Path | None = None, timeout: float = 600, env: dict | None = None):
    """`python train.py ARGS` in a subprocess; returns CompletedProcess with text output."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def train_here(args: list[str], cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python train.py ARGS` run inside this test process: train.py's own entry point (Hydra's main,
    the sweeper, run_trial), its console captured at the descriptor level and returned as run_train's
    would be. Each trial is still its own forked process, but every call in this process shares one
    trial forkserver, so a call skips the interpreter start and the ~6 s preload of torch,
    transformers and TRL a `python train.py` pays (docs/contributing.md "Tests").

    What it cannot do, for which a test keeps run_train or its own Popen: be killed or interrupted
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
        sys.argv = [str(ROOT / "train.py"), *args]
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
    return json.loads((Path(run_dir) / "metrics.json").read_text())


@pytest.fixture
def fast_overrides():
    return list(FAST)


# ------------------------------------------------------------------ built once per test run
ONCE_PER_RUN = ("postgres", "tiny_sweep", "wandb_sweep")  # session fixtures whose tests share one xdist worker
# The short tests that run a trial in the test process itself (trial.parent.run_trial): on one worker,
# so one trial forkserver (its ~6 s import of torch, TRL and W&B) serves them all.
IN_PROCESS_TRIALS = pytest.mark.xdist_group("trials")


def pytest_itemcollected(item):
    """A test using a once-per-run fixture runs in that fixture's xdist group (one worker builds it).
    A parametrized storage test (`[postgres]`) joins the postgres group too. Marked as each test is
    collected: xdist reads the groups in its pytest_collection_modifyitems."""
    for name in ONCE_PER_RUN:
        if name in getattr(item, "fixturenames", ()) or f"[{name}]" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group(name))
            break


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Under `--dist loadgroup` a grouped test's id carries its group ("...@postgres") by now; if not,
    the groups are silently ignored (pytest 9.2's node ids: pytest-xdist#1386), and the once-per-run
    fixtures would be built on every worker and the PostgreSQL restart would hit other tests."""
    if getattr(config.option, "loadgroup", False):
        lost = [i.nodeid for i in items if any(i.iter_markers("xdist_group")) and "@" not in i.nodeid]
        if lost:
            raise pytest.UsageError(f"xdist groups ignored by this pytest/pytest-xdist pair (pyproject pins them): {lost[0]}")


@contextlib.contextmanager
def new_database(url: str, prefix: str):
    """A new PostgreSQL database next to `url`'s (created, dropped on exit): its URL. Over connections
    made per use (NullPool), so the drop survives the test that restarts the server. Raises
    sqlalchemy's ProgrammingError when the role may not create databases."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    from grpo_sweep.study.storage import to_url

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(to_url(url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
        try:
            yield url.rsplit("/", 1)[0] + "/" + name
        finally:
            with admin.connect() as conn:
                conn.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    finally:
        admin.dispose()


@pytest.fixture(scope="session")
def postgres():
    """The URL of a PostgreSQL database created for this test run, dropped when it ends.

    The server is `.ci/run`'s (it exports GRPO_SWEEP_TEST_POSTGRES and grants CREATEDB); without the
    variable the test is skipped with the reason. A role that may not create databases gets the
    given database itself (tests use study names of their own)."""
    base = os.environ.get("GRPO_SWEEP_TEST_POSTGRES")
    if not base:
        pytest.skip("GRPO_SWEEP_TEST_POSTGRES is not set (.ci/run installs and starts PostgreSQL and sets it)")
    import sqlalchemy

    try:
        with new_database(base, "grpo_sweep_run") as url:
            yield url
    except sqlalchemy.exc.ProgrammingError as err:  # no CREATEDB: the given database
        if "CREATE DATABASE" not in str(err):
            raise
        yield base


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """(sweep dir, finished train.py run: conftest.train_here) of the CI sweep as users run it: `+sweeps=tiny_cpu`, 6 trials: its
    enqueued probes (batch 1, then 8: an OOM), then its frontier start (4 trials: the room left, so no
    neighbour move), the pre-screen off so the infeasible point hits the wall for real. Tests only
    read it; one that resumes it works on a copy."""
    from test_sweeper_helpers import run_here, sweep_cmd

    root = tmp_path_factory.mktemp("tiny_sweep")
    result = run_here(
        sweep_cmd(
            root,
            "hydra.sweeper.n_trials=6",
            "hydra.sweeper.prescreen=false",
            enqueue=True,
            frontier=True,
            neighbours=True,
            file_space=True,
        )
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root, result


@pytest.fixture(scope="session")
def wandb_sweep(tmp_path_factory) -> tuple[Path, str]:
    """(sweep dir, stdout) of a real 4-trial multirun logged to offline W&B: two LoRA ranks, each
    finishing or hitting an OOM. The trials are the slow part of test_wandb.py and test_report.py,
    which only read it (test_report adds its report.html)."""
    root = tmp_path_factory.mktemp("wandb_sweep")
    result = train_here(
        ["-m", "lora_rank=8,16", "trial.debug_fault=null,oom", *FAST, "logger=wandb", f"hydra.sweep.dir={root}"],
        env=OFFLINE_ENV,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return root, result.stdout


@pytest.fixture(scope="session")
def warm_model() -> Path:
    """The default trial's warm tiny model (model.init=warm): its cached checkpoint directory.

    Built (once per machine: its cache and lock) before the trials that use it start their clocks, so
    a test with a short trial.timeout_s never spends it on a cold cache's warm-up."""
    from grpo_sweep.trial.models import load_tokenizer, model_path
    from grpo_sweep.trial.tasks import get_task

    cfg = compose(FAST)
    return Path(model_path(cfg, load_tokenizer(cfg, get_task(cfg).corpus()), on_cuda=False))


@pytest.fixture
def deadline_when(monkeypatch):
    """`deadline_when(ready, timeout_s)`: the trial's `trial.timeout_s` passes the moment `ready()` is
    true (the trial reached its hang), instead of after `timeout_s` seconds of wall clock.

    The one thing replaced is the clock of the parent's deadline wait (parent.run_trial's
    `proc.join(trial.timeout_s)`); the stop that follows is the real one: the stop request, SIGTERM to
    the group, the grace period, the record. A test of a timeout then waits for a state, not for a
    number of seconds sized for a loaded machine, and can no longer be stopped before its trial got
    where the test needs it. test_trial.py's `hang` case keeps the real clock (8 s)."""
    from multiprocessing.process import BaseProcess

    real_join = BaseProcess.join

    def arm(ready, timeout_s: float, *, at_most_s: float = 600.0) -> None:
        import time

        armed = [True]  # once: the grace period's wait after the stop may be as long (STOP_GRACE_S)

        def join(self, timeout=None):
            if not armed[0] or timeout is None or float(timeout) != float(timeout_s):
                return real_join(self, timeout)  # not the trial's deadline wait
            armed[0] = False
            give_up = time.monotonic() + at_most_s
            while self.is_alive() and not ready() and time.monotonic() < give_up:
                real_join(self, 0.2)
            return None  # the deadline has passed: run_trial stops the trial if it is still alive

        monkeypatch.setattr(BaseProcess, "join", join)

    return arm


# ------------------------------------------------------------------ tests over 20 s say why
OVER_S = 20.0  # a test slower than this says why in its docstring ("Over 20 s: ...")
_UNEXPLAINED: list[str] = []


def _warm_builds() -> dict[str, float]:
    """The warm models in this run's model cache, each with the seconds its warm-up took."""
    from grpo_sweep.trial.models import cache_root
    from grpo_sweep.trial.warmup import INFO_FILE

    out = {}
    for info in (cache_root() / "warm-models").glob(f"*/{INFO_FILE}"):
        try:
            out[info.parent.name] = float(json.loads(info.read_text())["seconds"])
        except (OSError, ValueError, KeyError):
            pass
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """The warm models built while the test body ran: on an empty model cache, the first trial of each
    warm key pays its warm-up, whichever test that is (not the test's own time)."""
    before = _warm_builds()
    yield
    item.user_properties.append(("warm_build_s", sum(s for k, s in _warm_builds().items() if k not in before)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Mark a test whose body ran over OVER_S, less the warm-ups it happened to build, without an
    "Over 20 s" reason in its docstring (the setup of a once-per-run fixture is that fixture's,
    whichever test happens to run first)."""
    outcome = yield
    report = outcome.get_result()
    doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
    built = dict(item.user_properties).get("warm_build_s", 0.0)
    if call.when == "call" and call.duration - built > OVER_S and "Over 20 s" not in doc:
        report.user_properties.append(("over_20s_without_reason", f"{call.duration:.1f} s, {built:.1f} s of it warm-ups"))


def pytest_runtest_logreport(report):
    """Collected where the summary is printed (xdist's controller, or the one process)."""
    for key, value in report.user_properties:
        if key == "over_20s_without_reason":
            _UNEXPLAINED.append(f"{report.nodeid} ({value})")


def pytest_terminal_summary(terminalreporter):
    if _UNEXPLAINED:
        terminalreporter.section("tests over 20 s without a reason in their docstring")
        for line in _UNEXPLAINED:
            terminalreporter.write_line(line)
