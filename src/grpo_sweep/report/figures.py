"""The report's PNG figures (matplotlib, headless Agg backend). Each function writes one file and
returns its path, or None when the trials hold nothing to draw (the page then says why)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on sweep machines; must precede pyplot
import matplotlib.pyplot as plt

from ..study.attrs import Status
from .trials import Trial, compared_settings, lever_label, setting_value, sort_key

COLORS = {
    "feasible": "#2a9d8f",
    "over_headroom": "#8ecae6",
    Status.OOM: "#e63946",
    Status.SLOW: "#b5838d",
    Status.PRUNED: "#9e9e9e",
    Status.FAILED: "#f4a261",
}
MARKERS = {"feasible": "o", "over_headroom": "D", Status.OOM: "X", Status.SLOW: "P", Status.PRUNED: "s", Status.FAILED: "v"}


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _x_peak(t: Trial) -> float | None:
    """Where a trial sits on the memory axis: the measured peak; for an OOM, what it needed (budget +
    deficit) when known; for a pruned trial, the estimator's prediction."""
    if t.category == Status.OOM and t.gib("budget_bytes") and t.gib("deficit_bytes"):
        return t.gib("budget_bytes") + t.gib("deficit_bytes")
    order = (
        ("predicted_peak_bytes", "peak_memory_bytes")
        if t.category == Status.PRUNED
        else ("peak_memory_bytes", "predicted_peak_bytes")
    )
    return next((t.gib(k) for k in order if t.gib(k)), None)


def throughput_vs_memory(trials: list[Trial], path: Path, *, budget: float | None, best: Trial | None) -> Path | None:
    """The scatter of each trial's objective against its peak memory, by category, with the budget and the winner marked.

    Args:
        trials: The study's trials.
        path: The PNG to write.
        budget: The card's budget in GiB; None: no line.
        best: The winner, marked; None: none.

    Returns:
        The PNG's path, or None when no trial has a peak.
    """
    points = [(t, _x_peak(t)) for t in trials if _x_peak(t) is not None]
    if not points:
        return None
    objective = trials[0].objective_name
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for category, color in COLORS.items():
        group = [(t, x) for t, x in points if t.category == category]
        if group:
            ax.scatter(
                [x for _, x in group],
                [t.objective or 0.0 for t, _ in group],
                s=60,
                c=color,
                marker=MARKERS[category],
                label=f"{category} ({len(group)})",
                edgecolors="black",
                linewidths=0.5,
                zorder=3,
            )
    if budget is not None:
        ax.axvline(budget, color="#e63946", linestyle="--", linewidth=1.2, label=f"budget {budget:.2f} GiB")
    if best is not None and _x_peak(best) is not None:
        ax.scatter(
            [_x_peak(best)],
            [best.objective],
            s=320,
            marker="*",
            c="gold",
            edgecolors="black",
            zorder=4,
            label=f"best: {best.name}",
        )
    for t, x in points:
        if t.preset:
            ax.scatter(
                [x], [t.objective or 0.0], s=200, facecolors="none", edgecolors="#264653", linewidths=2, marker="D", zorder=5
            )
            ax.annotate(t.preset, (x, t.objective or 0.0), textcoords="offset points", xytext=(8, 8), fontsize=8, color="#264653")
    ax.set_xlim(left=0)
    ax.set_ylim(-0.03 * ax.get_ylim()[1], ax.get_ylim()[1])  # room for the markers of trials at 0
    ax.set_xlabel("peak memory (GiB)")
    ax.set_ylabel(f"{objective} (0 = did not finish)")
    ax.set_title("Throughput vs peak memory, one point per trial")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


def lever_effects(trials: list[Trial], path: Path) -> Path | None:
    """For each setting that varied (trials.compared_settings): peak memory and objective against its
    value, all trials."""
    measured = [t for t in trials if t.gib("peak_memory_bytes")]
    names = compared_settings(measured)
    levers = [lv for lv in names if len({lever_label(setting_value(t, lv)) for t in measured}) > 1]
    if not levers:
        return None
    objective = trials[0].objective_name
    fig, axes = plt.subplots(len(levers), 2, figsize=(9, 2.6 * len(levers)), squeeze=False)
    for row, lever in zip(axes, levers):
        values = sorted({lever_label(setting_value(t, lever)): setting_value(t, lever) for t in measured}.values(), key=sort_key)
        pos = {lever_label(v): i for i, v in enumerate(values)}
        for ax, (ylabel, get) in zip(
            row, (("peak GiB", lambda t: t.gib("peak_memory_bytes")), (objective, lambda t: t.objective))
        ):
            for t in measured:
                y = get(t)
                if y is not None:
                    ax.scatter(
                        pos[lever_label(setting_value(t, lever))],
                        y,
                        c=COLORS[t.category],
                        marker=MARKERS[t.category],
                        edgecolors="black",
                        linewidths=0.5,
                        s=45,
                    )
            ax.set_xticks(range(len(values)), [lever_label(v) for v in values], fontsize=8)
            ax.set_xlabel(lever)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    fig.suptitle("Measured effect of each setting that varied (all trials; colour = outcome)")
    return _save(fig, path)


def reward_curves(trials: list[Trial], path: Path) -> Path | None:
    curves = [(t, [(r["step"], r["reward"]) for r in t.record.get("history") or [] if "reward" in r]) for t in trials]
    curves = [(t, c) for t, c in curves if c]
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for t, curve in curves:
        steps, rewards = [s for s, _ in curve], [r for _, r in curve]
        if len(curve) < 20:
            ax.plot(steps, rewards, marker="o", markersize=3, label=t.name)
            continue
        # A long run: each step thin, and the mean of the last `w` steps over it (a step's reward is noisy)
        (line,) = ax.plot(steps, rewards, linewidth=0.8, alpha=0.35)
        w = max(2, len(curve) // 10)
        smooth = [sum(rewards[max(0, i - w + 1) : i + 1]) / len(rewards[max(0, i - w + 1) : i + 1]) for i in range(len(rewards))]
        ax.plot(steps, smooth, color=line.get_color(), linewidth=2, label=f"{t.name} (mean of {w} steps)")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("mean reward")
    ax.set_title("Reward per step, one line per trial" if len(curves) > 1 else f"Reward per step: {curves[0][0].name}")
    ax.grid(alpha=0.3)
    if len(curves) <= 12:
        ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def predicted_vs_measured(trials: list[Trial], path: Path) -> Path | None:
    """Each measured trial at (prediction, measured peak): the estimator's raw prediction (filled
    marker) and, where the sweeper's pre-screen calibrated it (predicted_calibrated_bytes), the
    calibrated one (hollow marker) joined to it by a line: how far the correction moved it."""
    pts = [(t, t.gib("predicted_peak_bytes"), t.gib("peak_memory_bytes"), t.gib("predicted_calibrated_bytes")) for t in trials]
    pts = [p for p in pts if p[1] is not None and p[2] is not None]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 5))
    calibrated = False
    for t, pred, meas, cal in pts:
        ax.scatter(pred, meas, c=COLORS[t.category], marker=MARKERS[t.category], edgecolors="black", s=50)
        if cal is not None and abs(cal - pred) > 1e-12:
            calibrated = True
            ax.plot([pred, cal], [meas, meas], color="grey", linewidth=0.7)
            ax.scatter(cal, meas, facecolors="none", edgecolors=COLORS[t.category], marker=MARKERS[t.category], s=50)
    hi = max(max(p[1], p[2], p[3] or 0) for p in pts) * 1.1
    ax.plot([0, hi], [0, hi], color="black", linewidth=0.8, linestyle=":", label="exact")
    if calibrated:
        ax.scatter([], [], c="grey", edgecolors="black", s=40, label="raw prediction")
        ax.scatter([], [], facecolors="none", edgecolors="grey", s=40, label="calibrated (pre-screen)")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("predicted peak (GiB)")
    ax.set_ylabel("measured peak (GiB)")
    ax.set_title(
        "Estimator: predicted (raw, calibrated) vs measured peak" if calibrated else "Estimator: predicted vs measured peak"
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def importances(values: dict, path: Path) -> Path | None:
    if not values:
        return None
    names = list(values)[::-1]
    fig, ax = plt.subplots(figsize=(6.5, 0.45 * len(names) + 1.2))
    ax.barh(names, [values[n] for n in names], color="#457b9d")
    ax.set_xlabel("importance for the objective (Optuna)")
    ax.set_title("Parameter importances")
    return _save(fig, path)
