"""`grpo-sweep doctor`: explain an OOM message and print the smallest set of overrides that fits.

The diagnosis is pure arithmetic (grpo_sweep.memory.doctor); only `--verify`, which runs a real
trial with the suggested overrides, reaches the trial side (and torch).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..config.schema import validate
from ..memory.doctor import apply_dotlist, diagnose, format_report, load_config, read_message
from ..memory.doctor import gib_text as fmt
from ..memory.estimator import target_device
from ..memory.oom_message import forms_text, parse_oom_message
from .estimate import split_args

USAGE = """usage: grpo-sweep doctor --message FILE|-|metrics.json [HYDRA_OVERRIDES ...] [logits_mode=full|chunked]
                          [--json] [--verify]

  grpo-sweep doctor --message oom.txt model=gemma3_1b gpu=l4_24g preset=seed_baseline"""


def verify(cfg: Any, overrides: list[str]) -> dict:
    """Run a real trial with the overrides (grpo_sweep.trial.run_trial) and return its record."""
    import time

    from ..trial.parent import run_trial

    new = apply_dotlist(cfg, overrides)
    run_dir = Path("outputs") / "doctor" / time.strftime("%Y-%m-%d_%H-%M-%S")
    record = run_trial(new, run_dir)
    record["run_dir"] = str(run_dir)
    return record


def unreadable(source: str, text: str) -> str:
    """Said plainly when the message holds nothing the parser knows: where, and what it looked for."""
    where = "stdin" if source == "-" else source
    what = "it is empty" if not text.strip() else f"it begins {text.strip()[:120]!r}"
    return (
        f"grpo-sweep doctor: could not read an out-of-memory message in {where} ({what}); no advice without one.\n"
        f"It looked for one of these (with any log prefixes, timestamps or line breaks):\n{forms_text()}\n"
        "Paste the whole error (the traceback's last lines), or pass the trial's metrics.json."
    )


def cli(argv: list[str]) -> int:
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0 if argv else 2
    args = list(argv)
    as_json = "--json" in args
    do_verify = "--verify" in args
    args = [a for a in args if a not in ("--json", "--verify")]
    source = None
    rest = []
    i = 0
    while i < len(args):
        if args[i] == "--message" and i + 1 < len(args):
            source = args[i + 1]
            i += 2
            continue
        if args[i].startswith("--message="):
            source = args[i].split("=", 1)[1]
        else:
            rest.append(args[i])
        i += 1
    if source is None:
        print("grpo-sweep doctor: --message FILE is required\n" + USAGE, file=sys.stderr)
        return 2
    try:
        overrides, mode, _ = split_args(rest)
        text, config_path, fields = read_message(source)
        cfg = load_config(config_path, overrides)
        # Keys and ranges as train.py checks them (a `+typo` is an error here too), for the target card.
        validate(cfg, cuda=target_device(cfg) == "cuda")
        # The trial already parsed its OOM against the emulated card (capped free memory): those win.
        parsed = {**parse_oom_message(text), **fields}
        if not parsed:
            print(unreadable(source, text), file=sys.stderr)
            return 2
        result = diagnose(cfg, parsed, mode)
    except Exception as exc:  # noqa: BLE001 - any bad input ends in one clear line
        print(f"grpo-sweep doctor: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if do_verify and result.overrides:
        record = verify(cfg, result.overrides)
        result.verify = {
            k: record.get(k) for k in ("status", "peak_memory_bytes", "memory_source", "tokens_per_s", "error", "run_dir")
        }
    if as_json:
        slim = result.to_dict()
        slim["estimate"] = {k: result.estimate[k] for k in ("total_bytes", "budget_bytes", "components", "fits")}
        print(json.dumps(slim, sort_keys=True, default=str))
        return 0
    print(format_report(result, cfg))
    if result.verify is not None:
        v = result.verify
        print(
            f"verify: trial {v['status']} | peak {fmt(v['peak_memory_bytes'])} ({v['memory_source']}) | "
            f"tokens/s {v['tokens_per_s'] or 0:.1f} | {v['run_dir']}" + (f" | {v['error'][:160]}" if v["error"] else "")
        )
    return 0
