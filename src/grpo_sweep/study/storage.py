"""The one way to open an Optuna storage, for the sweeper and the report alike.

Accepted sources (the sweeper's `hydra.sweeper.storage`, the report's argument):
- `journal:PATH`, or a path ending in `.journal` / `.log`: a JournalStorage file (the default; no
  server). Opened with an `open(O_EXCL)` lock file, which works on NFS where flock may not;
- `sqlite:///PATH`, or a path ending in `.db` / `.sqlite` / `.sqlite3`: SQLite;
- any other SQLAlchemy URL: `postgresql://user:pw@host/db` (mapped to the PostgreSQL driver that is
  installed: SQLAlchemy 2 assumes psycopg 3, we ship psycopg2), `mysql://...`.
RDB storages get Optuna's heartbeat when the caller asks for one (the sweeper does; a reader does not).
Passwords never appear in what this module raises or returns for display (`credentials.mask_url`).
"""

from __future__ import annotations

import importlib.util
import random
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..credentials import mask_url

JOURNAL_SUFFIXES = (".journal", ".log")
# The sweeper's default storage: this file in the sweep directory (hydra.sweeper.storage unset).
SWEEP_JOURNAL = "study.journal"
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


class StorageError(ValueError):
    """A storage source that cannot be opened; the message names it (masked) and what is accepted."""


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
) -> Any:
    """An Optuna storage for `source`. `create=False` (readers): a file that does not exist is an
    error instead of a new empty study. The heartbeat arguments apply to RDB storages."""
    import optuna

    if is_journal(source):
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage

        path = journal_path(source)
        if not create and not path.exists():
            raise StorageError(f"storage {source!r}: no such journal file")
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))
    url = to_url(source)
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        if not create and not path.exists():
            raise StorageError(f"storage {source!r}: no such SQLite file")
        path.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(CREATE_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                warnings.simplefilter("ignore", FutureWarning)
                return optuna.storages.RDBStorage(
                    url,
                    engine_kwargs=None if url.startswith("sqlite") else {"pool_pre_ping": True},
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                    heartbeat_stale_trial_callback=stale_trial_callback,
                )
        except ImportError as err:
            raise StorageError(
                f"storage {mask_url(source)}: its database driver is not installed ({err}); "
                "for PostgreSQL: pip install 'grpo-sweep[postgres]'"
            ) from None
        except Exception as err:  # noqa: BLE001 - only a lost schema-creation race is retried
            if attempt + 1 == CREATE_ATTEMPTS or not _lost_create_race(err):
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
    import optuna

    return [s.study_name for s in optuna.get_all_study_summaries(storage)]


def load_study(source: str, study_name: str | None = None) -> Any:
    """An existing study, by name, or the only one in the storage (a reader's entry point)."""
    import optuna

    storage = open_storage(source, create=False)
    names = study_names(storage)
    if study_name is None:
        if len(names) != 1:
            raise StorageError(f"--study is required; studies in {mask_url(source)}: {names or 'none'}")
        study_name = names[0]
    if study_name not in names:
        raise StorageError(f"--study={study_name!r} not found; studies in {mask_url(source)}: {names}")
    return optuna.load_study(study_name=study_name, storage=storage)
