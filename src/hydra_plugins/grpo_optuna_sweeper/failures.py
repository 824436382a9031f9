"""A systematic failure stops the sweep, and a sweep that ends without a winner says why.

A trial that fails is normal (an odd point of the space); the same failure again and again is not:
a model that cannot be loaded (no Hub access), a missing package, a reward function that raises.
Each such trial costs a model load and tells the sampler nothing, so after
`hydra.sweeper.max_failures_in_a_row` trials in a row fail for one reason that is not memory, the
sweep stops with that reason and what to do. OOM and pre-screened trials are never failures here:
they are the search's own answers ("this does not fit"). A pre-screened point never ran, so it
does not break a run of failures either.
"""

# No `from __future__ import annotations` here: Hydra's plugin scan loads this module without
# registering it in sys.modules, where @dataclass would look string annotations up (config.py).
import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpo_sweep.study.attrs import NOT_RUN, Key, Status

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

# What a failure can be for this rule: the trial raised ("failed"), or the point was rejected before
# it ran ("invalid": a missing package or a bad setting is rejected for every point alike). Not a
# timeout (a large point may legitimately be slow) and not an interruption, a surplus or a retry.
SYSTEMATIC_STATUSES = (Status.FAILED, Status.INVALID)

ADVICE = (
    (
        ("huggingface.co", "couldn't connect", "LocalEntryNotFoundError", "offline mode", "Repository Not Found"),
        "the model or tokenizer could not be fetched from the Hugging Face Hub: run where the Hub is reachable, "
        "or download it once and set HF_HUB_OFFLINE=1, or point model.hub_id at a local directory",
    ),
    (
        ("ModuleNotFoundError", "No module named", "ImportError", "is not installed"),
        "a package is missing: install the backend's extra (docs/backends.md) or choose another backend=",
    ),
    (
        ("reward",),
        "the task's reward function raised: fix it, then run one point alone to check (the command below)",
    ),
)
NOTHING_FITS = "nothing fits the budget"  # the memory verdict: said only when trials were over budget
DEFAULT_ADVICE = "every trial fails the same way: run one point alone (the command below) and read its trial.log"


@dataclass
class Stop:
    reason: str  # the last failure's first error line (the failures share its cause: cause_of)
    trials: list[int]  # the trials that failed in a row
    advice: str
    command: str  # one failed point, to run alone

    def as_dict(self) -> dict:
        return {"reason": self.reason, "trials": self.trials, "advice": self.advice, "command": self.command}

    def message(self) -> str:
        return (
            f"Sweep stopped: trials {', '.join(map(str, self.trials))} failed in a row for the same reason, "
            f"not memory: {self.reason}\n  What to do: {self.advice}\n  Run one alone: {self.command}"
        )


def reason_of(trial: "FrozenTrial") -> str | None:
    """The failure's key (status and the error's first line), or None when the trial did not fail
    in a way this rule counts (ok, OOM, pruned, timeout, interrupted, surplus)."""
    attrs = trial.user_attrs
    if trial.state.name != "FAIL" or attrs.get(Key.STATUS) not in SYSTEMATIC_STATUSES:
        return None
    first = next((line.strip() for line in str(attrs.get(Key.ERROR) or "").splitlines() if line.strip()), "")
    return f"{attrs.get(Key.STATUS)}: {first[:300] or 'no error message'}"


# The cause, not the sampled value: `+foo=choice(1,2,3)` fails each trial with its own number in the
# message, and a path names each trial's own directory. Quoted text, paths, hex and numbers are
# replaced by placeholders before failures are compared.
_VARYING = (
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<value>"),
    (re.compile(r"(?:[A-Za-z]:)?(?:/[\w.@+-]+)+/?"), "<path>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"[-+]?\b\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\b"), "<n>"),
)


def cause_of(reason: str) -> str:
    """A failure reason with what varies between trials of one cause (values, paths, numbers) normalised out."""
    for pattern, placeholder in _VARYING:
        reason = pattern.sub(placeholder, reason)
    return reason


def systematic_failure(
    study: "Study", since: datetime.datetime, limit: int, command_of: Callable[["FrozenTrial"], str]
) -> Stop | None:
    """A Stop when the last `limit` trials finished since `since` all failed for one reason.

    Args:
        study: The study to read.
        since: This worker's start: earlier failures belong to a run the user may have fixed since.
        limit: The failures in a row that stop the sweep.
        command_of: command_of(trial) -> the line that runs a trial's point alone (tables.command_line).

    Returns:
        The Stop, or None to go on.
    """
    if not limit or limit <= 0:
        return None
    finished = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state.name in ("COMPLETE", "PRUNED", "FAIL") and t.datetime_complete is not None and t.datetime_complete >= since
    ]
    # A retried or surplus FAIL is bookkeeping, not an answer: it neither counts nor breaks a run. A
    # pre-screened point never ran, so it shows nothing about the failing setup: it neither counts
    # nor breaks a run either. A trial that ran (ok, OOM, slow) breaks it.
    finished = [t for t in finished if t.user_attrs.get(Key.STATUS) not in NOT_RUN]
    finished.sort(key=lambda t: (t.datetime_complete, t.number))
    last = finished[-limit:]
    if len(last) < limit:
        return None
    reasons = [r for r in map(reason_of, last) if r is not None]
    if len(reasons) < limit or len({cause_of(r) for r in reasons}) != 1:
        return None
    reason = reasons[-1]  # shown as it was: the last trial's own words
    return Stop(reason=reason, trials=[t.number for t in last], advice=advice_for(reason), command=command_of(last[-1]))


def advice_for(reason: str) -> str:
    lowered = reason.lower()
    for needles, advice in ADVICE:
        if any(n.lower() in lowered for n in needles):
            return advice
    return DEFAULT_ADVICE


def why_no_best(study: "Study") -> str:
    """The line a summary prints when no trial is feasible: 'nothing fits' only when trials really
    ran out of memory (or were predicted to); otherwise what the trials did instead."""
    statuses: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        status = t.user_attrs.get(Key.STATUS) or t.state.name.lower()
        statuses[status] = statuses.get(status, 0) + 1
    trials = study.get_trials(deepcopy=False)
    infeasible = any(t.state.name in ("COMPLETE", "PRUNED") and any(v > 0 for v in t.constraints.values()) for t in trials)
    if infeasible:
        return f"No feasible trial yet: {NOTHING_FITS} (see trials.csv for each trial's status)."
    counts = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "no trials"
    failed = [t for t in trials if reason_of(t)]
    first = f"; first failure (trial {failed[0].number}): {reason_of(failed[0])}" if failed else ""
    return f"No trial ran ok ({counts}): not a memory verdict{first}."
