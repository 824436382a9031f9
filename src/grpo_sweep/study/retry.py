"""Storage calls retried through passing failures, within a bounded time; one line when they stay.

A call fails for a passing reason when the database restarts or is away, the disk is full, or a
SQLite file is locked by another writer. Anything else is a bug or bad data: raised at once.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import optuna
from optuna.storages._cached_storage import _CachedStorage

from ..credentials import mask_url

log = logging.getLogger(__name__)


class StorageError(ValueError):
    """A storage source that cannot be opened; the message names it (masked) and what is accepted."""


class StorageUnavailable(StorageError):
    """The storage stayed away longer than the retry budget; the message is the one line to show."""


def first_line(err: BaseException, source: str) -> str:
    """The root cause's first line, with the storage's password masked."""
    while (cause := err.__cause__ or err.__context__) is not None:
        err = cause
    text = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    password = source.split("://", 1)[-1].split("@", 1)[0].partition(":")[2] if "@" in source else ""
    if password:
        text = text.replace(password, "***")
    return f"{type(err).__name__}: {text}"[:400]


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
    while it fails for a passing reason, for up to `retry_s` seconds; then StorageUnavailable.

    Args:
        fn: The storage's own method.
        name: The method's name, for the messages and the one call whose lost commit counts.
        retry_s: How long a call is retried, in seconds.
        source: The storage as the user named it (masked in the messages).
        *args: Passed to `fn`.
        **kwargs: Passed to `fn`.

    Returns:
        What `fn` returns.
    """
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
                    f"({first_line(err, source)}); it is not tried again, as it may have landed. Every trial "
                    "told before this is kept; re-run the same command to resume"
                ) from None
            if failed is None:
                log.warning(
                    "Storage %s unavailable (%s: %s); retrying for up to %.0f s",
                    mask_url(source),
                    name,
                    first_line(err, source),
                    retry_s,
                )
            failed = err
            left = deadline - time.monotonic()
            if left <= 0:
                raise StorageUnavailable(
                    f"storage {mask_url(source)} unavailable for {retry_s:.0f} s (hydra.sweeper.storage_retry_s) "
                    f"while calling {name}: {first_line(err, source)}. Every trial told before this is kept; "
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

    Args:
        retry_s: How long a call is retried for a passing reason (hydra.sweeper.storage_retry_s).
        source: The storage as the user named it, for the messages (masked there).
        *args: The storage class's own arguments.
        **kwargs: The storage class's own keyword arguments.
    """

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
