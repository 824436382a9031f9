"""The sweep's summary: trials.csv, best.yaml, a table of the top trials, the line to run the winner.

Every worker writes it when it finishes (atomically, from the shared study): it covers the whole study.
"""

from __future__ import annotations

import csv
import io
import shlex
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from grpo_sweep.credentials import mask_url as mask
from grpo_sweep.files import write_atomic
from grpo_sweep.levers import EXTRA_LEVER_NAMES, LEVER_NAMES
from grpo_sweep.memory.throughput import limit_words
from grpo_sweep.report.learning import verdict_lines, verdict_of
from grpo_sweep.study import best as best_rule
from grpo_sweep.study.attrs import ConfirmationState, Key, Status
from grpo_sweep.study.storage import is_journal, journal_path
from grpo_sweep.units import MIB

from .concessions import describe, fmt
from .failures import NOTHING_FITS, Stop, why_no_best
from .soak import SOAK_ATTR
from .soak import words as soak_words
from .standings import feasible, is_ok, learning_verdict
from .tables import command_line, finalist_table, stop_words, table

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

FIRST_COLUMNS = [
    "number",
    "state",
    "status",
    "feasible",
    "objective",
    "peak_memory_bytes",
    "predicted_peak_bytes",
    "predicted_calibrated_bytes",  # the pre-screen's calibrated prediction (calibration.py)
    "prescreen_correction",
    "prescreen_allowance",
    "budget_bytes",
    "deficit_bytes",
    "world_size",  # trial.num_processes; peak_memory_bytes is then the largest rank's
    "strategy",
    "rank_peak_memory_bytes",  # each rank's peak, space-separated
]
LAST_COLUMNS = ["learning", "preset", "worker", "run_dir", "wandb_run_id", "error"]


def learning_summary(verdict: Any, flagged: dict, tolerance: float | None) -> dict:
    """best.yaml's words on the learning check.

    Args:
        verdict: the verdict with the learning check applied.
        flagged: the trials that changed the learning, by number.
        tolerance: hydra.sweeper.learning_tolerance (None: per precision).

    Returns:
        `changed_the_learning`: each flagged trial with its numbers, those ranked above the winner, whether
        the winner is one; `learning_unchecked`: ok trials with no peer, whether the winner is one; {} if neither.
    """
    out = {}
    unchecked = sorted(getattr(flagged, "unchecked", ()))
    if unchecked:
        winner = verdict.ranked[0].members if verdict.ranked else []
        out["learning_unchecked"] = {
            "trials": unchecked,
            "why": "no other config of their recipe and seed ran, so nothing was compared with them",
            "winner_unchecked": bool(winner) and all(m.number in unchecked for m in winner),
        }
    if not flagged:
        return out
    return out | {
        "changed_the_learning": {
            "tolerance": tolerance,  # null: per precision (float32 1e-4, bf16 2e-2)
            "trials": [{"trial": n, **d.as_dict()} for n, d in sorted(flagged.items())],
            "passed_over": [f.item.number for f in verdict.passed_over],  # flagged, ranked above the winner
            "winner_flagged": verdict.winner_flagged,
        }
    }


def learning_lines(verdict: Any, flagged: dict, compared: int) -> str:
    """The printout's words on the learning check.

    Args:
        verdict: the verdict with the learning check applied.
        flagged: the trials that changed the learning, by number.
        compared: how many ok trials it compared.

    Returns:
        What it did to the winner, every flagged trial, the trials with no peer to check; "" if nothing.
    """
    unchecked = sorted(getattr(flagged, "unchecked", ()))
    alone = (
        f"unchecked: trial{'s' if len(unchecked) > 1 else ''} {', '.join(map(str, unchecked))} (no other config of "
        "its recipe and seed ran, so nothing was compared with it)"
        if unchecked
        else ""
    )
    if not flagged:
        checked = compared - len(unchecked)
        if checked < 2:
            return f"\nLearning checked: none; {alone}" if alone else ""
        return f"\nLearning checked: none of the {checked} ok trials changed the learning (compared by recipe and seed)" + (
            f"; {alone}" if alone else ""
        )
    said = verdict_lines(verdict, flagged, lambda t: t.number, lambda n: f"trial {n}") + ([alone] if alone else [])
    return "\nLearning checked:\n" + "\n".join(f"  {line[0].upper()}{line[1:]}" for line in said)


def noise_summary(ruling: best_rule.Verdict, chosen: bool = True) -> dict:
    """best.yaml's `finalists` (runs and spread each), the study's noise, whether the top two are within it, and the
    `tie` when the leader is not separated. chosen: the confirmation phase chose the finalists, all listed as the report
    lists them (one may have run once, when the sampler's repeats separated the leader first); else those the sampler repeated."""
    ranked = ruling.ranked
    out: dict = {}
    if ruling.sigma is not None:
        out["noise"] = {"relative_sd": float(ruling.sigma), "configs": ruling.noise_configs, "floor": best_rule.NOISE_FLOOR}
    confirmed = list(ranked) if chosen else [f for f in ranked if len(f.members) > 1]
    if confirmed:
        out["finalists_from"] = "confirmation" if chosen else "repeated by the sampler"
        out["finalists"] = [
            {
                "trial": f.item.number,
                "runs": [float(v) for v in f.runs],
                "run_trials": [m.number for m in f.members],
                "median": float(f.median),
                "spread": float(f.spread) if f.spread is not None else None,
            }
            for f in confirmed
        ]
    by_median = ruling.by_median
    if len(by_median) >= 2 and ruling.sigma is not None:
        out["top_two_within_noise"] = bool(best_rule.within_noise(by_median[0], by_median[1], ruling.sigma))
    elif len(by_median) >= 2 and (note := unmeasured_lead(by_median[0], by_median[1])):
        out["lead_note"] = note
    if ruling.tie:
        out["tie"] = [tie_row(ruling, f) for f in ruling.tie]
        out["tie_note"] = tie_line(ruling)
    return out


def unmeasured_lead(first: Any, second: Any) -> str | None:
    """The line for a winner no measured noise can judge (no config ran twice): its lead over the runner-up,
    and that one run each cannot tell a real lead from a lucky run. None when no ratio is positive."""
    high, low = max(first.median, second.median), min(first.median, second.median)
    if low <= 0:
        return None
    return (
        f"No config ran twice, so this study measured no noise: trial {first.item.number}'s lead of "
        f"{high / low - 1:.0%} over trial {second.item.number} rests on one run each and may be a lucky run. "
        "Confirmation runs (a larger hydra.sweeper.n_trials) would tell."
    )


def tie_row(ruling: best_rule.Verdict, f: Any) -> dict:
    peak, share = ruling.memory(f)
    return {
        "trial": f.item.number,
        "median": float(f.median),
        "runs": len(f.runs),
        "peak_memory_bytes": int(peak) if peak is not None else None,
        "headroom": round(1.0 - share, 4) if share is not None else None,
        "within_5pct": f in ruling.close,  # shown within best.INDIFFERENCE of the leader: may win by headroom
        "winner": f is ruling.winner,
    }


def tie_line(ruling: best_rule.Verdict) -> str:
    """The line that says which configs tie and how: by headroom within best.INDIFFERENCE of the leader, else median."""

    def headroom(f: Any) -> str:
        peak, share = ruling.memory(f)
        if share is not None:
            return f"{1 - share:.0%} headroom"
        return f"peak {peak / MIB:.0f} MiB" if peak is not None else "peak unknown"

    winner = ruling.winner
    assert winner is not None  # a tie is among finalists, one of which wins it
    zone = f"{ruling.zone:.0%}".replace("%", " %")
    noise = f"noise {ruling.sigma:.1%}" if ruling.sigma is not None else "no noise measured yet"
    said = (
        f"Tie: trials {', '.join(str(f.item.number) for f in ruling.tie)} are within noise "
        f"(medians {', '.join(f'{f.median:.4g}' for f in ruling.tie)}; {noise}): "
    )
    if ruling.agreed and ruling.close:
        said = (
            f"Tie: trials {', '.join(str(f.item.number) for f in ruling.close)} ran within {zone} of each other and the "
            f"model predicts them so (medians {', '.join(f'{f.median:.4g}' for f in ruling.close)}; {noise}): "
        )
    if not ruling.close:
        return (
            said + f"none is shown within {zone} of the leader, so trial {winner.item.number} wins with the best median "
            "(more runs could tell them apart)"
        )
    others = [f for f in ruling.close if f is not winner]
    return said + (
        f"within {zone} of each other: the safer one wins, trial {winner.item.number}, with the most memory headroom "
        f"({headroom(winner)} vs {', '.join(headroom(f) for f in others)})"
    )


def _lever_names(trials: list) -> list[str]:
    names = list(LEVER_NAMES + EXTRA_LEVER_NAMES)
    for t in trials:  # search-space keys that are not levers (config groups such as `lora`)
        names += [k for k in t.params if k not in names]
    return names


def rows(study: Study, flagged: dict | None = None) -> tuple[list[str], list[dict]]:
    """trials.csv: one row per trial. `flagged`: the learning check's flagged trials by number (`learning` column:
    "changed" for those, "unchecked" for the ok trials with no peer, "same" for the other ok trials it compared)."""
    trials = study.get_trials(deepcopy=False)
    levers = _lever_names(trials)
    out = []
    for t in trials:
        attrs = t.user_attrs
        row = {
            "number": t.number,
            "state": t.state.name,
            "status": attrs.get(Key.STATUS),
            "feasible": feasible(t) if t.state.name in ("COMPLETE", "PRUNED") else "",
            "objective": t.value if is_ok(t) else "",
        }
        for key in FIRST_COLUMNS[5:]:
            value = attrs.get(key, "")
            row[key] = " ".join(str(v) for v in value) if isinstance(value, list) else value
        lever_values = attrs.get(Key.LEVERS) or {}
        for name in levers:
            value = t.params.get(name, lever_values.get(name, ""))
            row[name] = " ".join(value) if isinstance(value, list) else value
        learning = verdict_of(t.number, flagged) if flagged is not None and (is_ok(t) or t.number in flagged) else ""
        for key in LAST_COLUMNS:
            if key == "learning":  # the check's verdict, not a trial attribute
                row[key] = learning
            else:
                row[key] = str(attrs.get(key, "")).splitlines()[0][:300] if attrs.get(key) else ""
        out.append(row)
    return FIRST_COLUMNS + levers + LAST_COLUMNS, out


def _plain_dumper():
    import yaml

    class PlainDumper(yaml.SafeDumper):
        """best.yaml for people: a value that appears twice is written twice, never as an alias (*id001)."""

        def ignore_aliases(self, data):  # noqa: ARG002 - PyYAML's hook
            return True

    # A Status or Key read back from an in-memory study is written as its string.
    PlainDumper.add_multi_representer(StrEnum, lambda dumper, value: dumper.represent_str(value.value))
    return PlainDumper


def dashboard_command(storage_url: str) -> str:
    target = str(journal_path(storage_url)) if is_journal(storage_url) else mask(storage_url)
    return f"optuna-dashboard {shlex.quote(target)}"


def vs_presets(study: Study, best: FrozenTrial | None) -> dict:
    """best / preset objective for each seed preset that ran in this study (or why it has no ratio)."""
    out: dict[str, dict[str, Any]] = {}
    for t in study.get_trials(deepcopy=False):
        preset = t.user_attrs.get(Key.PRESET)
        if not preset or t.state.name in ("WAITING", "RUNNING"):
            continue
        if is_ok(t) and best is not None and t.value:
            out[preset] = {
                "trial": t.number,
                "objective": t.value,
                "ratio": cast(float, best.value) / t.value,
            }  # best: ok, so valued
        else:
            out.setdefault(preset, {"trial": t.number, "status": t.user_attrs.get(Key.STATUS), "ratio": None})
    return out


def write_summary(
    study: Study,
    sweep_dir: Path,
    *,
    storage_url: str,
    objective: str,
    top_k: int,
    headroom: float | None,
    quiet: bool = False,
    stopped: Stop | None = None,
    recipe: dict | None = None,
    price_tags: dict | None = None,
    learning: tuple[Any, dict] | None = None,
    learning_tolerance: float | None = None,
) -> dict:
    """The sweep's summary built (`build_summary`), written and, unless `quiet`, printed with report.html's path.

    Args:
        study: the study, as every worker reads it.
        sweep_dir: where trials.csv, the exports, best.yaml and report.html go.
        storage_url: the storage (shown masked).
        objective: the metric the sweep ranks by.
        top_k: the rows of the printed table.
        headroom: hydra.sweeper.headroom, recorded beside the winner.
        quiet: write, do not print.
        stopped: a failures.Stop when a systematic failure ended the sweep (said, and in the dict).
        recipe: the recipe every trial held (best.yaml `recipe:`).
        price_tags: concessions.price_tags, what the winner gave up and what it bought.
        learning: standings.learning_verdict(study, learning_tolerance), when the caller has it.
        learning_tolerance: hydra.sweeper.learning_tolerance.

    Returns:
        best.yaml's content, with `report` when report.html was written.
    """
    ruling, flagged = learning or learning_verdict(study, learning_tolerance)  # the median-of-runs rule, noise, tie
    columns, data = rows(study, flagged)
    summary = build_summary(
        study,
        data,
        ruling,
        flagged,
        storage_url=storage_url,
        objective=objective,
        headroom=headroom,
        stopped=stopped,
        recipe=recipe,
        price_tags=price_tags,
        learning_tolerance=learning_tolerance,
    )
    write_files(study, sweep_dir, summary, columns, data, recipe)
    if quiet:
        return summary
    print_summary(
        study, sweep_dir, summary, ruling, flagged, objective=objective, top_k=top_k, recipe=recipe, price_tags=price_tags
    )
    report = write_html_report(study, sweep_dir)
    if report is not None:
        print(f"Report: {report}")
        summary["report"] = str(report)
    print(f"Dashboard: {summary['dashboard']}")
    if stopped is not None:
        print(stop_words(stopped, summary["trials"].get("WAITING", 0)))
    return summary


def build_summary(
    study: Study,
    data: list[dict],
    ruling: Any,
    flagged: dict,
    *,
    storage_url: str,
    objective: str,
    headroom: float | None,
    stopped: Stop | None,
    recipe: dict | None,
    price_tags: dict | None,
    learning_tolerance: float | None,
) -> dict:
    """best.yaml's content from the study, its rows (`rows`) and the verdict, without writing anything.

    Args:
        study: the study.
        data: `rows(study, flagged)`'s rows, for the count of each state.
        ruling: the verdict with the learning check applied (standings.learning_verdict).
        flagged: the trials that changed the learning.
        storage_url: as write_summary's.
        objective: as write_summary's.
        headroom: as write_summary's.
        stopped: as write_summary's.
        recipe: as write_summary's.
        price_tags: as write_summary's.
        learning_tolerance: as write_summary's.

    Returns:
        The summary; `export` is filled in by write_files.
    """
    ranked_finalists = ruling.ranked  # the winner first under the learning check's rule
    best = ranked_finalists[0].item if ranked_finalists else None
    states: dict[str, int] = {}
    for row in data:
        label = "infeasible" if row["feasible"] is False and row["state"] == "COMPLETE" else row["state"]
        states[label] = states.get(label, 0) + 1
    summary: dict[str, Any] = {
        "study": study.study_name,
        "storage": mask(storage_url),
        "objective": objective,
        "direction": study.direction.name.lower(),
        "trials": states,
        "dashboard": dashboard_command(storage_url),
    }
    if recipe:
        summary["recipe"] = recipe
    if price_tags:
        summary["concessions"] = {k: v for k, v in price_tags.items() if k != "recipe"}
    if stopped is not None:
        summary["stopped"] = stopped.as_dict()
    summary.update(learning_summary(ruling, flagged, learning_tolerance))
    if best is None:
        return summary
    summary.update(_winner(study, ruling, headroom))
    summary.update(_soak_and_confirmation(study, best))
    return summary


def _winner(study: Study, ruling: Any, headroom: float | None) -> dict:
    """best.yaml's fields for the winner (ruling.ranked[0]): value, point, memory, reward, rerun command, noise.

    Args:
        study: the study.
        ruling: the verdict with the learning check applied; it ranks at least one config.
        headroom: as write_summary's.

    Returns:
        The fields, in best.yaml's order.
    """
    best = ruling.ranked[0].item
    attrs = best.user_attrs
    return {
        "best_trial": best.number,
        "best_value": ruling.ranked[0].median,
        "params": dict(best.params),
        "levers": attrs.get(Key.LEVERS),
        "peak_memory_bytes": attrs.get(Key.PEAK_MEMORY_BYTES),
        "predicted_peak_bytes": attrs.get(Key.PREDICTED_PEAK_BYTES),
        "budget_bytes": attrs.get(Key.BUDGET_BYTES),
        # "still learns" beside the throughput: mean reward, and last quarter - first quarter of steps
        "reward_mean": attrs.get(Key.REWARD_MEAN),
        "reward_change": attrs.get(Key.REWARD_CHANGE),
        "reward_seconds_per_step": attrs.get(Key.REWARD_SECONDS_PER_STEP),  # the reward functions' time
        "card_limit": limit_words(attrs),  # memory/throughput.py: the step against the card's peaks
        "headroom": headroom,
        "run_dir": attrs.get(Key.RUN_DIR),
        "overrides": attrs.get(Key.OVERRIDES),
        "command": command_line(best),
        "vs_presets": vs_presets(study, best),
        **noise_summary(ruling, chosen=best_rule.competing(study.user_attrs) is not None),
    }


def _soak_and_confirmation(study: Study, best: FrozenTrial) -> dict:
    """What ran after the search: the soak (a warning on the winner's) and the confirmation rounds."""
    summary: dict[str, Any] = {}
    soaked = study.user_attrs.get(SOAK_ATTR)
    if soaked:
        running = soaked.get("status") == Status.RUNNING  # which worker runs it is said; else no worker
        summary["soak"] = {k: v for k, v in soaked.items() if k != "started_unix" and (k != "worker" or running)}
        if soaked.get("warning") and soaked.get("trial") == best.number:  # its soak says the winner may not hold
            summary["soak_warning"] = soaked["warning"]
    confirmation = ConfirmationState.from_dict(study.user_attrs.get(Key.CONFIRMATION))
    if confirmation:
        summary["confirmation"] = confirmation.to_dict() | {"runs": len(confirmation.runs)}
    return summary


def write_files(study: Study, sweep_dir: Path, summary: dict, columns: list[str], data: list[dict], recipe: dict | None) -> None:
    """trials.csv always; with a winner, its exports (summary `export`) and best.yaml. Each atomically.

    Args:
        study: the study.
        sweep_dir: where the files go.
        summary: best.yaml's content (build_summary).
        columns: trials.csv's columns.
        data: trials.csv's rows.
        recipe: the recipe every trial held, for the exports.
    """
    import yaml

    sweep_dir.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(data)
    write_atomic(sweep_dir / "trials.csv", buf.getvalue())
    if "best_trial" not in summary:
        return
    summary["export"] = export_best(summary.get("run_dir"), sweep_dir, study.study_name, held=recipe)
    write_atomic(sweep_dir / "best.yaml", yaml.dump(summary, Dumper=_plain_dumper(), sort_keys=False))


def print_summary(
    study: Study,
    sweep_dir: Path,
    summary: dict,
    ruling: Any,
    flagged: dict,
    *,
    objective: str,
    top_k: int,
    recipe: dict | None,
    price_tags: dict | None,
) -> None:
    """The console's summary: states, top trials, finalists, notes, learning check, recipe, winner, its lines.

    Args:
        study: the study.
        sweep_dir: the sweep directory the lines name.
        summary: best.yaml's content (build_summary).
        ruling: the verdict with the learning check applied.
        flagged: the trials that changed the learning.
        objective: the metric the sweep ranks by.
        top_k: the rows of the printed table.
        recipe: the recipe every trial held.
        price_tags: concessions.price_tags, what the winner gave up and what it bought.
    """
    states = summary["trials"]
    print(f"\n=== Study {study.study_name}: {states} ===")
    best = ruling.ranked[0].item if ruling.ranked else None
    if best is None:
        why = why_no_best(study)
        if "stopped" not in summary or NOTHING_FITS not in why:  # a stopped sweep ends with its reason, not a memory verdict
            print(why)
        return
    ok = best_rule.ranked(
        [t for t in study.get_trials(deepcopy=False) if is_ok(t)], value=lambda t: t.value, direction=study.direction
    )
    print(table(ok, objective, top_k, changed=set(flagged), unchecked=set(getattr(flagged, "unchecked", ()))))
    print(finalist_table(summary, objective))
    for note in ("tie_note", "lead_note"):
        if summary.get(note):
            print(summary[note])
    if said := learning_lines(ruling, flagged, len(ok)):
        print(said)
    if recipe:
        print("\nRecipe held: " + " ".join(f"{k}={fmt(v)}" for k, v in recipe.items() if v is not None))
    if price_tags:
        print(describe(price_tags, objective) if "error" not in price_tags else f"Concessions not priced: {price_tags['error']}")
    reward = best.user_attrs.get(Key.REWARD_MEAN)
    print(
        f"\nBest: trial {best.number}, {objective}={summary['best_value']:.4g}"
        + (f", reward {reward:.3f}" if reward is not None else "")
    )
    reward_s, step_s = best.user_attrs.get(Key.REWARD_SECONDS_PER_STEP), best.user_attrs.get(Key.STEP_TIME_S)
    if reward_s is not None and step_s:
        print(f"  reward functions: {reward_s:.3g} s per step, {100 * reward_s / step_s:.1f}% of the step time")
    if summary.get("card_limit"):
        print(f"  runs at {summary['card_limit']}")
    for preset, info in summary["vs_presets"].items():
        if info.get("ratio"):
            print(f"  vs {preset}: {info['ratio']:.2f}x ({info['objective']:.4g})")
        else:
            print(f"  vs {preset}: {preset} did not run ok ({info.get('status')}): no ratio")
    if summary.get("soak"):
        print(soak_words(summary["soak"]))
    if summary.get("soak_warning"):
        print(f"Run it (not recommended as it is: {summary['soak_warning']}):\n  {summary['command']}")
    else:
        print(f"Run it:\n  {summary['command']}")
    exported = summary.get("export") or {}
    if exported.get("files"):
        print(
            f"Run it in TRL:\n  trl grpo --config {shlex.quote(str(sweep_dir / 'best.trl.yaml'))}"
            f"   (also: {', '.join(exported['files'][1:])})"
        )
    elif exported.get("error"):
        print(f"Not exported for TRL: {exported['error']}")
    print(f"Wrote {sweep_dir / 'best.yaml'} and {sweep_dir / 'trials.csv'}")


def export_best(run_dir: str | None, sweep_dir: Path, study_name: str, held: dict | None = None) -> dict:
    """best.trl.yaml, best_grpo_config.py (and best_unsloth.py) beside best.yaml (grpo_sweep.report.export).

    Args:
        run_dir: the best trial's run directory.
        sweep_dir: where the exports go.
        study_name: the study's name.
        held: the recipe every trial held.

    Returns:
        {"files": the names written}, or {"error": why}: best.yaml says it, and the summary is still written.
    """
    if not run_dir:
        return {"error": "the best trial has no run directory"}
    try:
        from grpo_sweep.report.export import export_trial

        files = export_trial(Path(run_dir), sweep_dir, prefix="best", sweep=study_name, held=held)
        return {"files": [p.name for p in files]}
    except Exception as err:  # noqa: BLE001 - the study and trials.csv are already written
        return {"error": f"{type(err).__name__}: {err}"}


def write_html_report(study: Study, sweep_dir: Path) -> Path | None:
    """report.html with its figures for every trial; one that cannot be drawn says why, never costing the summary."""
    try:
        from grpo_sweep.report.build import build_for_study, counts
        from grpo_sweep.report.trials import model_trust_line, model_vs_measured

        path, trials = build_for_study(study, sweep_dir)
        print(f"Report of {counts(trials)}")
        print(model_trust_line(model_vs_measured(trials)))  # how far to trust the model's ranking on this card
        return path
    except Exception as err:  # noqa: BLE001 - the study and best.yaml are already written
        print(f"Report not written ({type(err).__name__}: {err}); run: grpo-sweep report {sweep_dir}")
        return None
