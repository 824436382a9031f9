"""How a trial process ends early: TrialStopped, the exception it raises on SIGTERM (worker.py's
handler), caught by the worker and, in a trial of N processes, by the worker leading the ranks
(ranks.py); `print_failure`, how both show an exception that failed the trial."""

from __future__ import annotations

import traceback

from .cache_entry import CacheUnwritable


class TrialStopped(BaseException):
    """SIGTERM from the parent (timeout, interrupted sweep) or from our guardian (the parent died)."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def print_failure(exc: BaseException) -> None:
    """A trial's failure on its console: one line when it says all (a model cache that cannot be
    written: what to set), else the traceback."""
    if isinstance(exc, CacheUnwritable):
        print(f"[trial] {exc}", flush=True)
    else:
        traceback.print_exception(exc)
