"""The exception a trial process raises on SIGTERM (worker.py's handler), caught by the worker and,
in a trial of N processes, by the worker leading the ranks (ranks.py)."""

from __future__ import annotations


class TrialStopped(BaseException):
    """SIGTERM from the parent (timeout, interrupted sweep) or from our guardian (the parent died)."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason
