"""Trial start: wall time from "trial requested" (run_trial called) to "first GRPO step starts".

Cold: the first trial of a fresh process (the forkserver imports torch/transformers/trl).
Warm: later trials, forked from the already-warm forkserver (no CUDA initialised before fork).
`spawn` is shown for comparison: every trial is cold. Goal: warm <= 2 s on a 2-core machine.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, write_result

WARM_TRIALS = 3


def latencies(start_method: str) -> list[float]:
    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.trial.parent import run_trial

    cfg = compose_train_config(
        ["trial.steps=1", "task.num_prompts=64", "model.init=random", f"trial.start_method={start_method}"]
    )
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(1 + WARM_TRIALS):
            record = run_trial(cfg, Path(tmp) / str(i))
            if record["status"] != "ok":
                raise RuntimeError(record["error"])
            out.append(record["start_latency_s"])
    return out


def main() -> dict:
    fork = latencies("forkserver")
    spawn = latencies("spawn")
    result = {
        "cold_start_s": fork[0],
        "warm_start_s": median(fork[1:]),
        "spawn_cold_s": spawn[0],
        "spawn_later_s": median(spawn[1:]),
        "forkserver_all_s": fork,
        "spawn_all_s": spawn,
    }
    table = [
        {"start method": "forkserver (default)", "first trial (s)": fork[0], "later trials, median (s)": median(fork[1:])},
        {"start method": "spawn", "first trial (s)": spawn[0], "later trials, median (s)": median(spawn[1:])},
    ]
    write_result("trial_start", result, table, "Trial start: requested -> first GRPO step (tiny model, CPU)")
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
