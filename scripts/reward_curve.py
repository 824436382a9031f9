"""Draw a run's reward curve (the report's figure) to a PNG, e.g. docs/getting-started.md's learn-experiment curve:

    python train.py +experiment=learn hydra.run.dir=outputs/learn
    python scripts/reward_curve.py outputs/learn docs/learn_reward_curve.png

Prints the first and last quarter's mean reward (what "reward rises" is judged on).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    from grpo_sweep.report.figures import reward_curves
    from grpo_sweep.report.trials import load_dir

    run_dir, out = Path(argv[0]), Path(argv[1])
    trials = load_dir(run_dir)
    if not trials:
        print(f"reward_curve: no metrics.json under {run_dir}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        png = reward_curves(trials, Path(tmp) / "reward_curves.png")
        if png is None:
            print(f"reward_curve: no trial under {run_dir} logged a reward", file=sys.stderr)
            return 1
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, out)
    for t in trials:
        r = t.record
        print(
            f"{t.name}: {len(r.get('history') or [])} steps, reward first {r.get('reward_first')}, "
            f"last {r.get('reward_last')}, last quarter - first quarter {r.get('reward_change')}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
