"""`grpo-sweep export <sweep dir> [--trial N] [--out DIR]`: a trial's configuration in the user's own
stack (report/export.py): `<prefix>.trl.yaml` for `trl grpo --config`, `<prefix>_grpo_config.py`
(GRPOConfig, LoraConfig, BitsAndBytesConfig) and, for backend=unsloth, `<prefix>_unsloth.py`;
with --trl-version 0.22, `<prefix>.trl-0.22.yaml` in that TRL's names.
Without --trial: the sweep's best (best.yaml), written as best.*; with --trial N: trialN.*.
A single run's directory (python train.py ...) works too: it is its own trial.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..config.schema import ConfigError
from ..report.export import ExportError, best_trial_number, export_trial, export_trl_version, held_recipe, trial_run_dir


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="grpo-sweep export", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="a sweep directory (best.yaml, trials.csv) or one run directory")
    parser.add_argument("--trial", type=int, default=None, help="the trial number (default: the sweep's best)")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: the sweep directory)")
    parser.add_argument("--force", action="store_true", help="export a trial that did not finish ok (the files say so)")
    parser.add_argument(
        "--trl-version",
        default=None,
        help="also write <prefix>.trl-<version>.yaml with that TRL's names (e.g. 0.22, Unsloth's pin)",
    )
    args = parser.parse_args(argv)
    try:
        if not args.sweep_dir.is_dir():
            raise ExportError(f"{args.sweep_dir}: no such directory")
        if (args.sweep_dir / "metrics.json").exists() and args.trial is None:
            run_dir, prefix = args.sweep_dir, "best"
        else:
            number = best_trial_number(args.sweep_dir) if args.trial is None else args.trial
            run_dir, prefix = trial_run_dir(args.sweep_dir, number), "best" if args.trial is None else f"trial{number}"
        files = export_trial(
            run_dir, args.out or args.sweep_dir, prefix=prefix, held=held_recipe(args.sweep_dir), force=args.force
        )
        if args.trl_version:
            files.append(export_trl_version(run_dir, args.out or args.sweep_dir, args.trl_version, prefix=prefix))
    except (ExportError, ConfigError, OSError) as err:
        print(f"grpo-sweep export: {err}", file=sys.stderr)
        return 2
    for path in files:
        print(f"Wrote {path}")
    trl_file = next((p for p in files if p.name.endswith(".trl.yaml")), None)
    if trl_file is not None:
        print(f"Run it in TRL:\n  trl grpo --config {shlex.quote(str(trl_file))}")
    return 0
