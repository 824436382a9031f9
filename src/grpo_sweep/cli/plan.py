"""`grpo-sweep plan`: a sweep's forecast before any trial, from the same overrides as `train.py -m`.

The sweeper plugin owns the sweep's plan (the space, the held recipe, the pre-screen), and the CLI
may not import the plugin (ARCHITECTURE.md: peers of one layer stay apart), so this command runs the
app itself, `python -m grpo_sweep -m ARGS hydra.sweeper.plan_only=true`: the sweeper builds its plan
exactly as a sweep would, prints the forecast (hydra_plugins.grpo_optuna_sweeper.preview) and stops
before the study's storage opens. No trial runs and nothing imports torch (the sweep's parent
never does). `--json` prints the forecast as data instead.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from ..config.schema import ConfigError
from ..config.trl_config import expand

USAGE = """usage: grpo-sweep plan [HYDRA_OVERRIDES ...] [trl_config=my.yaml] [--json]

Before any trial, what a sweep's space holds: its size, how many points the pre-screen predicts to
fit, the predicted fastest points with their peak and headroom, the cheapest concession when the
full recipe cannot fit. The overrides are those of `python train.py -m`, e.g.
  grpo-sweep plan +sweeps=tiny_cpu_vllm
  grpo-sweep plan +sweeps=gemma3_1b_l4 gpu=a100_40g --json"""


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
