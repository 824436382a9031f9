"""The storage's crash-safety rules, by hand, in process (grpo_sweep.study.storage, docs/crash-safety.md).

Each test states one rule and checks it on real objects: real Optuna storages (a journal file, a
SQLite file), real SQLAlchemy errors, a real append cut short by the file-size limit, a real lock
file. The retry loop runs on a clock the test moves (its pauses are the rule under test, and waiting
them out would take minutes); nothing here starts a process but a `python -c pass` whose pid is gone.

The sweeps these rules keep alive (a torn journal, a full disk, a PostgreSQL restart) are the slow
tests of tests/test_faults.py.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import sqlalchemy.exc as sa

from grpo_sweep.study import journal as journal_mod
from grpo_sweep.study import retry
from grpo_sweep.study import storage as st

URL = "postgresql://user:s3cret@db/x"


def _raise(*chain: BaseException) -> BaseException:
    """The first error, raised while handling the next (its __context__), and so on: what an except
    block that raises again leaves behind."""
    try:
        try:
            if len(chain) > 1:
                raise _raise(*chain[1:])
            raise chain[0]
        except BaseException:
            if len(chain) > 1:
                raise chain[0]  # noqa: B904 - the implicit context is the point
            raise
    except BaseException as err:
        return err


def _operational(text: str) -> sa.OperationalError:
    return sa.OperationalError("SELECT 1", {}, Exception(text))


# ---------------------------------------------------------------------------------- what passes
@pytest.mark.parametrize("code", retry.TRANSIENT_ERRNOS)
def test_a_file_error_that_passes_is_transient_and_never_landed(code):
    err = OSError(code, os.strerror(code))
    assert retry.transient(err) and retry.the_write_never_landed(err)


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS, errno.ENOENT, errno.EFBIG, None])
def test_other_file_errors_are_raised_at_once(code):
    err = OSError(code, "x") if code is not None else OSError("no errno")
    assert not retry.transient(err) and not retry.the_write_never_landed(err)


def test_which_sql_errors_pass():
    """OperationalError, InterfaceError and DisconnectionError (or a subclass) pass, unless their text
    says the schema or the credentials are wrong; an invalidated connection passes whatever its class;
    a StorageUnavailable anywhere in the chain does not (an inner call's retries already ran out)."""
    assert retry.transient(_operational("server closed the connection unexpectedly"))
    assert retry.transient(sa.InterfaceError("SELECT 1", {}, Exception("connection already closed")))
    assert retry.transient(sa.DisconnectionError("gone"))

    class Sub(sa.OperationalError):  # a driver's subclass: matched by its bases' names
        pass

    assert retry.transient(Sub("SELECT 1", {}, Exception("timeout")))
    for permanent in retry.PERMANENT_SQL:
        assert not retry.transient(_operational(f"... {permanent} ..."))
    assert not retry.transient(sa.IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not retry.transient(ValueError("bad value"))
    invalidated = sa.DBAPIError("SELECT 1", {}, Exception("x"), connection_invalidated=True)
    assert retry.transient(invalidated)
    assert not retry.transient(sa.DBAPIError("SELECT 1", {}, Exception("x")))
    # Found anywhere in the chain; a StorageUnavailable ends the search, also in front of a blip.
    assert retry.transient(_raise(RuntimeError("wrapper"), OSError(errno.ENOSPC, "full")))
    assert not retry.transient(_raise(st.StorageUnavailable("ran out"), OSError(errno.ENOSPC, "full")))
    assert not retry.transient(_raise(RuntimeError("wrapper"), st.StorageUnavailable("ran out"), _operational("x")))


def test_the_chain_is_the_cause_then_the_context_unless_suppressed():
    root = OSError(errno.EIO, "io")
    caused = RuntimeError("caused")
    caused.__cause__ = root
    assert list(retry._chain(caused)) == [caused, root]
    context = _raise(KeyError("outer"), root)
    assert list(retry._chain(context)) == [context, root]
    suppressed = KeyError("from None")
    suppressed.__context__, suppressed.__suppress_context__ = root, True
    assert list(retry._chain(suppressed)) == [suppressed]
    assert not retry.transient(suppressed) and not retry.the_write_never_landed(suppressed)
    both = RuntimeError("both")
    both.__cause__, both.__context__ = root, ValueError("context")
    assert list(retry._chain(both)) == [both, root]  # the cause first: `raise ... from` names it
    assert retry._class_names(sa.OperationalError("s", {}, Exception())) >= {"OperationalError", "DBAPIError", "Exception"}


def test_a_write_never_landed_only_when_it_never_reached_the_database():
    """Each NEVER_SENT text, in any case, anywhere in the chain; a dropped connection may have landed."""
    for needle in retry.NEVER_SENT:
        assert retry.the_write_never_landed(_operational(needle.upper()))
        assert retry.the_write_never_landed(_raise(RuntimeError("wrapper"), _operational(f"x: {needle}")))
    assert not retry.the_write_never_landed(_operational("server closed the connection unexpectedly"))
    assert not retry.the_write_never_landed(_raise(RuntimeError("wrapper"), _operational("SSL SYSCALL error: EOF")))
    assert retry._duplicate(_raise(RuntimeError("wrapper"), sa.IntegrityError("INSERT", {}, Exception("dup"))))
    assert not retry._duplicate(_operational("duplicate key value"))  # the text alone is not a duplicate


# ---------------------------------------------------------------------------------- the retry loop
class Clock:
    """time.monotonic and time.sleep for call_with_retry: a sleep moves the clock, and is recorded."""

    def __init__(self):
        self.now, self.sleeps = 1000.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(st.time, "monotonic", c.monotonic)
    monkeypatch.setattr(st.time, "sleep", c.sleep)
    return c


def _failing(*errors, then="done"):
    calls = []

    def fn(*args, **kwargs):
        calls.append((args, kwargs))
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return then

    return fn, calls


def test_backoff_doubles_from_half_a_second_to_eight_within_the_budget(clock, caplog):
    """0.5 s, doubling, at most 8 s apart, the last pause cut to the budget left; one warning when the
    storage first fails; the call's own arguments each time; its result once it succeeds."""
    blip = OSError(errno.ENOSPC, "No space left on device")
    fn, calls = _failing(*[blip] * 7)
    with caplog.at_level(logging.WARNING, logger=retry.__name__):
        assert retry.call_with_retry(fn, "set_trial_user_attr", 60, URL, 1, key="k") == "done"
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert calls == [((1,), {"key": "k"})] * 8
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "Storage postgresql://user:***@db/x unavailable (set_trial_user_attr: OSError: [Errno 28] No space left on device); "
        "retrying for up to 60 s"
    ]

    clock.sleeps.clear()
    fn, calls = _failing(*[blip] * 100)
    with pytest.raises(st.StorageUnavailable) as err:
        retry.call_with_retry(fn, "set_trial_user_attr", 10, URL)
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 2.5]  # 10 s in all: the last pause is what is left
    assert len(calls) == 6  # one more try at the deadline, then the line
    assert str(err.value) == (
        "storage postgresql://user:***@db/x unavailable for 10 s (hydra.sweeper.storage_retry_s) while calling "
        "set_trial_user_attr: OSError: [Errno 28] No space left on device. Every trial told before this is kept; "
        "when the storage is back (server up, disk freed), re-run the same command to resume"
    )
    assert err.value.__suppress_context__ and err.value.__cause__ is None  # one line, no chained traceback
    assert not retry.transient(err.value)  # an outer retry does not retry it again


def test_a_failure_that_does_not_pass_is_raised_at_once(clock):
    for error in (ValueError("bad"), _operational("no such table: trials"), st.StorageUnavailable("inner ran out")):
        fn, calls = _failing(error)
        with pytest.raises(type(error)) as raised:
            retry.call_with_retry(fn, "get_all_studies", 60, URL)
        assert raised.value is error and len(calls) == 1 and clock.sleeps == []
    assert retry.call_with_retry(lambda: None, "get_all_studies", 0, URL) is None  # no failure: no retry budget needed


def test_a_write_that_may_have_landed_is_told_apart(clock):
    """A trial created again after a dropped commit could exist twice: raised as one line at once.
    A state or parameter write whose earlier attempt landed reads as done; the same error on a first
    attempt, or for another call, is a real error."""
    dropped = _operational("server closed the connection unexpectedly")
    refused = _operational("connection refused")
    for name in retry.ONCE_ONLY:
        clock.sleeps.clear()
        fn, calls = _failing(dropped)
        with pytest.raises(st.StorageUnavailable) as err:
            retry.call_with_retry(fn, name, 60, URL)
        assert len(calls) == 1 and clock.sleeps == []
        assert str(err.value) == (
            "storage postgresql://user:***@db/x dropped the connection while creating a trial (OperationalError: (builtins.Exception) "
            "server closed the connection unexpectedly); it is not tried again, as it may have landed. Every "
            "trial told before this is kept; re-run the same command to resume"
        )
        assert err.value.__suppress_context__ and err.value.__cause__ is None
        fn, calls = _failing(refused)
        assert retry.call_with_retry(fn, name, 60, URL) == "done" and len(calls) == 2 and clock.sleeps == [0.5]
    fn, _ = _failing(dropped)
    assert retry.call_with_retry(fn, "create_new_study", 60, URL) == "done"  # not a trial: retried

    finished = optuna.exceptions.UpdateFinishedTrialError("already finished")
    fn, calls = _failing(dropped, finished)
    assert retry.call_with_retry(fn, "set_trial_state_values", 60, URL) is True and len(calls) == 2
    for first_attempt, name in (([finished], "set_trial_state_values"), ([dropped, finished], "set_trial_user_attr")):
        fn, _ = _failing(*first_attempt)
        with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
            retry.call_with_retry(fn, name, 60, URL)

    duplicate = sa.IntegrityError("INSERT", {}, Exception("duplicate key value violates unique constraint"))
    fn, calls = _failing(dropped, duplicate)
    assert retry.call_with_retry(fn, "_set_trial_param", 60, URL) is None and len(calls) == 2
    for first_attempt, name in (([duplicate], "_set_trial_param"), ([dropped, duplicate], "set_trial_param")):
        fn, _ = _failing(*first_attempt)
        with pytest.raises(sa.IntegrityError):
            retry.call_with_retry(fn, name, 60, URL)


# ---------------------------------------------------------------------------------- retrying storages
def test_every_public_call_and_the_cached_storages_private_ones_are_retried_but_the_heartbeat():
    public = {n for n in dir(optuna.storages.BaseStorage) if not n.startswith("_")}
    assert set(retry.RETRIED_CALLS) == (public | set(retry.CACHED_STORAGE_CALLS)) - {"record_heartbeat"}
    assert list(retry.RETRIED_CALLS) == sorted(retry.RETRIED_CALLS)
    for cls, base in (
        (retry.RetryingRDBStorage, optuna.storages.RDBStorage),
        (retry.RetryingJournalStorage, optuna.storages.JournalStorage),
    ):
        for name in retry.RETRIED_CALLS:
            if callable(getattr(base, name, None)):
                method = getattr(cls, name)
                assert method is not getattr(base, name) and method.__name__ == method.__qualname__ == name
    assert retry.RetryingRDBStorage.record_heartbeat is optuna.storages.RDBStorage.record_heartbeat  # never retried


def test_a_retrying_journal_storage_waits_out_a_full_disk_on_a_real_journal(tmp_path, clock, caplog):
    """A real JournalStorage whose first append meets a full disk: retried (the failed append was cut
    back), the study created once; the storage keeps its retry budget and names its source."""
    path = tmp_path / "study.journal"
    storage = st.open_storage(f"journal:{path}", retry_s=30)
    assert isinstance(storage, retry.RetryingJournalStorage) and (storage.retry_s, storage.source) == (30, f"journal:{path}")
    backend = storage._backend
    real, failures = backend.append_logs, [OSError(errno.ENOSPC, "No space left on device")]

    def append_logs(logs):
        if failures:
            raise failures.pop()
        real(logs)

    backend.append_logs = append_logs
    with caplog.at_level(logging.WARNING, logger=retry.__name__):
        study = optuna.create_study(storage=storage, study_name="s")
    assert clock.sleeps == [0.5] and "unavailable (create_new_study: OSError: [Errno 28]" in caplog.text
    assert [s.study_name for s in optuna.get_all_study_summaries(st.open_storage(f"journal:{path}"))] == ["s"]
    study.set_user_attr("a", 1)
    assert optuna.load_study(study_name="s", storage=st.open_storage(f"journal:{path}")).user_attrs == {"a": 1}
    assert type(st.open_storage(f"journal:{path}")) is optuna.storages.JournalStorage  # no retry_s: Optuna's own
    assert type(st.open_storage(f"journal:{path}", retry_s=0)) is optuna.storages.JournalStorage


def test_without_retry_is_the_storages_own_call(tmp_path):
    """The heartbeat's call: the storage's own method, past the retry and past Optuna's cache."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    retrying = st.open_storage(url, retry_s=5)
    assert isinstance(retrying, retry.RetryingRDBStorage) and retrying.retry_s == 5
    study = optuna.create_study(storage=retrying, study_name="s")
    cached = study._storage
    for storage in (retrying, cached):
        own = retry.without_retry(storage, "get_all_studies")
        assert own.__func__ is optuna.storages.RDBStorage.get_all_studies and own.__self__ is retrying
    plain = st.open_storage(url)
    assert type(plain) is optuna.storages.RDBStorage
    assert retry.without_retry(plain, "get_all_studies").__func__ is optuna.storages.RDBStorage.get_all_studies
    journal = st.open_storage(f"journal:{tmp_path / 'j.journal'}")
    assert retry.without_retry(journal, "get_all_studies").__self__ is journal


def test_a_missing_file_is_an_error_for_a_reader(tmp_path):
    with pytest.raises(st.StorageError) as err:
        st.open_storage(f"journal:{tmp_path / 'no.journal'}", create=False)
    assert str(err.value) == f"storage 'journal:{tmp_path / 'no.journal'}': no such journal file"
    with pytest.raises(st.StorageError) as err:
        st.open_storage(f"sqlite:///{tmp_path / 'no.db'}", create=False)
    assert str(err.value) == f"storage 'sqlite:///{tmp_path / 'no.db'}': no such SQLite file"
    assert not list(tmp_path.iterdir())


def test_opening_a_torn_journal_repairs_it_first(tmp_path):
    path = tmp_path / "study.journal"
    optuna.create_study(storage=st.open_storage(f"journal:{path}"), study_name="s")
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"op_code": 4, "wor')
    assert optuna.load_study(study_name="s", storage=st.open_storage(f"journal:{path}", create=False)).study_name == "s"
    assert path.read_bytes() == whole and len(list(tmp_path.glob("study.journal.torn-*.bak"))) == 1


# ---------------------------------------------------------------------------------- journal files
def test_records_and_what_is_salvaged_behind_a_tear():
    assert journal_mod._record(b'{"op_code": 1}\n') and journal_mod._record(b'{"op_code": 1}')
    assert (
        not journal_mod._record(b'{"worker_id": "w"}\n')
        and not journal_mod._record(b"[1]\n")
        and not journal_mod._record(b"{bad\n")
    )
    whole = b'{"op_code": 1, "x": "y"}\n'
    assert journal_mod._salvage(b'{"op_code": 4, "wor' + whole) == whole
    assert journal_mod._salvage(whole) is None  # a record starting the line is not behind a tear
    assert journal_mod._salvage(b'{"op_code": 4, "wor' + whole.rstrip(b"\n")) is None  # still torn: no newline
    # The first start that reads as a record, past starts that do not.
    assert journal_mod._salvage(b'xx{"op_code": 4, "a{"op_code": 2}\n') == b'{"op_code": 2}\n'
    assert journal_mod._salvage(b'xx{"op_code": 4, "a{"op_code": \n') is None
    assert journal_mod._salvage(b'x{"op_code": 3}{"op_code": 2}\n') == b'{"op_code": 2}\n'  # one record, not two


def test_a_repair_run_twice_in_one_second_keeps_both_originals(tmp_path, monkeypatch):
    import datetime

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=tz)

    monkeypatch.setattr(journal_mod.datetime, "datetime", Frozen)
    path = tmp_path / "study.journal"
    a = b'{"op_code": 0}\n'
    originals = [a + b"torn one", a + b"torn two", a + b"torn three"]
    for original in originals:
        path.write_bytes(original)
        journal_mod.repair_journal(path)
        assert path.read_bytes() == a
    names = [
        "study.journal.torn-20300102T030405.bak",
        "study.journal.torn-20300102T030405-2.bak",
        "study.journal.torn-20300102T030405-3.bak",
    ]
    assert [(tmp_path / n).read_bytes() for n in names] == originals
    assert not (tmp_path / "study.journal.repair.tmp").exists()


def test_a_repair_holds_the_journals_lock(tmp_path, monkeypatch):
    """No worker appends while the journal is rewritten: the repair takes the same lock file, and
    leaves it free."""
    path = tmp_path / "study.journal"
    path.write_bytes(b'{"op_code": 0}\ntorn')
    seen = []
    real = Path.read_bytes

    def read_bytes(self):
        seen.append(Path(f"{path}.lock").exists())
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    journal_mod.repair_journal(path)
    monkeypatch.undo()
    assert seen[0] is True and not Path(f"{path}.lock").exists()


def test_an_append_is_whole_compact_records_and_a_failed_one_is_cut_back(tmp_path):
    """SafeJournalFileBackend writes each log as one compact JSON line. A write the file system
    refuses part-way (here the file-size limit, as a full disk would) is cut back to the last whole
    record before the error is raised: the journal still reads, and the next append lands whole."""
    path = tmp_path / "study.journal"
    backend = journal_mod.SafeJournalFileBackend(str(path), lock_obj=journal_mod.OwnedJournalFileLock(str(path)))
    backend.append_logs([{"op_code": 0, "a": 1}, {"op_code": 1, "b": [1, 2]}])
    assert path.read_bytes() == b'{"op_code":0,"a":1}\n{"op_code":1,"b":[1,2]}\n'
    before = path.read_bytes()
    big = {"op_code": 5, "pad": "x" * 10_000}
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a signal
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 4096, hard))
    try:
        with pytest.raises(OSError) as err:
            backend.append_logs([big])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert err.value.errno == errno.EFBIG
    assert path.read_bytes() == before  # the part that was written is gone
    backend.append_logs([{"op_code": 2}])
    assert [json.loads(line) for line in path.read_bytes().splitlines()] == [
        {"op_code": 0, "a": 1},
        {"op_code": 1, "b": [1, 2]},
        {"op_code": 2},
    ]
    assert [log["op_code"] for log in backend.read_logs(0)] == [0, 1, 2]
    assert not Path(f"{path}.lock").exists()


# ---------------------------------------------------------------------------------- the journal's lock
def _gone_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def test_a_pid_is_alive_unless_no_process_has_it(monkeypatch):
    assert journal_mod._pid_alive(os.getpid())
    assert not journal_mod._pid_alive(_gone_pid())

    def someone_elses(pid, sig):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "kill", someone_elses)  # a process of another user: kill(pid, 0) is refused
    assert journal_mod._pid_alive(12345)


def test_the_lock_names_its_holder_and_a_gone_holders_lock_is_released(tmp_path, caplog):
    journal = tmp_path / "study.journal"
    lock_file = Path(f"{journal}.lock")
    lock = journal_mod.OwnedJournalFileLock(str(journal))
    assert lock.acquire() is True
    assert lock_file.read_text() == f"{socket.gethostname()} {os.getpid()}"
    lock.release()
    assert not lock_file.exists()
    lock._release_if_holder_gone()  # free: nothing to do
    host = socket.gethostname()
    gone = _gone_pid()
    for kept in (f"{host} {os.getpid()}", f"{host} x{gone}", f"{host}-other {gone}", f"{host}{gone}", f"{host} "):
        lock_file.write_text(kept)
        lock._release_if_holder_gone()
        assert lock_file.read_text() == kept
    lock_file.write_text(f"{host} {gone}")
    with caplog.at_level(logging.WARNING, logger=journal_mod.__name__):
        lock._release_if_holder_gone()
    assert not lock_file.exists() and not list(tmp_path.glob("*.gone"))
    assert caplog.messages == [f"Journal lock {lock_file} was held by process {gone} of this host, which is gone: released"]


def test_asking_whether_a_process_lives_sends_it_no_signal():
    """kill(pid, 0) only checks: a live process asked about keeps running (with default handlers,
    any real signal would end it)."""
    code = (
        "import signal, sys, time\n"
        "for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM): signal.signal(s, signal.SIG_DFL)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"  # its handlers are the defaults from here on
        for _ in range(3):
            assert journal_mod._pid_alive(child.pid)
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.3)
    finally:
        child.kill()
        child.wait()


def test_a_repair_says_so_in_the_log(tmp_path, caplog):
    path = tmp_path / "study.journal"
    path.write_bytes(b'{"op_code": 0}\ntorn')
    with caplog.at_level(logging.WARNING, logger=journal_mod.__name__):
        message = journal_mod.repair_journal(path)
    assert caplog.messages == [message] and message.startswith(f"Journal {path} repaired: dropped 4 torn bytes")


def test_the_password_is_read_after_the_first_scheme_separator():
    """A URL whose query holds another URL: the password is the one before the host, and masked."""
    source = "postgresql://user:pw@host/db?target_session_attrs=any&redirect=http://proxy"
    assert retry.first_line(OSError("login pw refused"), source) == "OSError: login *** refused"


def test_any_storage_class_behind_the_mixin_has_every_call_retried(clock):
    """The mixin placed before a storage class (here Optuna's in-memory storage, whose
    get_all_studies fails once with a full disk) wraps each of its RETRIED_CALLS in call_with_retry
    under the call's own name, and leaves the heartbeat alone."""

    class Flaky(optuna.storages.InMemoryStorage):
        def __init__(self):
            super().__init__()
            self.failures = [OSError(errno.ENOSPC, "No space left on device")]

        def get_all_studies(self):
            if self.failures:
                raise self.failures.pop()
            return super().get_all_studies()

    class RetryingFlaky(retry._RetriesEveryCall, Flaky):
        pass

    storage = RetryingFlaky(retry_s=5, source="memory")
    assert (storage.retry_s, storage.source) == (5, "memory")
    assert storage.get_all_studies() == [] and clock.sleeps == [0.5]
    for name in retry.RETRIED_CALLS:
        if callable(getattr(Flaky, name, None)):
            assert getattr(RetryingFlaky, name).__name__ == getattr(RetryingFlaky, name).__qualname__ == name
    assert "record_heartbeat" not in RetryingFlaky.__dict__
    study = optuna.create_study(storage=storage, study_name="s")
    study.set_user_attr("a", 1)
    assert storage.get_study_user_attrs(study._study_id) == {"a": 1}
    assert retry.without_retry(storage, "get_all_studies").__func__ is Flaky.get_all_studies


# ---------------------------------------------------------------------------------- opening a storage
def test_a_missing_folder_is_an_error_that_says_why(tmp_path):
    source = str(tmp_path / "typo" / "sweep.db")
    with pytest.raises(st.StorageError) as caught:
        st.open_storage(source)
    assert str(caught.value) == (
        f"storage {source}: folder {tmp_path / 'typo'} does not exist; create it first, or correct the path "
        "(a typo in a resume path would otherwise start a new, empty study)"
    )
    assert not (tmp_path / "typo").exists()


def test_a_missing_database_driver_and_a_refused_connection_are_one_line_each():
    """No MySQL driver is installed: the line names the source (password masked) and the fix. Nothing
    listens on port 1: the line names the source and the root cause, never the password."""
    with pytest.raises(st.StorageError) as caught:
        st.open_storage("mysql://u:s3cret@localhost/x")
    text = str(caught.value)
    assert text.startswith("storage mysql://u:***@localhost/x: its database driver is not installed (")
    assert text.endswith("); for PostgreSQL: pip install 'grpo-sweep[postgres]'") and "s3cret" not in text
    with pytest.raises(st.StorageError) as caught:
        st.open_storage("postgresql://u:s3cret@127.0.0.1:1/x")
    text = str(caught.value)
    assert text.startswith("storage postgresql://u:***@127.0.0.1:1/x: cannot connect: OperationalError: ")
    assert "Connection refused" in text and "s3cret" not in text and "\n" not in text


def test_a_retrying_storage_names_the_source_as_the_user_gave_it(tmp_path):
    """Its messages name the storage as the user named it (a path, not the URL made of it)."""
    for source in (str(tmp_path / "sweep.db"), str(tmp_path / "sweep.journal")):
        storage = st.open_storage(source, retry_s=5)
        assert isinstance(storage, (retry.RetryingRDBStorage, retry.RetryingJournalStorage)) and storage.source == source
