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

import importlib.util
import logging
import random
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from ..credentials import mask_url
from .journal import OwnedJournalFileLock, SafeJournalFileBackend, repair_journal
from .retry import (
    RetryingJournalStorage,
    RetryingRDBStorage,
    StorageError,
    StorageUnavailable,
    first_line,
    transient,
)

__all__ = [
    "JOURNAL_SUFFIXES",
    "SQLITE_SUFFIXES",
    "SWEEP_JOURNAL",
    "StorageError",
    "StorageUnavailable",
    "is_journal",
    "journal_path",
    "load_study",
    "open_storage",
    "repair_journal",
    "study_names",
    "to_url",
]

JOURNAL_SUFFIXES = (".journal", ".log")
# The sweeper's default storage: this file in the sweep directory (hydra.sweeper.storage unset).
SWEEP_JOURNAL = "study.journal"
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


log = logging.getLogger(__name__)


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
    """An Optuna storage for `source`.

    Args:
        source: A journal file path or an RDB URL.
        create: False for readers: a file that does not exist is an error instead of a new empty study.
        heartbeat_interval: Seconds between an RDB trial's heartbeats (RDB storages only).
        grace_period: Seconds without a heartbeat before an RDB trial is stale (RDB storages only).
        stale_trial_callback: Called on a stale RDB trial (RDB storages only).
        retry_s: How long a call that fails for a passing reason is retried (None: never).
        may_create_dir: The one folder this call may create for a file storage (the sweep
            directory). Any other missing parent folder is an error: a typo in a resume path must
            not start a new study.

    Returns:
        The storage.
    """
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
                    raise StorageError(f"storage {mask_url(source)}: cannot connect: {first_line(err, source)}") from None
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


def _check_parent(source: str, path: Path, may_create_dir: Path | None) -> None:
    """Make sure a journal file's folder exists; create it only when it is `may_create_dir`.

    Args:
        source: The storage as the user named it, for the message.
        path: The journal file.
        may_create_dir: The one folder this call may create, or None.
    """
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
