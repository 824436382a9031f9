"""`grpo-sweep <command>`: the tools around trials. Each command lives in its own module.

Commands take Hydra overrides (the same names as train.py) where they need a config.
"""

from __future__ import annotations

import importlib
import sys

# command -> (module, help); each module exposes `cli(argv: list[str]) -> int`.
COMMANDS = {
    "estimate": ("grpo_sweep.cli.estimate", "predict peak memory for a config, without a GPU"),
    "plan": ("grpo_sweep.cli.plan", "before a sweep: its space, what fits, the predicted fastest points"),
    "doctor": ("grpo_sweep.cli.doctor", "explain an OOM message and print overrides that fit"),
    "report": ("grpo_sweep.cli.report", "compare the trials of a multirun or an Optuna study"),
    "export": ("grpo_sweep.cli.export", "write a trial's config for trl grpo, GRPOConfig and Unsloth"),
}


def usage() -> str:
    lines = ["usage: grpo-sweep <command> [args]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] not in COMMANDS:
        print(f"grpo-sweep: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.cli(argv[1:]) or 0)
