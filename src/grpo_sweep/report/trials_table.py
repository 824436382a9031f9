"""The Trials table of report.html: one row per trial, one column per measure, lever and note, each cell
escaped and formatted once (`_e`, `_fmt`, which the rest of the page uses too)."""

from __future__ import annotations

import html
import math

from ..levers import EXTRA_LEVER_NAMES, LEVER_NAMES
from ..units import GIB
from .learning import key_of
from .trials import Trial, lever_label


def _e(text) -> str:
    return html.escape(str(text))


def _fmt(value, digits=1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return lever_label(value) if isinstance(value, (list, tuple)) else str(value)


def _lever_getter(name: str):
    return lambda t: t.levers.get(name)


def _columns(trials: list[Trial], flagged: dict | None = None) -> list[tuple[str, str, callable]]:
    """(key, header, getter) for the trials table; optional columns only when some trial has them.
    flagged: the trials that changed the learning (learning.check_trials): a `learning` column."""
    objective = trials[0].objective_name
    cols = [
        ("number", "#", lambda t: t.number),
        ("name", "trial", lambda t: t.name),
        ("status", "status", lambda t: t.status),
        (objective, objective, lambda t: t.record.get(objective)),
        ("samples_per_s", "samples/s", lambda t: t.record.get("samples_per_s")),
        ("step_time_s", "step s", lambda t: t.record.get("step_time_s")),
        ("peak_gib", "peak GiB", lambda t: t.gib("peak_memory_bytes")),
    ]
    optional = [
        ("predicted_gib", "predicted GiB", lambda t: t.gib("predicted_peak_bytes")),
        ("calibrated_gib", "calibrated GiB", lambda t: t.gib("predicted_calibrated_bytes")),
        # the throughput model's tokens/s (memory/throughput.py; vLLM's generation waves charged): ranks, not promises
        ("predicted_tps", "model tok/s", lambda t: t.record.get("predicted_tokens_per_s")),
        ("waves", "gen. waves", lambda t: t.record.get("generation_waves")),
        ("prescreen_correction", "correction", lambda t: t.record.get("prescreen_correction")),
        ("budget_gib", "budget GiB", lambda t: t.gib("budget_bytes")),
        ("peak_phase", "peak phase", lambda t: t.record.get("peak_phase")),
        ("oom_phase", "OOM phase", lambda t: t.record.get("oom_phase")),
        ("deficit_gib", "deficit GiB", lambda t: t.gib("deficit_bytes")),
        ("reward_seconds_per_step", "reward s/step", lambda t: t.record.get("reward_seconds_per_step")),
        ("reward_share_pct", "reward % of step", lambda t: reward_share_pct(t.record)),
    ]
    if all(t.number is None for t in trials):
        cols.pop(0)  # a plain multirun has no Optuna trial numbers
    cols += [c for c in optional if any(c[2](t) is not None for t in trials)]
    unchecked = getattr(flagged, "unchecked", ())
    if flagged or unchecked:
        cols.append(("learning", "learning", lambda t: _learning_cell(t, flagged or {}, unchecked)))
    if any((t.record.get("world_size") or 1) > 1 for t in trials):  # trials of N processes (trial.num_processes)
        cols += [
            ("world_size", "ranks", lambda t: t.record.get("world_size")),
            ("strategy", "strategy", lambda t: t.record.get("strategy")),
            (
                "rank_peaks",
                "per-rank peak GiB",
                lambda t: " / ".join(f"{p / GIB:.3f}" for p in t.record.get("rank_peak_memory_bytes") or [] if p) or None,
            ),
        ]
    cols += [(lv, lv, _lever_getter(lv)) for lv in LEVER_NAMES + EXTRA_LEVER_NAMES]
    cols += [
        ("reward_mean", "reward", lambda t: t.record.get("reward_mean")),
        ("reward_first", "reward first", lambda t: t.record.get("reward_first")),
        ("reward_last", "reward last", lambda t: t.record.get("reward_last")),
        ("reward_change", "reward change", lambda t: t.record.get("reward_change")),
        ("preset", "seed preset", lambda t: t.preset),
        ("wandb", "W&B run", lambda t: t.record.get("wandb_url") or t.record.get("wandb_run_id")),
        ("error", "error", lambda t: (t.record.get("error") or "").splitlines()[0][:120] if t.record.get("error") else None),
    ]
    return cols


def _learning_cell(t: Trial, flagged: dict, unchecked) -> str | None:
    """A trial's `learning` cell: how it changed the learning, that nothing checked it, or None.

    Args:
        t: The trial.
        flagged: The trials that changed the learning, by key_of, each with its Departure.
        unchecked: The keys of the trials no other config of their recipe and seed could be compared with.

    Returns:
        The cell's text, or None.
    """
    if key_of(t) in flagged:
        return flagged[key_of(t)].text
    return "unchecked: no other config of its recipe and seed ran" if key_of(t) in unchecked else None


def trials_table(trials: list[Trial], best: Trial | None, flagged: dict | None = None) -> str:
    """The sortable Trials table: one row per trial, the winner and the trials that changed the learning marked.

    Args:
        trials: The trials.
        best: The winner, or None.
        flagged: The trials that changed the learning (learning.check_trials), or None.

    Returns:
        The table's HTML.
    """
    cols = _columns(trials, flagged)
    left = ("name", "status", "error", "learning")
    head = "".join(f'<th data-key="{_e(k)}" class="{"l" if k in left else ""}">{_e(h)}</th>' for k, h, _ in cols)
    rows = []
    for t in trials:
        cells = []
        for key, _, get in cols:
            value = get(t)
            digits = 3 if key.endswith("gib") or key.startswith("reward") or key == "step_time_s" else 1
            digits = 1 if key == "reward_share_pct" else digits
            raw = "" if value is None else (value if not isinstance(value, (list, tuple)) else len(value))
            cls = "l " + key if key in left else key
            tip = f' title="{_e(t.record.get("error"))}"' if key == "error" and value else ""
            cells.append(f'<td class="{cls}" data-v="{_e(raw)}"{tip}>{_e(_fmt(value, digits))}</td>')
        extra = (" best" if t is best else "") + (" changed" if flagged and key_of(t) in flagged else "")
        rows.append(f'<tr class="{t.category}{extra}" data-status="{_e(t.status)}">{"".join(cells)}</tr>')
    return (
        f'<div class="wide"><table id="trials" class="sortable"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def reward_share_pct(record: dict) -> float | None:
    """The reward functions' share of the step time, in percent (reward_seconds_per_step / step_time_s)."""
    seconds, step = record.get("reward_seconds_per_step"), record.get("step_time_s")
    if not isinstance(seconds, (int, float)) or not isinstance(step, (int, float)) or step <= 0:
        return None
    return 100.0 * seconds / step
