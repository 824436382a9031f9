"""`grpo-sweep report <multirun dir | optuna storage>`: compare every trial in one HTML page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..metrics import METRICS_FILE
from ..report.build import build, counts
from ..report.learning import key_of, verdict_lines
from ..report.trials import learning_check, load_dir, overrides, trials_from_study, wandb_group
from ..study.storage import SQLITE_SUFFIXES, SWEEP_JOURNAL, StorageError, is_journal, load_study


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grpo-sweep report",
        description="Compare the trials of a Hydra multirun directory or an Optuna study: writes "
        "report.html with PNG figures (and, with --wandb, a W&B Report).",
    )
    p.add_argument(
        "source",
        nargs="?",
        help="multirun/sweep directory, or Optuna storage (sqlite:///x.db, postgresql://..., a .db file or a journal file)",
    )
    p.add_argument("--study", help="study name in the storage (needed when it holds several)")
    p.add_argument("--out", help="output directory (default: the multirun directory, or outputs/reports/<study> for a storage)")
    p.add_argument("--wandb", action="store_true", help="also build a W&B Report of the same comparison")
    p.add_argument("--project", help="W&B project (default: logger.project of the trials)")
    p.add_argument("--entity", help="W&B entity (default: logger.entity, else your default entity)")
    p.add_argument("--publish", metavar="SPEC_JSON", help="publish a W&B Report spec written offline")
    return p


def cli(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.publish:
        from ..report.wandb_report import publish

        return publish(Path(args.publish), entity=args.entity)
    if not args.source:
        _parser().error("give a multirun directory or an Optuna storage (or --publish SPEC_JSON)")
    study = None
    root = Path(args.source)
    journal = root / SWEEP_JOURNAL if root.is_dir() else None
    if journal is not None and journal.exists():
        # A sweep directory: its study holds every trial (pruned and pre-screened ones have no run
        # directory), so read the study next to the trials rather than only their metrics.json files.
        try:
            study = load_study(f"journal:{journal}", args.study)
        except StorageError as err:
            print(f"grpo-sweep report: {err}", file=sys.stderr)
            return 2
        trials = trials_from_study(study)
        title = f"grpo-sweep report: study {study.study_name} ({root})"
        out = Path(args.out) if args.out else root
    elif root.is_dir():
        trials = load_dir(root)
        title = f"grpo-sweep report: {root}"
        out = Path(args.out) if args.out else root
    else:
        source = args.source
        if "://" not in source and not source.startswith("journal:"):
            if not root.exists():
                print(f"grpo-sweep report: {source!r} is neither a directory, a storage URL nor a file", file=sys.stderr)
                return 2
            if not is_journal(source) and root.suffix not in SQLITE_SUFFIXES:
                source = f"journal:{source}"  # a journal file under any name
        try:
            study = load_study(source, args.study)
        except StorageError as err:
            print(f"grpo-sweep report: {err}", file=sys.stderr)
            return 2
        trials = trials_from_study(study)
        title = f"grpo-sweep report: study {study.study_name}"
        out = Path(args.out) if args.out else Path("outputs/reports") / study.study_name
        root = None
    if not trials:
        print(f"grpo-sweep report: no trials found in {args.source} (no {METRICS_FILE} files)", file=sys.stderr)
        return 1
    path = build(trials, out, title=title, study=study)
    print(f"report: {path}  ({counts(trials)})")
    verdict, flagged = learning_check(trials)
    ranked = verdict.ranked
    if ranked:
        best = ranked[0].item
        runs = f" (median of {len(ranked[0].runs)} runs)" if len(ranked[0].runs) > 1 else ""
        print(f"best: {best.name}  {best.objective_name} {ranked[0].median:.1f}{runs}\n  {overrides(best)}")
    names = {key_of(t): t.name for t in trials}
    for line in verdict_lines(verdict, flagged, key_of, lambda k: names.get(k, str(k))):
        print(f"  {line}")
    if unchecked := sorted(names.get(k, str(k)) for k in getattr(flagged, "unchecked", ())):
        print(f"  learning unchecked: {', '.join(unchecked)} (no other config of its recipe and seed ran)")
    if args.wandb:
        from ..report.wandb_report import build_and_save

        group = wandb_group(trials, study.study_name if study else None, root)
        build_and_save(trials, out, group=group, title=title, project=args.project, entity=args.entity)
    return 0
