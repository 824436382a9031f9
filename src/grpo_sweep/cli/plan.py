"""`grpo-sweep plan`: a sweep's forecast before any trial, from the same overrides as `train.py -m`.

The sweeper plugin owns the sweep's plan (the space, the held recipe, the pre-screen), and the CLI
may not import the plugin (ARCHITECTURE.md: peers of one layer stay apart), so this command runs the
app itself, `python -m grpo_sweep -m ARGS hydra.sweeper.plan_only=true`: the sweeper builds its plan
exactly as a sweep would, prints the forecast (hydra_plugins.grpo_optuna_sweeper.preview) and stops
before the study's storage opens. No trial runs and nothing imports torch (the sweep's parent
never does). `--json` prints the forecast as data instead.

`--cards a,b,...` compares cards for one recipe instead (no sweep): for each card, whether the
config fits (memory.estimator) and its speed (memory.throughput.speed_forecast).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from ..config.schema import ConfigError
from ..config.trl_config import expand

USAGE = """usage: grpo-sweep plan [HYDRA_OVERRIDES ...] [trl_config=my.yaml] [--json]
       grpo-sweep plan --cards t4_16g,l4_24g,a100_40g,h100_80g [HYDRA_OVERRIDES ...] [--json]

Before any trial, what a sweep's space holds: its size, how many points the pre-screen predicts to
fit, the predicted fastest points with their peak and headroom, the cheapest concession when the
full recipe cannot fit. The overrides are those of `python train.py -m`, e.g.
  grpo-sweep plan +sweeps=tiny_cpu_vllm
  grpo-sweep plan +sweeps=gemma3_1b_l4 gpu=a100_40g --json
With --cards: one recipe (the overrides, no sweep) on each card: whether it fits, seconds per step
(worst case and expected), the run's time for task.max_steps, and the GPU-minutes of a sweep whose
trials (hydra.sweeper.n_trials's default) all run the recipe."""


def compare_cards(cards: list[str], overrides: list[str]) -> list[dict]:
    """One row per card: fits (the estimator's verdict), headroom, and the speed forecast (None: the card has
    no datasheet speeds, `speed_error` says why)."""
    from ..config.compose import compose_train_config
    from ..config.schema import ConfigError
    from ..config.validate import validate
    from ..memory.estimator import estimate
    from ..memory.shapes import target_device
    from ..memory.throughput import SWEEP_N_TRIALS, speed_forecast

    rows = []
    for card in cards:
        cfg = compose_train_config([*overrides, f"gpu={card}"])
        validate(cfg, cuda=target_device(cfg) == "cuda")
        est = estimate(cfg)
        row: dict = {"card": card, "fits": est.fits, "headroom_bytes": est.headroom_bytes, "speed": None}
        try:
            row["speed"] = speed_forecast(cfg, n_trials=SWEEP_N_TRIALS)
        except ConfigError as exc:
            row["speed_error"] = str(exc)
        rows.append(row)
    return rows


def cards_table(rows: list[dict]) -> str:
    """The comparison as text: one line per card."""
    from ..memory.throughput import format_duration

    lines = [
        f"{'card':<14} {'fits':<5} {'s/step worst':>12} {'s/step expected':>15} {'run (worst)':>14} {'run (expected)':>15} "
        f"{'sweep GPU-min':>13}"
    ]
    for r in rows:
        sp = r["speed"]
        if sp is None:
            lines.append(f"{r['card']:<14} {str(r['fits']).lower():<5} speed not modelled: {r.get('speed_error')}")
            continue
        run = sp["run_s"]
        worst, expected = ("-", "-") if run is None else (format_duration(run["worst_case"]), format_duration(run["expected"]))
        lines.append(
            f"{r['card']:<14} {str(r['fits']).lower():<5} {sp['worst_case']['step_s']:>12.3g} "
            f"{sp['expected']['step_s']:>15.3g} {worst:>14} {expected:>15} {sp['sweep']['gpu_minutes']:>13.3g}"
        )
    if rows and rows[0]["speed"] and rows[0]["speed"]["run_s"] is None:
        lines.append("run time: set task.max_steps=N")
    if rows and rows[0]["speed"]:
        lines.append(f"sweep: {rows[0]['speed']['sweep']['assumption']}")
    return "\n".join(lines)


def command(overrides: list[str], json_path: Path | None) -> list[str]:
    """The app's command line that prints the plan (and writes it as JSON to json_path)."""
    cmd = [sys.executable, "-m", "grpo_sweep", "-m", "hydra/sweeper=grpo_optuna", *overrides, "hydra.sweeper.plan_only=true"]
    if json_path is not None:
        cmd.append(f"hydra.sweeper.plan_json={json_path}")
    return cmd


def cli(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    as_json = "--json" in argv
    try:
        overrides = expand([a for a in argv if a != "--json"])  # trl_config=my.yaml: its overrides
    except ConfigError as err:
        print(f"grpo-sweep plan: {err}", file=sys.stderr)
        return 2
    if "--cards" in overrides:
        at = overrides.index("--cards")
        if at + 1 >= len(overrides):
            print("grpo-sweep plan: --cards needs a comma-separated list of conf/gpu names", file=sys.stderr)
            return 2
        cards = [c for c in overrides[at + 1].split(",") if c]
        try:
            rows = compare_cards(cards, overrides[:at] + overrides[at + 2 :])
        except Exception as exc:  # noqa: BLE001 - a bad override or card: one line
            print(f"grpo-sweep plan: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(rows, sort_keys=True) if as_json else cards_table(rows))
        return 0
    if not as_json:
        return subprocess.run(command(overrides, None), check=False).returncode
    try:
        with tempfile.TemporaryDirectory(prefix="grpo-sweep-plan-") as tmp:
            path = Path(tmp) / "plan.json"
            # The app's own lines (Hydra's log, the text plan) are not data: kept off stdout, shown on a failure.
            done = subprocess.run(command(overrides, path), check=False, stdout=subprocess.PIPE, text=True)
            if done.returncode != 0 or not path.exists():
                sys.stderr.write(done.stdout[-3000:])
                return done.returncode or 1
            print(path.read_text())
    except OSError as err:  # no temporary folder (a full or missing TMPDIR): one line, no traceback
        print(
            f"grpo-sweep plan --json: cannot use a temporary folder in {tempfile.gettempdir()} ({err.strerror or err}); "
            "set TMPDIR to a writable folder with free space",
            file=sys.stderr,
        )
        return 1
    return 0
