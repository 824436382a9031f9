"""The soak: after the sweep, the winner runs `hydra.sweeper.soak_steps` steps, every step's own peak
measured, so a peak that creeps up over a long run (the OOM users meet after 100+ steps) shows
before the user's own long run does.

The soak is one more job through the sweep's launcher, not an Optuna trial: it never counts toward
n_trials and never joins the winner's runs, so it cannot change the winner. The job is the winner's
point with `trial.steps=<soak_steps>` and `trial.soak=true` (the trial measures each step's own peak:
metrics.json history rows' step_peak_memory_bytes), in the sweep directory's `soak/`. What it found
is recorded on the study (user attr `soak`: the per-step peaks, their trend, whether memory grew)
and read by best.yaml (`soak:`), the printed summary and report.html.

The job's trial.timeout_s is the trials' own scaled by soak_steps / trial.steps (never below it), so
a soak of many steps is not cut short by a limit sized for a few. `steps` is what ran (metrics.json's
finished steps), `steps_asked` what was asked.

The verdict judges the highest step peak of the whole run, not only its end: `over_budget` when it
passed the budget, `grew` when the highest timed step's peak is more than GREW_SHARE above the first
timed step's (step 2: step 1 creates the optimiser state, step 2 is the first to run with it), so a
spike in the middle of the run counts as well as a creep to its end. A soak that ran out of memory,
passed the budget or grew has a `warning`: best.yaml, the summary (beside `Run it:`) and report.html
flag the winner with it. The slope is the least-squares fit of the timed steps' peaks, in bytes per
step.

A soak stopped by SIGINT/SIGTERM is recorded `interrupted` with the command that resumes it (the
sweep's own, run again); a resumed sweep runs it again. Another worker finding it `running` says
which worker runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from grpo_sweep.study.attrs import Key, Status
from grpo_sweep.units import MIB

from . import space

SOAK_ATTR = Key.SOAK  # study user attr: what the soak found (trend, verdict, per-step peaks)
GREW_SHARE = 0.02  # a peak more than 2 % above the first timed step's: memory grew
FIRST_TIMED_STEP = 2
SOAK_DIR = "soak"


def overrides(point: list[str], study_name: str, steps: int, timeout: float | None = None) -> list[str]:
    """The soak job's command line: the winner's point, run with per-step peaks.

    Args:
        point: The winner's overrides.
        study_name: The study's name.
        steps: The steps to run.
        timeout: The job's seconds (timeout_s); None: the trials' own.

    Returns:
        The overrides.
    """
    return [
        *point,
        space.to_override("trial.study", study_name),
        f"trial.steps={steps}",
        *([f"trial.timeout_s={float(timeout)!r}"] if timeout is not None else []),
        "trial.soak=true",
        f"hydra.sweep.subdir={SOAK_DIR}",
    ]


def timeout_s(trial_timeout_s: float, trial_steps: int, steps: int) -> float:
    """The soak's trial.timeout_s: the trials' own scaled by steps / trial.steps, never below it.

    Args:
        trial_timeout_s: The trials' own timeout.
        trial_steps: The trials' steps.
        steps: The soak's steps.

    Returns:
        The seconds.
    """
    return float(trial_timeout_s) * max(1.0, steps / max(1, trial_steps))


def resume_command(config: Any) -> str | None:
    """The sweep's own command (the config's hydra.overrides), which resumes the study and its soak;
    None when the config does not have them."""
    import shlex

    from omegaconf import OmegaConf

    said = [*(OmegaConf.select(config, "hydra.overrides.hydra") or []), *(OmegaConf.select(config, "hydra.overrides.task") or [])]
    said = [o for o in said if not str(o).startswith("hydra.mode=")]  # -m says it
    if not said:
        return None
    return "python train.py -m " + " ".join(shlex.quote(str(o).replace("\n", " ")) for o in said)


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
    high_step, high = max(timed, key=lambda sp: (sp[1], -sp[0]))  # the highest timed peak, its first step
    out.update(
        first_timed_step=timed[0][0],
        first_peak_bytes=first,
        last_peak_bytes=last,
        highest_step=high_step,
        highest_peak_bytes=high,
        slope_bytes_per_step=slope,
        grew=high > first * (1 + GREW_SHARE),
    )
    return out


def judge(record: dict, metrics: Mapping[str, Any]) -> dict:
    """The soak's record completed from its metrics.json: status, the steps that ran, peak and budget,
    the per-step trend, whether the highest step peak passed the budget, and the warning (if any)."""
    history = metrics.get("history") or []
    steps_ran = metrics.get("steps")
    out = {
        **record,
        "status": metrics.get("status"),
        "error": (metrics.get("error") or None) and str(metrics["error"])[:1000],
        "steps": int(steps_ran) if steps_ran is not None else len(history),
        "peak_memory_bytes": metrics.get("peak_memory_bytes"),
        "budget_bytes": metrics.get("budget_bytes"),
        "memory_source": metrics.get("memory_source"),
        **trend(history),
    }
    budget, step_peaks = out["budget_bytes"], out["step_peaks"]
    if budget and step_peaks:
        step, peak = max(step_peaks, key=lambda sp: (sp[1], -sp[0]))  # every step, step 1 too
        out.update(over_budget=peak > budget, over_budget_step=step if peak > budget else None)
    out["warning"] = warning(out)
    return out


def warning(soak: dict) -> str | None:
    """The line that flags the winner when its soak shows it may not hold a long run: out of memory,
    a step's peak over the budget, or a step's peak above step 2's; None otherwise."""
    trial = soak.get("trial")
    if soak.get("status") == Status.OOM:
        at = f" at step {soak['steps'] + 1}" if soak.get("steps") is not None else ""
        return f"trial {trial}'s config ran out of memory{at} of its {soak.get('steps_asked') or '?'}-step soak"
    if soak.get("over_budget"):
        return (
            f"trial {trial}'s config peaked over the budget ({max(p for _, p in soak['step_peaks']) / MIB:.1f} of "
            f"{soak['budget_bytes'] / MIB:.1f} MiB) at step {soak['over_budget_step']} of its soak"
        )
    if soak.get("grew"):
        return (
            f"trial {trial}'s memory rose in its soak: step {soak['highest_step']} peaked at "
            f"{soak['highest_peak_bytes'] / MIB:.1f} MiB, {soak['highest_peak_bytes'] / soak['first_peak_bytes'] - 1:.0%} "
            f"above step {soak['first_timed_step']}'s"
        )
    return None


def words(soak: dict) -> str:
    """The summary's line about the soak."""
    steps = f"{soak.get('steps')} of {soak['steps_asked']}" if soak.get("steps_asked") else f"{soak.get('steps')}"
    status = soak.get("status")
    if status == Status.RUNNING:
        return (
            f"Soak of trial {soak.get('trial')}, {soak.get('steps_asked') or soak.get('steps')} steps: running in worker "
            f"{soak.get('worker') or '?'}, which writes its verdict into best.yaml when it ends"
        )
    if status == Status.INTERRUPTED:
        ran = f"after {steps} steps" if soak.get("steps") is not None else "before it recorded a step"
        return (
            f"Soak of trial {soak.get('trial')}: interrupted ({soak.get('error')}) {ran}, no verdict; resume it with: "
            f"{soak.get('resume') or 'the sweep command, run again'}"
        )
    if status != Status.OK:
        ran = f", {steps} steps" if soak.get("steps") is not None else ""
        said = f"Soak of trial {soak.get('trial')}{ran}: {status} ({soak.get('error') or 'no record'})"
        return said + (f". WARNING: {soak['warning']}" if soak.get("warning") else "")
    if soak.get("grew") is None:
        return f"Soak of trial {soak['trial']}, {steps} steps: {soak.get('why')}"
    verdict = "memory GREW" if soak["grew"] else "memory held"
    said = (
        f"Soak of trial {soak['trial']}, {steps} steps: {verdict}: step {soak['first_timed_step']} peaked at "
        f"{soak['first_peak_bytes'] / MIB:.1f} MiB, the highest (step {soak.get('highest_step')}) at "
        f"{soak.get('highest_peak_bytes', soak['last_peak_bytes']) / MIB:.1f} MiB, the last steps at "
        f"{soak['last_peak_bytes'] / MIB:.1f} MiB ({soak['slope_bytes_per_step'] / MIB:+.3f} MiB/step; grew means "
        f"a step more than {GREW_SHARE:.0%} above step {soak['first_timed_step']})"
    )
    return said + (f". WARNING: {soak['warning']}" if soak.get("warning") else "")


def due(study: Any, winner: Any, steps: int, worker_dead: Callable[[Any, Any], bool]) -> bool:
    """Whether this worker should soak `winner`: no soak of it for `steps` is recorded, or the one
    recorded was cut short. A soak another live worker runs is left to it; one that finished is never
    run again (a resumed sweep reuses it).

    Args:
        study: The study.
        winner: The winner's trial.
        steps: The soak's steps.
        worker_dead: Whether a soak's worker is gone (workers.worker_dead, passed in).

    Returns:
        True when this worker should run it.
    """
    import datetime

    done = study.user_attrs.get(SOAK_ATTR) or {}
    if done.get("trial") != winner.number or done.get("steps_asked", done.get("steps")) != steps:
        return True
    if done.get("status") == Status.INTERRUPTED:
        return True
    if done.get("status") != Status.RUNNING:
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
        return {**record, "status": Status.FAILED, "error": str(err)[:1000]}
    if metrics is None:
        return {**record, "status": Status.FAILED, "error": "the soak job wrote no metrics.json"}
    return judge(record, metrics)


def interrupted(record: dict, signal_name: str, run_dir: Any, resume: str | None) -> dict:
    """The soak's record when a signal stopped it.

    Args:
        record: The soak's record so far.
        signal_name: The signal's name, recorded as the error.
        run_dir: The job's run directory: the steps its metrics.json says ran (if it wrote one).
        resume: The command that resumes it.

    Returns:
        The record.
    """
    from pathlib import Path

    from grpo_sweep.metrics import read_metrics

    try:
        metrics = read_metrics(Path(run_dir)) or {}
    except Exception:  # noqa: BLE001 - a killed job's record may be missing or torn
        metrics = {}
    return {**record, "status": Status.INTERRUPTED, "error": signal_name, "steps": metrics.get("steps"), "resume": resume}
