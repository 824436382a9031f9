"""The Optuna studies a test reads, polls or creates: a sweep's real study, a plan's new one, a
PostgreSQL database of its own."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path


def load_study(storage: str, name: str = "tiny_cpu"):
    """The study `name` in `storage` (a journal file, or a database URL), as a sweep left it."""
    import optuna

    from grpo_sweep.study.storage import is_journal, journal_path, open_storage

    if is_journal(storage):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        return optuna.load_study(study_name=name, storage=JournalStorage(JournalFileBackend(str(journal_path(storage)))))
    return optuna.load_study(study_name=name, storage=open_storage(storage, create=False))


def trials_so_far(storage: str, name: str = "tiny_cpu") -> list:
    """The study's trials, or [] while the sweep has not created it yet (for polling a running sweep)."""
    if storage.startswith("journal:") and not Path(storage[len("journal:") :]).exists():
        return []
    try:
        return load_study(storage, name).trials
    except KeyError:
        return []


def counted(study) -> list:
    """The trials that count toward n_trials (the sweeper's rule: retried and surplus FAILs do not)."""
    trials = study.get_trials()
    retried = {n for t in trials for n in (t.system_attrs.get("retry_history") or [])}
    return [
        t
        for t in trials
        if t.state.name in ("COMPLETE", "PRUNED")
        or (t.state.name == "FAIL" and t.number not in retried and t.user_attrs.get("status") != "surplus")
    ]


def create_study(plan, name: str = "promises"):
    """A new study in the plan's storage, in its direction: what the sweeper creates before its loop."""
    import optuna

    from grpo_sweep.study.storage import open_storage

    plan.sweep_dir.mkdir(parents=True, exist_ok=True)  # as sweep() does before the storage opens
    return optuna.create_study(study_name=name, storage=open_storage(plan.storage_url), direction=plan.settings.direction)


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
