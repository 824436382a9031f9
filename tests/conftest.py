"""The fixtures and hooks: what a test run builds once, and the xdist groups that share it.

The helpers the tests import (runners, compose, studies, the sweeper's parts) live in tests/helpers.

`make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`). What is built once
per test run lives here as a session fixture, and every test that uses one is put in that fixture's
xdist group as it is collected (pytest_itemcollected), so one worker builds it and runs its tests:

- `postgres`: a database of its own for this run on `.ci/run`'s PostgreSQL server (dropped at the
  end). Its group also keeps the one test that stops the server away from the others using it.
- `tiny_sweep`: the finished 6-trial `+sweeps=tiny_cpu` sweep (its two enqueued probes, then its
  frontier start) that test_sweeper.py and test_equal_learning.py read.
- `wandb_sweep`: a finished 4-trial multirun logged to offline W&B (test_wandb.py, test_report.py).
- in-process trials (`helpers.runners.IN_PROCESS_TRIALS`, an xdist group, not a fixture): the short
  tests that run a trial in the test process share one worker, hence one trial forkserver
  (`helpers.runners.train_here`).
- `warm_model`: the warm tiny model every default trial loads; built once per machine anyway
  (its cache and lock: trial/warmup.py). The tests with a short trial.timeout_s take it, so a cold
  cache's warm-up happens before their clocks start, not inside them. Under xdist the controller
  starts its build at once (pytest_configure), while the workers start and collect.

Waiting is set short through settings in the tests (trial.timeout_s, heartbeat_interval,
grace_period, storage_retry_s); the production defaults stay. A test of trial.timeout_s waits for its
trial to reach the hang, not for the clock (`deadline_when`). docs/contributing.md says which suite
to run when.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.config import default_warm_model
from helpers.runners import FAST, OFFLINE_ENV, sweep_args, train_here
from helpers.studies import new_database


@pytest.fixture
def fast_overrides():
    return list(FAST)


# ------------------------------------------------------------------ built once per test run
ONCE_PER_RUN = ("postgres", "tiny_sweep", "wandb_sweep")  # session fixtures whose tests share one xdist worker


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
    fixtures would be built on every worker and the PostgreSQL restart would hit other tests. Then the
    tests are put in the order xdist hands them out (`schedule`)."""
    if getattr(config.option, "loadgroup", False):
        lost = [i.nodeid for i in items if any(i.iter_markers("xdist_group")) and "@" not in i.nodeid]
        if lost:
            raise pytest.UsageError(f"xdist groups ignored by this pytest/pytest-xdist pair (pyproject pins them): {lost[0]}")
        items[:] = schedule(items)


EARLY_TESTS = 80  # short tests run while the controller builds the warm model (~20 s of one core)


def schedule(items: list) -> list:
    """The order xdist hands the tests out in (pytest_configure turns its own reordering off):
    EARLY_TESTS short tests that need no warm model, run while the controller builds it; then the
    groups and the slow tests, then the other short ones, so the run ends on short tests and neither
    worker idles while the other finishes a long one."""

    def grouped(item) -> bool:
        return "@" in item.nodeid

    def slow(item) -> bool:
        return item.get_closest_marker("slow") is not None

    free = [i for i in items if not (grouped(i) or slow(i) or "warm_model" in getattr(i, "fixturenames", ()))]
    early = free[:EARLY_TESTS]
    taken = {id(i) for i in early}
    rest = sorted((i for i in items if id(i) not in taken), key=lambda i: (not grouped(i), not slow(i)))
    return early + rest


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
    """(sweep dir, finished train.py run: helpers.runners.train_here) of the CI sweep as users run it: `+sweeps=tiny_cpu`, 6 trials: its
    enqueued probes (batch 1, then 8: an OOM), then its frontier start (4 trials: the room left, so no
    neighbour move), the pre-screen off so the infeasible point hits the wall for real. Tests only
    read it; one that resumes it works on a copy."""
    root = tmp_path_factory.mktemp("tiny_sweep")
    result = train_here(
        sweep_args(
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
    return default_warm_model()


_WARM_BUILD: list[subprocess.Popen] = []


def pytest_configure(config):
    """Under xdist the controller starts building the default warm model at once, in a process of its
    own: it builds while the workers start and collect (~20-30 s on 2 loaded cores), instead of one
    worker's first trial building it while the other worker's first trial waits on its cache lock.
    Whoever needs it before it is done waits on that lock (cache_entry.ensure); a warm cache returns
    at once. A run without xdist builds it where it is first needed, as before. xdist's own reordering
    (the groups first) is turned off: `schedule` runs short tests while the model builds."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        config.option.loadscopereorder = False  # xdist keeps `schedule`'s order (groups not moved first)
        tests = str(Path(__file__).resolve().parent)
        code = f"import sys; sys.path.insert(0, {tests!r}); from helpers.config import default_warm_model; default_warm_model()"
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        _WARM_BUILD.append(subprocess.Popen([sys.executable, "-c", code], **quiet))


def pytest_unconfigure(config):
    """A build the run never waited for is stopped with the run (the next builder removes its partial
    folder: cache_entry.ensure)."""
    for proc in _WARM_BUILD:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()


@pytest.fixture
def deadline_when(monkeypatch):
    """`deadline_when(ready, timeout_s)`: the trial's `trial.timeout_s` passes the moment `ready()` is
    true (the trial reached its hang), instead of after `timeout_s` seconds of wall clock.

    The one thing replaced is the clock of the parent's deadline wait (parent.run_trial's
    `proc.join(trial.timeout_s)`); the stop that follows is the real one: the stop request, SIGTERM to
    the group, the grace period, the record. A test of a timeout then waits for a state, not for a
    number of seconds sized for a loaded machine, and can no longer be stopped before its trial got
    where the test needs it. test_trial.py's `hang` case keeps the real clock (4 s)."""
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
