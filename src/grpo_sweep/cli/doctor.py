"""`grpo-sweep doctor`: explain an OOM message and print the smallest set of overrides that fits.

The diagnosis is pure arithmetic (grpo_sweep.memory.doctor); only `--verify`, which runs a real
trial with the suggested overrides, reaches the trial side (and torch).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ..config.validate import validate
from ..memory.doctor import HEADROOM, Diagnosis, diagnose
from ..memory.oom_message import forms_text, parse_oom_message
from ..memory.shapes import target_device
from ..units import GIB, MIB
from .estimate import split_args

USAGE = """usage: grpo-sweep doctor --message FILE|-|metrics.json [HYDRA_OVERRIDES ...] [logits_mode=full|chunked]
                          [--json] [--verify]

  grpo-sweep doctor --message oom.txt model=gemma3_1b gpu=l4_24g preset=seed_baseline"""


def gib_text(n) -> str:
    """GiB with two decimals; below 0.1 GiB in MiB (a simulated CPU card's sizes would read 0.00 GiB)."""
    if n is None:
        return "?"
    return f"{n / GIB:.2f} GiB" if abs(n) >= 0.1 * GIB else f"{n / MIB:.2f} MiB"


def format_report(r: Diagnosis) -> str:
    p = r.parsed
    out = []
    stated = ", ".join(f"{k}={gib_text(v) if k.endswith('_bytes') else v}" for k, v in p.items()) or "nothing read"
    out.append(f"message: {stated}")
    out.append(
        f"deficit: {gib_text(r.deficit_bytes)} short"
        + (f" (the run needed at least {gib_text(r.observed_need_bytes)})" if r.observed_need_bytes else "")
    )
    e = r.estimate
    out.append(
        f"estimate for this config: {gib_text(e['total_bytes'])} of {gib_text(e['budget_bytes'])} "
        f"(logits_mode={r.logits_mode}: {r.logits_mode_source}; dominant {e['dominant']})"
    )
    if r.unexplained_bytes:
        out.append(f"unexplained by the estimate: {gib_text(r.unexplained_bytes)} (kept in every candidate below)")
    if r.stack_upgrade:
        u = r.stack_upgrade
        out.append(
            f"stack: {u['what']}: frees {gib_text(u['saving_bytes'])}"
            + (" and fits on its own: the cheapest fix" if u["fits"] else ", not enough on its own")
        )
    if r.speed:
        s = r.speed
        out.append(f"speed: {s['what']}: {' '.join(s['overrides'])} (about {s['speedup_pct']:+.1f} % tokens/s)")
    if r.fragmentation:
        out.append(f"allocator: {r.fragmentation['why']}: try expandable_segments=true first (no speed cost)")
    out.append("levers (ranked by GiB freed per % of throughput lost):")
    for row in r.levers:
        ratio = "free" if row["gib_per_pct"] is None else f"{row['gib_per_pct']:.3g} GiB/%"
        flag = "  [changes the experiment]" if row["changes_experiment"] else ""
        flag += "  [needs more GPUs]" if row.get("needs_hardware") else ""
        out.append(
            f"  {row['lever']:<62} saves {row['saving_bytes'] / GIB:6.2f} GiB  "
            f"speed {-row['speed_cost_pct']:+6.1f} %  {ratio}{flag}"
        )
    a = r.after  # set whenever a change set (possibly none) fits
    if a is not None and r.fits_as_is:
        out.append(
            f"this config fits as it is: it needs {gib_text(a['need_bytes'])} "
            f"(the estimate + what the message proves beyond it) of {gib_text(r.limit_bytes)} "
            f"(the card with {int(HEADROOM * 100)} % headroom), so no lever needs to change. "
            "If it ran out of memory anyway, the run differed from this config (another card, other "
            "processes on the card, fragmentation) or the estimate misses something: check the "
            "overrides, or run a real trial with --verify."
        )
    elif a is not None and r.overrides:
        out.append(
            f"smallest change that fits with >= {int(HEADROOM * 100)} % headroom "
            f"(needs {gib_text(a['need_bytes'])}, speed {-a['speed_cost_pct']:+.1f} %):"
        )
        out.append("  " + " ".join(r.overrides))
        if r.fastest:
            f = r.fastest
            out.append(f"faster, with more changes (needs {gib_text(f['need_bytes'])}, speed {-f['speed_cost_pct']:+.1f} %):")
            out.append("  " + " ".join(f["overrides"]))
    elif r.limit_bytes is None:
        out.append("no budget known: pass gpu=<card> or gpu.memory_gib=...")
    else:
        out.append("no combination of these levers fits: use a larger card or a smaller model")
    return "\n".join(out)


def read_message(source: str) -> tuple[str, Path | None, dict]:
    """The message text, the config.yaml beside a metrics.json (or None), and fields the record parsed."""
    if source == "-":
        return sys.stdin.read(), None, {}
    path = Path(source)
    if not path.exists():
        raise ValueError(f"--message {source}: no such file")
    text = path.read_text()
    if path.suffix == ".json":
        record = json.loads(text)
        fields = {
            k: record[k] for k in ("requested_bytes", "free_bytes", "total_bytes", "deficit_bytes") if record.get(k) is not None
        }
        config = path.with_name("config.yaml")
        return record.get("error") or "", config if config.exists() else None, fields
    return text, None, {}


def load_config(config_path: Path | None, overrides: list[str]):
    from ..config.compose import compose_train_config

    if config_path is None:
        return compose_train_config(overrides)
    cfg = OmegaConf.load(config_path)
    for item in overrides:
        key = item.partition("=")[0]
        if key in ("model", "gpu", "backend", "task", "preset", "lora", "quant", "logger"):
            raise ValueError(f"{item}: a trial's config.yaml is already composed; set keys (e.g. gpu.memory_gib=22)")
    return apply_dotlist(cfg, overrides)


def apply_dotlist(cfg: Any, overrides: list[str]):
    """`key=value` overrides with YAML-typed values (2 -> int, true -> bool, [a,b] -> list)."""
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides))) if overrides else cfg


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
        overrides, mode, _, _ = split_args(rest)
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
    print(format_report(result))
    if result.verify is not None:
        v = result.verify
        print(
            f"verify: trial {v['status']} | peak {gib_text(v['peak_memory_bytes'])} ({v['memory_source']}) | "
            f"tokens/s {v['tokens_per_s'] or 0:.1f} | {v['run_dir']}" + (f" | {v['error'][:160]}" if v["error"] else "")
        )
    return 0
