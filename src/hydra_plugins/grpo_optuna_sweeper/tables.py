"""The text a finished sweep prints: the top trials, the confirmed finalists, a stopped sweep's last
lines (summary.write_summary prints them; best.yaml and trials.csv hold the same numbers)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from grpo_sweep.report.trials import rerun_command
from grpo_sweep.study.attrs import Key
from grpo_sweep.units import GIB

from .launch_config import HYDRA_OVERRIDES_ATTR

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from .failures import Stop


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def ranks_text(attrs: dict) -> str:
    """`2 x ddp` for a trial of 2 processes, `1` for one."""
    n = attrs.get(Key.WORLD_SIZE) or 1
    return f"{n} x {attrs.get('strategy')}" if n > 1 else "1"


def rank_peaks_text(attrs: dict) -> str:
    peaks = attrs.get(Key.RANK_PEAK_MEMORY_BYTES) or []
    return "/".join(f"{p / GIB:.2f}" if p else "-" for p in peaks) or "-"


def table(ok: list, objective: str, top_k: int, changed: set | None = None, unchecked: set | None = None) -> str:
    """The top trials as aligned text, with a `learning` column when any changed or is unchecked.

    Args:
        ok: the study's ok trials, best first.
        objective: the metric the sweep ranks by.
        top_k: how many trials to show.
        changed: the numbers of the trials that changed the learning (grpo_sweep.report.learning).
        unchecked: the numbers of the trials with no peer to compare with.

    Returns:
        The table.
    """
    unchecked = unchecked or set()
    keys = sorted({k for t in ok[:top_k] for k in t.params})
    multi = any((t.user_attrs.get(Key.WORLD_SIZE) or 1) > 1 for t in ok[:top_k])
    header = [
        "rank",
        "trial",
        objective,
        "peak GiB",
        "pred GiB",
        *(["ranks", "per-rank GiB"] if multi else []),
        "reward",
        "reward change",
        *(["learning"] if changed or unchecked else []),
        *keys,
    ]
    lines = [header]
    for rank, t in enumerate(ok[:top_k], 1):
        peak, pred = t.user_attrs.get(Key.PEAK_MEMORY_BYTES), t.user_attrs.get(Key.PREDICTED_PEAK_BYTES)
        lines.append(
            [
                str(rank),
                str(t.number),
                _fmt(t.value),
                f"{peak / GIB:.2f}" if peak else "-",
                f"{pred / GIB:.2f}" if pred else "-",
                *([ranks_text(t.user_attrs), rank_peaks_text(t.user_attrs)] if multi else []),
                *[
                    _fmt(t.user_attrs.get(k)) if t.user_attrs.get(k) is not None else "-"
                    for k in ("reward_mean", "reward_change")
                ],
                *(
                    [("CHANGED" if t.number in (changed or ()) else "unchecked" if t.number in unchecked else "same")]
                    if changed or unchecked
                    else []
                ),
                *[_fmt(t.params.get(k, "")) for k in keys],
            ]
        )
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines)


def finalist_table(summary: dict, objective: str) -> str:
    """The confirmed finalists: every run, the median and the spread; what confirmation spent and why
    it stopped; whether the winner is clear (a tie's line is summary.tie_line, printed after it)."""
    lines = []
    if summary.get("finalists"):
        heading = "Confirmed finalists" if summary.get("finalists_from") == "confirmation" else "Configs run more than once"
        lines.append(f"\n{heading} (median of runs wins; {objective}):")
        for f in summary["finalists"]:
            spread = f"{f['spread']:.0%}" if f["spread"] is not None else "-"
            runs = ", ".join(f"{v:.4g}" for v in f["runs"])
            lines.append(f"  trial {f['trial']}: median {f['median']:.4g}  runs [{runs}]  spread {spread}")
    confirmation = summary.get("confirmation") or {}
    if confirmation.get("stopped"):
        sweep_s = confirmation.get("sweep_s") or 0.0
        share = f" ({confirmation.get('spent_s', 0.0) / sweep_s:.0%} of the sweep's {sweep_s:.0f} s)" if sweep_s else ""
        lines.append(
            f"  Confirmation: {confirmation.get('runs', 0)} runs in {confirmation.get('rounds', 0)} rounds{share}; "
            f"stopped: {confirmation.get('why')}"
        )
    if not summary.get("tie") and summary.get("top_two_within_noise") is False:
        lines.append("  The winner is separated from the runner-up at the measured noise: a clear winner on this machine.")
    return "\n".join(lines)


def stop_words(stopped: Stop, waiting: int) -> str:
    """A stopped sweep's last lines: the failure, what to do, and what its queued points wait for."""
    words = stopped.message()
    if waiting:
        words += (
            f"\n  {waiting} queued trial{'s' if waiting > 1 else ''} left WAITING: the same command, run again once"
            " fixed, resumes the study and runs them first"
        )
    return words


def command_line(trial: FrozenTrial) -> str:
    """The shell line that runs the trial's point alone: its Hydra settings (hydra.searchpath, ...), then the point."""
    attrs = trial.user_attrs
    return rerun_command([*(attrs.get(HYDRA_OVERRIDES_ATTR) or []), *(attrs.get(Key.OVERRIDES) or [])])
