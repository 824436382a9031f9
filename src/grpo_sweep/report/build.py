"""Build report.html from trials: the one path the `grpo-sweep report` command and the sweeper's
end-of-sweep report both take (load, mark the seed presets, draw, write)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..study.attrs import Key
from .html import write_report
from .trials import CATEGORIES, Trial, load_presets, match_preset, param_importances, trials_from_study


def build(trials: list[Trial], out: Path, *, title: str, study: Any = None) -> Path:
    """Write report.html (and its figures) for `trials` into `out`; the study adds importances.

    Args:
        trials: The study's trials, read back.
        out: The folder the report is written into.
        title: The page's title.
        study: The Optuna study, for the importances; None: none.

    Returns:
        report.html's path.
    """
    presets = load_presets()
    for t in trials:
        t.preset = t.preset or match_preset(t.levers, presets)
    importances, note = param_importances(study) if study is not None else ({}, None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tags = study.user_attrs.get(Key.PRICE_TAGS) if study is not None else None  # the sweeper's concessions.price_tags
    soak = study.user_attrs.get(Key.SOAK) if study is not None else None  # the sweeper's soak of the winner
    confirmation = study.user_attrs.get(Key.CONFIRMATION) if study is not None else None  # what its rounds spent
    return write_report(
        trials,
        out,
        title=title,
        importances=importances,
        importance_note=note,
        concessions=tags,
        soak=soak,
        confirmation=confirmation,
    )


def build_for_study(study: Any, out: Path) -> tuple[Path, list[Trial]]:
    """report.html for every trial of an Optuna study (pruned, OOM, failed included)."""
    trials = trials_from_study(study)
    return build(trials, out, title=f"grpo-sweep report: study {study.study_name}", study=study), trials


def counts(trials: list[Trial]) -> str:
    """`N trials: a feasible, b oom, ...` for a one-line summary."""
    by = {c: sum(t.category == c for t in trials) for c in CATEGORIES}
    return f"{len(trials)} trials: " + ", ".join(f"{n} {c}" for c, n in by.items() if n)
