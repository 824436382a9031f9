"""The one way to open an Optuna storage, for the sweeper and the report alike.

Accepted sources (the sweeper's `hydra.sweeper.storage`, the report's argument):
- `journal:PATH`, or a path ending in `.journal` / `.log`: a JournalStorage file (the default; no
  server). Opened with an `open(O_EXCL)` lock file, which works on NFS where flock may not;
- `sqlite:///PATH`, or a path ending in `.db` / `.sqlite` / `.sqlite3`: SQLite;
- any other SQLAlchemy URL: `postgresql://user:pw@host/db` (mapped to the PostgreSQL driver that is
  installed: SQLAlchemy 2 assumes psycopg 3, we ship psycopg2), `mysql://...`.
RDB storages get Optuna's heartbeat when the caller asks for one (the sweeper does; a reader does not).
Passwords never appear in what this module raises or returns for display (`credentials.mask_url`).

Crash safety (docs/crash-safety.md):
- a journal whose last record was cut short (a crash or a full disk mid-append) is repaired when it
  is opened: a timestamped backup is kept, only the torn tail is dropped, one line says so
  (`repair_journal`). Appends themselves never leave a torn tail behind a failed write: a write that
  fails (ENOSPC, EIO) is cut back to the last whole record before the error is raised
  (`SafeJournalFileBackend`); a lock left by a sweep of this host that was killed holding it is
  released at once, not after Optuna's 30 s grace period (`OwnedJournalFileLock`);
- the sweeper's storage retries every call that fails for a reason that passes (the database
  restarting or away, a full disk, a locked SQLite file) with a bounded backoff
  (`retry_s`, hydra.sweeper.storage_retry_s), then raises `StorageUnavailable`: one line saying what
  failed, where, and what to do.
"""

from __future__ import annotations

import datetime
import errno
import importlib.util
import json
import logging
import os
import random
import shutil
import socket
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.storages._cached_storage import _CachedStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.storages.journal._file import get_lock_file

from ..credentials import mask_url

JOURNAL_SUFFIXES = (".journal", ".log")
# The sweeper's default storage: this file in the sweep directory (hydra.sweeper.storage unset).
SWEEP_JOURNAL = "study.journal"
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


log = logging.getLogger(__name__)


class StorageError(ValueError):
    """A storage source that cannot be opened; the message names it (masked) and what is accepted."""


class StorageUnavailable(StorageError):
    """The storage stayed away longer than the retry budget; the message is the one line to show."""


def is_journal(source: str) -> bool:
    return source.startswith("journal:") or ("://" not in source and source.endswith(JOURNAL_SUFFIXES))


def journal_path(source: str) -> Path:
    return Path(source.removeprefix("journal:"))


def to_url(source: str) -> str:
    """A storage source as the URL Optuna/SQLAlchemy takes (journal sources are returned as given)."""
    if is_journal(source):
        return source
    if "://" not in source:
        path = Path(source)
        if path.suffix in SQLITE_SUFFIXES:
            return f"sqlite:///{path.resolve()}"
        raise StorageError(
            f"storage {source!r}: not a storage URL and not a .journal/.log/.db/.sqlite file "
            "(use journal:PATH, sqlite:///PATH or postgresql://user:password@host/db)"
        )
    if source.startswith(("postgresql://", "postgres://")):
        # SQLAlchemy 2 maps the bare scheme to psycopg (3); use psycopg2 when that is what is installed.
        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + source.split("://", 1)[1]
    return source


def open_storage(
    source: str,
    *,
    create: bool = True,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
    stale_trial_callback: Callable[[Any, Any], None] | None = None,
    retry_s: float | None = None,
    may_create_dir: Path | None = None,
) -> Any:
    """An Optuna storage for `source`. `create=False` (readers): a file that does not exist is an
    error instead of a new empty study. The heartbeat arguments apply to RDB storages.

    retry_s: retry a call that fails for a passing reason for up to this many seconds (None: never).
    may_create_dir: the one folder this call may create for a file storage (the sweep directory);
    any other missing parent folder is an error (a typo in a resume path must not start a new study)."""
    if is_journal(source):
        path = journal_path(source)
        if not create and not path.exists():
            raise StorageError(f"storage {source!r}: no such journal file")
        _check_parent(source, path, may_create_dir)
        if path.exists():
            repair_journal(path)
        backend = SafeJournalFileBackend(str(path), lock_obj=OwnedJournalFileLock(str(path)))
        if not retry_s:
            return optuna.storages.JournalStorage(backend)
        return RetryingJournalStorage(backend, retry_s=retry_s, source=source)
    url = to_url(source)
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        if not create and not path.exists():
            raise StorageError(f"storage {source!r}: no such SQLite file")
        _check_parent(source, path, may_create_dir)
    for attempt in range(CREATE_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                warnings.simplefilter("ignore", FutureWarning)
                options: dict[str, Any] = {
                    "engine_kwargs": None if url.startswith("sqlite") else {"pool_pre_ping": True},
                    "heartbeat_interval": heartbeat_interval,
                    "grace_period": grace_period,
                    "heartbeat_stale_trial_callback": stale_trial_callback,
                }
                if not retry_s:
                    return optuna.storages.RDBStorage(url, **options)
                return RetryingRDBStorage(url, retry_s=retry_s, source=source, **options)
        except ImportError as err:
            raise StorageError(
                f"storage {mask_url(source)}: its database driver is not installed ({err}); "
                "for PostgreSQL: pip install 'grpo-sweep[postgres]'"
            ) from None
        except Exception as err:  # noqa: BLE001 - only a lost schema-creation race is retried
            if attempt + 1 == CREATE_ATTEMPTS or not _lost_create_race(err):
                if transient(err) or "password authentication failed" in str(err):
                    raise StorageError(f"storage {mask_url(source)}: cannot connect: {_first_line(err, source)}") from None
                raise
            # Several workers started together on a fresh database all run Optuna's CREATE TABLE /
            # CREATE TYPE; all but one fail with a unique violation. The schema exists now: retry.
            time.sleep(0.2 * (attempt + 1) + random.random() * 0.3)
    raise AssertionError("unreachable")


CREATE_ATTEMPTS = 5


def _lost_create_race(err: BaseException) -> bool:
    text = f"{type(err).__name__}: {err}"
    return any(needle in text for needle in ("UniqueViolation", "already exists", "duplicate key value", "IntegrityError"))


def study_names(storage: Any) -> list[str]:
    return [s.study_name for s in optuna.get_all_study_summaries(storage)]


def load_study(source: str, study_name: str | None = None) -> Any:
    """An existing study, by name, or the only one in the storage (a reader's entry point)."""
    storage = open_storage(source, create=False)
    names = study_names(storage)
    if study_name is None:
        if len(names) != 1:
            raise StorageError(f"--study is required; studies in {mask_url(source)}: {names or 'none'}")
        study_name = names[0]
    if study_name not in names:
        raise StorageError(f"--study={study_name!r} not found; studies in {mask_url(source)}: {names}")
    return optuna.load_study(study_name=study_name, storage=storage)


def _first_line(err: BaseException, source: str) -> str:
    """The root cause's first line, with the storage's password masked."""
    while (cause := err.__cause__ or err.__context__) is not None:
        err = cause
    text = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    password = source.split("://", 1)[-1].split("@", 1)[0].partition(":")[2] if "@" in source else ""
    if password:
        text = text.replace(password, "***")
    return f"{type(err).__name__}: {text}"[:400]


def _check_parent(source: str, path: Path, may_create_dir: Path | None) -> None:
    parent = path.absolute().parent
    if parent.is_dir():
        return
    if may_create_dir is not None and parent == Path(may_create_dir).absolute():
        parent.mkdir(parents=True, exist_ok=True)
        return
    raise StorageError(
        f"storage {mask_url(source)}: folder {parent} does not exist; create it first, or correct the path "
        "(a typo in a resume path would otherwise start a new, empty study)"
    )


# ------------------------------------------------------------------------------------ journal repair
def repair_journal(path: Path) -> str | None:
    """Repair a journal whose records were cut short; return the line printed, or None when intact.

    A record cut short is a last line without its newline (a crash or a full disk mid-append), or,
    once someone appended after it, a line that is not JSON. Torn bytes are dropped; where a whole
    record was appended right after a torn one (Optuna appends without repairing), that record is
    kept. The original is kept beside it as `<name>.torn-<UTC time>.bak`. Done under the journal's
    own lock file, so no worker appends meanwhile; dropping only the tail leaves what other workers
    already read where it was."""
    with get_lock_file(OwnedJournalFileLock(str(path))):
        data = path.read_bytes()
        kept, dropped, salvaged = [], 0, 0
        lines = data.splitlines(keepends=True)
        for line in lines:
            if line.endswith(b"\n") and _record(line):
                kept.append(line)
                continue
            rescued = _salvage(line)
            if rescued is not None:
                kept.append(rescued)
                salvaged += 1
                dropped += len(line) - len(rescued)
            else:
                dropped += len(line)
        if not dropped:
            return None
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
        backup = path.with_name(f"{path.name}.torn-{stamp}.bak")
        n = 1
        while backup.exists():
            n += 1
            backup = path.with_name(f"{path.name}.torn-{stamp}-{n}.bak")
        shutil.copy2(path, backup)
        tmp = path.with_name(path.name + ".repair.tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    message = (
        f"Journal {path} repaired: dropped {dropped} torn bytes (a write cut short by a crash or a full disk), "
        f"kept {len(kept)} records{f' ({salvaged} recovered from behind the tear)' if salvaged else ''}; "
        f"the original is in {backup}"
    )
    log.warning("%s", message)
    return message


def _record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict) and "op_code" in json.loads(line)
    except ValueError:
        return False


def _salvage(line: bytes) -> bytes | None:
    """The whole record appended right after a torn one on the same line, or None."""
    if not line.endswith(b"\n"):
        return None
    start = line.find(b'{"op_code"', 1)
    while start != -1:
        if _record(line[start:]):
            return line[start:]
        start = line.find(b'{"op_code"', start + 1)
    return None


class SafeJournalFileBackend(JournalFileBackend):
    """Optuna's file backend whose append never leaves half a record behind: a write that fails (a
    full disk, an I/O error) is cut back to where it started before the error is raised, so a retry
    (or the next run) appends onto whole records.

    Arguments as Optuna's `JournalFileBackend`: file_path, the journal file; lock_obj, its lock
    (`OwnedJournalFileLock` here)."""

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        with get_lock_file(self._lock):
            data = ("\n".join(json.dumps(entry, separators=(",", ":")) for entry in logs) + "\n").encode("utf-8")
            # Unbuffered: a buffered file would flush its leftover bytes again when closed.
            fd = os.open(self._file_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                start = os.lseek(fd, 0, os.SEEK_END)
                try:
                    done = 0
                    while done < len(data):
                        done += os.write(fd, data[done:])
                    os.fsync(fd)
                except OSError:
                    try:
                        os.ftruncate(fd, start)  # freeing bytes works on a full disk too
                    except OSError:
                        pass  # repaired when the journal is next opened (repair_journal)
                    raise
            finally:
                os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


class OwnedJournalFileLock(JournalFileOpenLock):
    """The journal's lock: Optuna's `open(O_EXCL)` lock file (NFS-safe), which also says who holds it.

    A sweep killed while it held the lock (SIGKILL, the OOM killer, mid-append) leaves the lock file
    behind, and Optuna's lock waits out its 30 s grace period before it takes the lock anyway: the
    resume stalled for 30 s. This lock writes `host pid` into the file it creates; a lock whose
    holder ran on this host and is gone is released at once, with a warning. A holder on another host,
    or one whose line is not written yet, keeps Optuna's grace period.

    Arguments as Optuna's `JournalFileOpenLock`: filepath, the journal file (the lock file is
    `<filepath>.lock`); grace_period, the seconds after which a lock whose holder is unknown is taken."""

    def acquire(self) -> bool:
        self._release_if_holder_gone()
        super().acquire()
        try:
            with open(self._lock_file, "w") as owner:
                owner.write(f"{socket.gethostname()} {os.getpid()}")
        except OSError:  # a full disk: the lock holds without its line (the grace period applies)
            pass
        return True

    def _release_if_holder_gone(self) -> None:
        try:
            held_by = Path(self._lock_file).read_text()
        except OSError:
            return  # free
        host, _, pid = held_by.partition(" ")
        if host != socket.gethostname() or not pid.isdigit() or _pid_alive(int(pid)):
            return
        taken = f"{self._lock_file}.{uuid.uuid4().hex}.gone"
        try:
            os.rename(self._lock_file, taken)  # atomic: one process takes it
        except OSError:
            return  # released or taken meanwhile
        try:
            if Path(taken).read_text() != held_by:  # a live holder's lock, taken since we read: give it back
                os.link(taken, self._lock_file)
                return
            log.warning("Journal lock %s was held by process %s of this host, which is gone: released", self._lock_file, pid)
        except OSError:
            pass
        finally:
            os.unlink(taken)


# ------------------------------------------------------------------------------------ retries
# A call fails for a passing reason: the database restarts or is away, the disk is full (someone can
# free it), a SQLite file is locked by another writer. Anything else is a bug or bad data: raised at once.
TRANSIENT_ERRNOS = (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EAGAIN, errno.ESTALE, errno.EBUSY)
TRANSIENT_SQL = ("OperationalError", "InterfaceError", "DisconnectionError")
PERMANENT_SQL = ("no such table", "syntax error", "password authentication failed", "does not exist")
NOT_RETRIED = ("record_heartbeat",)  # a missed beat is harmless; the heartbeat thread never blocks
# Optuna wraps every RDBStorage in its _CachedStorage, which reads and writes through these private
# methods of the storage, not through the public ones (tests/test_faults.py checks this list against
# optuna/storages/_cached_storage.py): they are retried like the public calls. `_get_stale_trial_ids`
# is also what fail_stale_trials reads.
CACHED_STORAGE_CALLS = ("_create_new_trial", "_get_best_trial_id", "_get_stale_trial_ids", "_get_trials", "_set_trial_param")
# Writes that cannot be told apart from a second copy once they landed: retried only when the failed
# attempt cannot have landed (the_write_never_landed). Another try of a created trial whose commit
# landed before its connection dropped would leave a RUNNING trial nobody runs, waited for forever.
ONCE_ONLY = ("create_new_trial", "_create_new_trial")
# A failed attempt that never reached the database: the connection could not be made (or was refused
# while the server stops or starts), or SQLite could not take its lock (SQLite commits or rolls back
# locally: a failed commit did not land).
NEVER_SENT = (
    "could not connect",
    "connection refused",
    "the database system is shutting down",
    "the database system is starting up",
    "database is locked",
)  # compared lower-case


def transient(err: BaseException) -> bool:
    """Whether `err` (or what caused it) is a failure that passes: see TRANSIENT_ERRNOS / TRANSIENT_SQL."""
    for seen in _chain(err):
        if isinstance(seen, StorageUnavailable):
            return False  # an inner call's retries already ran out
        if _file_blip(seen):
            return True
        if getattr(seen, "connection_invalidated", False) or (
            _class_names(seen) & set(TRANSIENT_SQL) and not any(s in str(seen) for s in PERMANENT_SQL)
        ):
            return True
    return False


def _file_blip(err: BaseException) -> bool:
    """A file storage's failure that passes (TRANSIENT_ERRNOS); its failed append was cut back."""
    return isinstance(err, OSError) and err.errno in TRANSIENT_ERRNOS


def _class_names(err: BaseException) -> set[str]:
    """The names of `err`'s class and its bases: SQLAlchemy's errors, matched without importing it."""
    return {c.__name__ for c in type(err).__mro__}


def _chain(err: BaseException) -> Iterator[BaseException]:
    """`err` and what caused it, outermost first."""
    seen: BaseException | None = err
    while seen is not None:
        yield seen
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)


def call_with_retry(fn: Callable[..., Any], name: str, retry_s: float, source: str, *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs), retried with exponential backoff (0.5 s doubling, at most 8 s apart)
    while it fails for a passing reason, for up to `retry_s` seconds; then StorageUnavailable."""
    deadline, delay, failed = time.monotonic() + retry_s, 0.5, None
    while True:
        try:
            return fn(*args, **kwargs)
        except optuna.exceptions.UpdateFinishedTrialError:
            if failed is not None and name == "set_trial_state_values":
                return True  # the failed attempt's commit landed before its connection dropped
            raise
        except Exception as err:  # noqa: BLE001 - only passing failures are retried (transient)
            if failed is not None and name == "_set_trial_param" and _duplicate(err):
                return None  # the failed attempt's commit landed: the parameter is set
            if not transient(err):
                raise
            if name in ONCE_ONLY and not the_write_never_landed(err):
                raise StorageUnavailable(
                    f"storage {mask_url(source)} dropped the connection while creating a trial "
                    f"({_first_line(err, source)}); it is not tried again, as it may have landed. Every trial "
                    "told before this is kept; re-run the same command to resume"
                ) from None
            if failed is None:
                log.warning(
                    "Storage %s unavailable (%s: %s); retrying for up to %.0f s",
                    mask_url(source),
                    name,
                    _first_line(err, source),
                    retry_s,
                )
            failed = err
            left = deadline - time.monotonic()
            if left <= 0:
                raise StorageUnavailable(
                    f"storage {mask_url(source)} unavailable for {retry_s:.0f} s (hydra.sweeper.storage_retry_s) "
                    f"while calling {name}: {_first_line(err, source)}. Every trial told before this is kept; "
                    "when the storage is back (server up, disk freed), re-run the same command to resume"
                ) from None
            time.sleep(min(delay, left))
            delay = min(delay * 2, 8.0)


def the_write_never_landed(err: BaseException) -> bool:
    """Whether a failed write certainly did not reach the database (NEVER_SENT), so that another try
    cannot make a second copy of it."""
    if any(_file_blip(e) for e in _chain(err)):
        return True  # a file storage: its failed append was cut back (SafeJournalFileBackend)
    return any(needle in str(e).lower() for e in _chain(err) for needle in NEVER_SENT)


def _duplicate(err: BaseException) -> bool:
    return any("IntegrityError" in _class_names(e) for e in _chain(err))


# Every public call of a storage and the private ones _CachedStorage makes, less NOT_RETRIED.
_PUBLIC_CALLS = {n for n in dir(optuna.storages.BaseStorage) if not n.startswith("_")}
RETRIED_CALLS = tuple(sorted((_PUBLIC_CALLS | set(CACHED_STORAGE_CALLS)) - set(NOT_RETRIED)))


class _RetriesEveryCall:
    """A mixin placed before an Optuna storage class: every call in RETRIED_CALLS that the storage
    has goes through `call_with_retry`; the storage's own method is the next one in the MRO
    (`super(_RetriesEveryCall, self)`), which is also what `without_retry` calls.

    retry_s: how long a call is retried for a passing reason (hydra.sweeper.storage_retry_s);
    source: the storage as the user named it, for the messages (masked there)."""

    retry_s: float
    source: str

    def __init__(self, *args: Any, retry_s: float, source: str, **kwargs: Any) -> None:
        self.retry_s, self.source = retry_s, source
        super().__init__(*args, **kwargs)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in RETRIED_CALLS:
            if callable(getattr(cls, name, None)):
                setattr(cls, name, _retried(name))


def _retried(name: str) -> Callable[..., Any]:
    """The method `name` of a `_RetriesEveryCall` storage: the storage's own, through call_with_retry."""

    def method(self: _RetriesEveryCall, *args: Any, **kwargs: Any) -> Any:
        own = getattr(super(_RetriesEveryCall, self), name)
        return call_with_retry(own, name, self.retry_s, self.source, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


class RetryingJournalStorage(_RetriesEveryCall, optuna.storages.JournalStorage):
    """Optuna's JournalStorage with every call retried (`_RetriesEveryCall`).

    log_storage: the journal backend (`SafeJournalFileBackend`); retry_s, source: `_RetriesEveryCall`'s."""


class RetryingRDBStorage(_RetriesEveryCall, optuna.storages.RDBStorage):
    """Optuna's RDBStorage with every call retried (`_RetriesEveryCall`).

    url and the keyword arguments: RDBStorage's; retry_s, source: `_RetriesEveryCall`'s."""


def without_retry(storage: Any, name: str) -> Callable[..., Any]:
    """`storage.<name>` called once, never retried (the heartbeat: a missed beat is harmless)."""
    inner = storage._backend if isinstance(storage, _CachedStorage) else storage  # Optuna wraps an RDBStorage
    if isinstance(inner, _RetriesEveryCall):
        return getattr(super(_RetriesEveryCall, inner), name)
    return getattr(inner, name)
