"""Workers sharing one study: what they need beyond Optuna's defaults (the storage itself is opened
by grpo_sweep.study.storage, the one opener the report uses too).

- dead-worker recovery: a worker killed mid-trial leaves its trial RUNNING forever. RDB storages
  have Optuna's heartbeat (`heartbeat_interval`, `grace_period`, a retry callback); JournalStorage
  has none in Optuna 5, so `Heartbeat` does the same with a timestamp in the trial's system
  attributes, and `fail_stale_trials()` fails and re-enqueues silent trials for both kinds.
- a worker known to be dead is not waited for: a RUNNING trial whose worker (user attribute
  `worker` = host:pid) ran on this host and whose pid is gone (or now belongs to a newer process)
  is failed and re-enqueued at once (`fail_dead_workers`), without waiting out grace_period.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import datetime

    from optuna import Study
    from optuna.storages import BaseStorage, RDBStorage
    from optuna.trial import FrozenTrial, Trial

from grpo_sweep.study.attrs import Key, Status

from . import handles
from .confirm import CONFIRMS_ATTR

HEARTBEAT_ATTR = Key.HEARTBEAT


OUTCOME_ATTRS = (Key.STATUS, Key.ERROR, Key.RUN_DIR, Key.WORKER)


def retry(study: Study, frozen: FrozenTrial, max_retry: int | None) -> None:
    """Re-enqueue a failed trial's parameters, as Optuna's RetryFailedTrialCallback does (same
    `failed_trial` / `retry_history` system attributes), minus what belonged to the failed attempt:
    its outcome attributes and its heartbeat (a fresh trial must not look stale before it beats).

    Args:
        study: The study.
        frozen: The failed trial.
        max_retry: The most retries of one trial; None: no limit.
    """
    import optuna

    system_attrs = {"failed_trial": frozen.number, "retry_history": [], **frozen.system_attrs}
    system_attrs[Key.RETRY_HISTORY] = [*system_attrs[Key.RETRY_HISTORY], frozen.number]
    system_attrs.pop(HEARTBEAT_ATTR, None)
    if max_retry is not None and max_retry < len(system_attrs[Key.RETRY_HISTORY]):
        return
    user_attrs = {k: v for k, v in frozen.user_attrs.items() if k not in OUTCOME_ATTRS}
    study.add_trial(
        optuna.create_trial(
            state=optuna.trial.TrialState.WAITING,
            params=frozen.params,
            distributions=frozen.distributions,
            user_attrs=user_attrs,
            system_attrs=system_attrs,
        )
    )


def duplicate_of(study: Study, trial: Trial | FrozenTrial) -> int | None:
    """The earlier trial this enqueued one repeats, or None.

    Workers started together each queue the sweep's start points (enqueue, warm start, frontier
    start) before any sees the others' (Optuna's skip_if_exists is a read, then a write): the same
    point can be queued once per worker. The first copy runs; a later copy is a surplus, never run.
    A retry (`failed_trial`) and a confirmation run (`confirms`, confirm.py: the study holds one
    plan, written once) repeat a point on purpose and are never duplicates."""
    frozen = handles.cached_frozen(trial)
    fixed = frozen.system_attrs.get(Key.FIXED_PARAMS)
    if not fixed or "failed_trial" in frozen.system_attrs or CONFIRMS_ATTR in frozen.user_attrs:
        return None
    for other in study.get_trials(deepcopy=False):
        if other.number >= frozen.number:
            break
        if (
            other.system_attrs.get(Key.FIXED_PARAMS) == fixed
            and "failed_trial" not in other.system_attrs
            and other.user_attrs.get(Key.PRESET) == frozen.user_attrs.get(Key.PRESET)
            and other.user_attrs.get(Key.STATUS) != Status.SURPLUS
        ):
            return other.number
    return None


def fail_stale_trials(study: Study, grace_period: int, max_retry: int) -> list[int]:
    """Fail (and re-enqueue) RUNNING trials whose worker stopped beating.

    Args:
        study: The study.
        grace_period: The seconds without a beat after which a trial is stale.
        max_retry: The most retries of one trial.

    Returns:
        The numbers of the trials failed.
    """
    import warnings

    import optuna
    from optuna.trial import TrialState

    storage = handles.storage_of(study)
    if not _is_journal_storage(storage):  # RDB: Optuna's own heartbeat machinery
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
            optuna.storages.fail_stale_trials(study)
            after = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
        return sorted(after - before)
    now = time.time()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        started = cast("datetime.datetime", trial.datetime_start)  # RUNNING: it has started
        beat = max(trial.system_attrs.get(HEARTBEAT_ATTR) or 0.0, started.timestamp())
        if now - beat <= grace_period:
            continue
        if _fail_and_retry(study, trial, max_retry):
            failed.append(trial.number)
    return failed


def _fail_and_retry(study: Study, trial: FrozenTrial, max_retry: int, status: str | None = None) -> bool:
    """Tell a RUNNING trial FAIL and re-enqueue it (retry).

    Args:
        study: The study.
        trial: The trial.
        max_retry: The most retries of one trial.
        status: The status to record, when given.

    Returns:
        False when another worker finished it first.
    """
    import optuna
    from optuna.trial import TrialState

    storage = handles.storage_of(study)
    try:
        if status is not None:
            storage.set_trial_user_attr(handles.trial_id(trial), "status", status)
        if not storage.set_trial_state_values(handles.trial_id(trial), state=TrialState.FAIL):
            return False
        retry(study, storage.get_trial(handles.trial_id(trial)), max_retry)
        return True
    except optuna.exceptions.UpdateFinishedTrialError:
        return False  # another worker got there first


def worker_dead(worker: str | None, started: datetime.datetime | None) -> bool:
    """Whether `worker` (host:pid, as the sweeper records it) is known to be gone: this host, and its
    pid is not running or belongs to a process started after the trial (a reused pid). Another
    host's worker is never known dead here (its heartbeat decides)."""
    import psutil

    host, _, pid = str(worker or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        created = psutil.Process(int(pid)).create_time()
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
    return started is not None and created > started.timestamp() + 1.0


def this_worker() -> str:
    """This worker as trials record it (user attribute `worker`): host:pid, read by worker_dead."""
    return f"{socket.gethostname()}:{os.getpid()}"


def fail_dead_workers(study: Study, max_retry: int) -> list[int]:
    """Fail (and re-enqueue) RUNNING trials whose worker is known dead (worker_dead). Returns their numbers."""
    from optuna.trial import TrialState

    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not worker_dead(trial.user_attrs.get(Key.WORKER), trial.datetime_start):
            continue
        if _fail_and_retry(study, trial, max_retry, status=Status.WORKER_DIED):
            failed.append(trial.number)
    return failed


def waiting_line(study: Study, running: list[int]) -> str:
    """What this worker waits for: the RUNNING trials, each with the worker running it."""
    workers = {t.number: t.user_attrs.get(Key.WORKER) for t in study.get_trials(deepcopy=False) if t.number in running}
    named = ", ".join(f"trial {n} ({workers.get(n) or 'worker not recorded yet'})" for n in running)
    return f"waiting for {len(running)} running in other workers: {named}"


class Heartbeat:
    """While trials run, stamp them every `interval` s so other workers know this one is alive.

    RDB storages: Optuna's `record_heartbeat` (study.optimize would start it; we ask/tell ourselves).
    Journal storages: a timestamp in the trial's system attributes, read by `fail_stale_trials`.

    Args:
        study: The study.
        trial_ids: The trials to stamp.
        interval: The seconds between beats.
    """

    def __init__(self, study: Study, trial_ids: list[int], interval: int):
        from grpo_sweep.study.retry import without_retry

        storage = handles.storage_of(study)
        if _is_journal_storage(storage):  # a beat is tried once: a missed one is harmless, a blocked thread is not
            beat = without_retry(storage, "set_trial_system_attr")
            self._beat_one = lambda tid: beat(tid, HEARTBEAT_ATTR, time.time())
        else:
            self._beat_one = cast("RDBStorage", storage).record_heartbeat  # not a journal: an RDB storage
        self.trial_ids, self.interval = list(trial_ids), interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="grpo-sweep-heartbeat", daemon=True)

    def _beat(self) -> None:
        while True:
            for trial_id in self.trial_ids:
                try:
                    self._beat_one(trial_id)
                except Exception:  # noqa: BLE001, S110 - finished meanwhile; a heartbeat never kills the sweep
                    pass
            if self._stop.wait(self.interval):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _is_journal_storage(storage: BaseStorage) -> bool:
    from optuna.storages.journal import JournalStorage

    return isinstance(storage, JournalStorage)
