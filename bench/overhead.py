"""Framework overhead: our trial runner vs a bare TRL GRPOTrainer script, interleaved in one run.

Both run the same config on the tiny CPU model in fresh processes, alternating A, B, A, B so
that machine noise hits both alike. The figure is the ratio of steady-state median step times
(first step excluded). Goal: <= 1.05.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, median, run_python, write_result

OVERRIDES = ["trial.steps=12", "task.num_prompts=128", "max_seq_length=128", "model.init=random"]  # speed: weights do not matter
# A budget keeps the tensor tracker on for every step (without one it runs on steps 1-2 only).
TRACKER_OVERRIDES = ["gpu=cpu_sim", "gpu.memory_gib=64"]


def ours(extra: list[str]) -> list[float]:
    with tempfile.TemporaryDirectory() as out:
        done = run_python(["train.py", *OVERRIDES, *extra, f"hydra.run.dir={out}"])
        metrics = json.loads((Path(out) / "metrics.json").read_text()) if done.returncode == 0 else None
    if not metrics or metrics["status"] != "ok":
        raise RuntimeError(f"our trial failed: {done.stderr[-2000:]}")
    rows = metrics["history"][1:]  # the first step is warm-up
    if not extra:  # the default trial: its throughput comes from the steps the tracker did not watch
        rows = [row for row in rows if not row.get("tracked")]
    return [row["step_time_s"] for row in rows]


def bare() -> list[float]:
    done = run_python([str(ROOT / "bench" / "bare_trl.py"), *OVERRIDES])
    if done.returncode != 0:
        raise RuntimeError(f"bare TRL failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["step_times"][1:]


def main(rounds: int = 3, tracker_overrides: list[str] | None = None) -> dict:
    ours_times, bare_times, tracker_times = [], [], []
    for _ in range(rounds):
        ours_times += ours([])
        bare_times += bare()
        if tracker_overrides:
            tracker_times += ours(tracker_overrides)
    result = {
        "config": OVERRIDES,
        "rounds": rounds,
        "ours_median_step_s": median(ours_times),
        "bare_median_step_s": median(bare_times),
        "overhead_ratio": median(ours_times) / median(bare_times),
    }
    table = [
        {"runner": "bare TRL GRPOTrainer", "median step (s)": result["bare_median_step_s"], "ratio": 1.0},
        {"runner": "grpo-sweep trial", "median step (s)": result["ours_median_step_s"], "ratio": result["overhead_ratio"]},
    ]
    if tracker_times:
        result["tracker_median_step_s"] = median(tracker_times)
        result["tracker_overhead_ratio"] = median(tracker_times) / median(ours_times)
        table.append(
            {
                "runner": "grpo-sweep trial + memory tracker",
                "median step (s)": median(tracker_times),
                "ratio": median(tracker_times) / median(bare_times),
            }
        )
    write_result("overhead", result, table, "Framework overhead (tiny model, CPU, steady-state step time)")
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
