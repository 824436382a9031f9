"""The soak (hydra.sweeper.soak_steps): after the sweep the winner runs N more steps, each step's own
peak measured, and best.yaml and the report say whether memory grew. The rule by hand; a real tiny
sweep (`python train.py -m +sweeps=tiny_cpu`, a real journal storage) with a soak."""

from __future__ import annotations

import json

import pytest
import yaml
from test_sweeper_helpers import SMALL, counted, load_study, run_here, sweep_cmd

from hydra_plugins.grpo_optuna_sweeper import soak

MIB = 2**20


def test_the_trend_says_whether_memory_grew():
    """Grew: the last quarter's largest step peak more than 2 % above the first timed step's (step 2;
    step 1 creates the optimiser state and may peak higher). The slope: least squares over the timed steps."""
    flat = [{"step": 1, "step_peak_memory_bytes": 120 * MIB}] + [
        {"step": s, "step_peak_memory_bytes": 100 * MIB} for s in range(2, 10)
    ]
    out = soak.trend(flat)
    assert (out["grew"], out["first_timed_step"], out["first_peak_bytes"], out["last_peak_bytes"]) == (
        False,
        2,
        100 * MIB,
        100 * MIB,
    )
    assert out["slope_bytes_per_step"] == 0 and out["step_peaks"][0] == [1, 120 * MIB]
    creep = [{"step": s, "step_peak_memory_bytes": (100 + s) * MIB} for s in range(1, 10)]  # 1 MiB a step
    out = soak.trend(creep)
    assert out["grew"] is True and out["slope_bytes_per_step"] == pytest.approx(MIB)
    assert (out["first_peak_bytes"], out["last_peak_bytes"]) == (102 * MIB, 109 * MIB)
    within = [{"step": 2, "step_peak_memory_bytes": 100 * MIB}, {"step": 3, "step_peak_memory_bytes": 101 * MIB}]
    assert soak.trend(within)["grew"] is False  # 1 % above: under the 2 % threshold
    assert soak.trend([{"step": 1, "step_peak_memory_bytes": 5}])["grew"] is None  # one step: no trend
    assert soak.trend([{"step": 1}, {"step": 2}])["why"] == "0 timed steps with a peak: no trend"
    line = soak.words({"status": "ok", "trial": 3, "steps": 9, **soak.trend(creep)})
    assert line.startswith("Soak of trial 3, 9 steps: memory GREW: step 2 peaked at 102.0 MiB, the last steps at 109.0 MiB")
    assert soak.words({"status": "oom", "trial": 3, "error": "OutOfMemoryError"}) == "Soak of trial 3: oom (OutOfMemoryError)"
    assert soak.overrides(["a=1"], "s", 50) == [
        "a=1",
        "trial.study=s",
        "trial.steps=50",
        "trial.soak=true",
        "hydra.sweep.subdir=soak",
    ]


@pytest.mark.slow
def test_a_soak_records_per_step_peaks_and_leaves_the_winner(tmp_path):
    """One search trial (every knob fixed, SMALL), then its soak of 4 steps: the soak job's metrics.json
    has each step's own peak, the study records the trend, best.yaml's `soak:` and report.html say
    whether memory grew, and the study still holds one trial, the winner. Over 20 s on a loaded
    machine: two real trials, every step of the soak under the tensor tracker."""
    result = run_here(
        sweep_cmd(
            tmp_path,
            "hydra.sweeper.n_trials=1",
            "hydra.sweeper.confirm_top=0",
            "hydra.sweeper.soak_steps=4",
            *SMALL,
        )
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(f"journal:{tmp_path / 'study.journal'}")
    assert len(study.trials) == len(counted(study)) == 1 and study.trials[0].user_attrs["status"] == "ok"
    record = json.loads((tmp_path / "soak" / "metrics.json").read_text())
    assert record["status"] == "ok" and record["steps"] == 4
    peaks = [r["step_peak_memory_bytes"] for r in record["history"]]
    assert len(peaks) == 4 and all(p > 0 for p in peaks)
    assert max(peaks) == record["peak_memory_bytes"]  # the trial's peak is its largest step's
    found = study.user_attrs["soak"]
    assert (found["trial"], found["steps"], found["status"]) == (0, 4, "ok")
    assert found["step_peaks"] == [[r["step"], r["step_peak_memory_bytes"]] for r in record["history"]]
    assert isinstance(found["grew"], bool) and found["first_timed_step"] == 2
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["best_trial"] == 0 and best["trials"] == {"COMPLETE": 1}
    assert best["soak"]["grew"] == found["grew"] and best["soak"]["run_dir"] == str(tmp_path / "soak")
    assert soak.words(found) in result.stdout
    assert "id=soak-note" in (tmp_path / "report.html").read_text()


def test_a_soak_trial_measures_each_steps_own_peak():
    """trial.soak=true: the CPU tracker runs on every step (not only the first two), and each step's
    peak starts again at the step's start: a later, smaller step shows its own peak, not the trial's."""
    from types import SimpleNamespace

    import torch
    from conftest import compose

    from grpo_sweep.trial.measure.memory_meter import MemoryMeter

    assert MemoryMeter(compose(["gpu=cpu"]), on_cuda=False).track_steps == 2  # without a soak: two measured steps
    meter = MemoryMeter(compose(["gpu=cpu", "trial.soak=true"]), on_cuda=False)
    assert meter.per_step and meter.track_steps is None
    hook = meter.callback()  # the trainer calls it at each step's start
    with meter.running():
        hook.on_step_begin(None, SimpleNamespace(global_step=0), None)
        big = torch.zeros(1 << 20)  # 4 MiB
        del big
        first = meter.step_peak()
        hook.on_step_begin(None, SimpleNamespace(global_step=1), None)
        small = torch.zeros(1 << 10)  # 4 KiB
        del small
        second = meter.step_peak()
    assert (first, second) == (4 * MIB, 4096)
    assert meter.probe()[0] == 4 * MIB  # the trial's peak is still the largest step's
