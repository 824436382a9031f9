"""The soak: after the sweep, the winner runs `hydra.sweeper.soak_steps` steps, every step's own peak
measured, so a peak that creeps up over a long run (the OOM users meet after 100+ steps) shows
before the user's own long run does.

The soak is one more job through the sweep's launcher, not an Optuna trial: it never counts toward
n_trials and never joins the winner's runs, so it cannot change the winner. The job is the winner's
point with `trial.steps=<soak_steps>` and `trial.soak=true` (the trial measures each step's own peak:
metrics.json history rows' step_peak_memory_bytes), in the sweep directory's `soak/`. What it found
is recorded on the study (user attr `soak`: the per-step peaks, their trend, whether memory grew)
and read by best.yaml (`soak:`), the printed summary and report.html.

Grew: the largest step peak of the last quarter of the timed steps is more than GREW_SHARE above the
first timed step's (step 2: step 1 creates the optimiser state, step 2 is the first to run with it).
The slope is the least-squares fit of the timed steps' peaks, in bytes per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import space

SOAK_ATTR = "soak"  # study user attr: what the soak found (trend, verdict, per-step peaks)
GREW_SHARE = 0.02  # a peak more than 2 % above the first timed step's: memory grew
FIRST_TIMED_STEP = 2
SOAK_DIR = "soak"


def overrides(point: list[str], study_name: str, steps: int) -> list[str]:
    """The soak job's command line: the winner's point, run `steps` steps with per-step peaks."""
    return [
        *point,
        space.to_override("trial.study", study_name),
        f"trial.steps={steps}",
        "trial.soak=true",
        f"hydra.sweep.subdir={SOAK_DIR}",
    ]


def trend(history: list[dict]) -> dict:
    """The per-step peaks of a soak's history, their slope and whether they grew (see the module docstring)."""
    peaks = [
        (int(r["step"]), int(r["step_peak_memory_bytes"])) for r in history or [] if r.get("step_peak_memory_bytes") is not None
    ]
    out: dict[str, Any] = {"step_peaks": [[s, p] for s, p in peaks], "grew_share": GREW_SHARE}
    timed = [(s, p) for s, p in peaks if s >= FIRST_TIMED_STEP] or peaks
    if len(timed) < 2:
        out.update(grew=None, why=f"{len(timed)} timed step{'s' if len(timed) != 1 else ''} with a peak: no trend")
        return out
    n = len(timed)
    mean_s = sum(s for s, _ in timed) / n
    mean_p = sum(p for _, p in timed) / n
    var = sum((s - mean_s) ** 2 for s, _ in timed)
    slope = sum((s - mean_s) * (p - mean_p) for s, p in timed) / var if var else 0.0
    first = timed[0][1]
    last = max(p for _, p in timed[-max(1, n // 4) :])
    grew = last > first * (1 + GREW_SHARE)
    out.update(
        first_timed_step=timed[0][0],
        first_peak_bytes=first,
        last_peak_bytes=last,
        slope_bytes_per_step=slope,
        grew=grew,
    )
    return out


def words(soak: dict) -> str:
    """The summary's line about the soak."""
    if soak.get("status") != "ok":
        return f"Soak of trial {soak.get('trial')}: {soak.get('status')} ({soak.get('error') or 'no record'})"
    if soak.get("grew") is None:
        return f"Soak of trial {soak['trial']}, {soak['steps']} steps: {soak.get('why')}"
    mib = 2**20
    verdict = "memory GREW" if soak["grew"] else "memory held"
    return (
        f"Soak of trial {soak['trial']}, {soak['steps']} steps: {verdict}: step {soak['first_timed_step']} peaked at "
        f"{soak['first_peak_bytes'] / mib:.1f} MiB, the last steps at {soak['last_peak_bytes'] / mib:.1f} MiB "
        f"({soak['slope_bytes_per_step'] / mib:+.3f} MiB/step; grew means more than {GREW_SHARE:.0%} above step "
        f"{soak['first_timed_step']})"
    )


def due(study: Any, winner: Any, steps: int, worker_dead: Callable[[Any, Any], bool]) -> bool:
    """Whether this worker should soak `winner`: no soak of it for `steps` is recorded, or the one
    recorded was cut short (its worker gone: workers.worker_dead, passed in). A soak another live
    worker runs is left to it; one that finished is never run again (a resumed sweep reuses it)."""
    import datetime

    done = study.user_attrs.get(SOAK_ATTR) or {}
    if done.get("trial") != winner.number or done.get("steps") != steps:
        return True
    if done.get("status") != "running":
        return False
    started = datetime.datetime.fromtimestamp(done.get("started_unix") or 0.0)
    return worker_dead(done.get("worker"), started)


def finish(record: dict, ret: Any) -> dict:
    """The soak's record completed from its job's return (Hydra's JobReturn): its metrics.json's
    status, peak, budget and the per-step trend; a job without a readable record says why."""
    from pathlib import Path

    from grpo_sweep.metrics import MetricsError, read_metrics

    out_dir = ret.hydra_cfg.hydra.runtime.output_dir if getattr(ret, "hydra_cfg", None) is not None else None
    record = {**record, "run_dir": str(out_dir) if out_dir else None}
    try:
        metrics = read_metrics(Path(out_dir)) if out_dir else None
    except MetricsError as err:
        return {**record, "status": "failed", "error": str(err)[:1000]}
    if metrics is None:
        return {**record, "status": "failed", "error": "the soak job wrote no metrics.json"}
    record.update(
        status=metrics.get("status"),
        error=(metrics.get("error") or None) and str(metrics["error"])[:1000],
        peak_memory_bytes=metrics.get("peak_memory_bytes"),
        budget_bytes=metrics.get("budget_bytes"),
        memory_source=metrics.get("memory_source"),
    )
    record.update(trend(metrics.get("history") or []))
    return record
