"""The soak (hydra.sweeper.soak_steps): after the sweep the winner runs N more steps, each step's own
peak measured, and best.yaml and the report say whether memory grew. The rule by hand; a real tiny
sweep (`python train.py -m +sweeps=tiny_cpu`, a real journal storage) with a soak."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers.runners import SMALL, sweep_args, train_here
from helpers.studies import counted, load_study

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
    assert line.startswith(
        "Soak of trial 3, 9 steps: memory GREW: step 2 peaked at 102.0 MiB, the highest (step 9) at 109.0 MiB, "
        "the last steps at 109.0 MiB"
    )
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
    result = train_here(
        sweep_args(
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
    from helpers.config import compose

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


def _steps(peaks_mib: dict[int, float]) -> list[dict]:
    return [{"step": s, "step_peak_memory_bytes": int(p * MIB)} for s, p in sorted(peaks_mib.items())]


def test_the_soak_judges_its_highest_step_peak():
    """A step-8 peak of 1.9x step 2's, the last quarter back at step 2's: the soak's highest step
    counts (grew, and its step named), not only its last quarter. Against a budget the spike passes,
    the verdict is over the budget, and the winner gets a warning."""
    spike = _steps({**{s: 100.0 for s in range(1, 13)}, 8: 190.0})
    out = soak.trend(spike)
    assert (out["grew"], out["highest_step"], out["highest_peak_bytes"], out["last_peak_bytes"]) == (
        True,
        8,
        190 * MIB,
        100 * MIB,
    )
    record = {"trial": 3, "steps_asked": 12}
    fits = soak.judge(record, {"status": "ok", "steps": 12, "history": spike, "budget_bytes": 400 * MIB})
    assert fits["over_budget"] is False and fits["warning"] == (
        "trial 3's memory rose in its soak: step 8 peaked at 190.0 MiB, 90% above step 2's"
    )
    tight = soak.judge(record, {"status": "ok", "steps": 12, "history": spike, "budget_bytes": 150 * MIB})
    assert (tight["over_budget"], tight["over_budget_step"]) == (True, 8)
    assert tight["warning"] == "trial 3's config peaked over the budget (190.0 of 150.0 MiB) at step 8 of its soak"
    assert soak.words(tight).endswith(f"WARNING: {tight['warning']}")
    flat = soak.judge(record, {"status": "ok", "steps": 12, "history": _steps({s: 100.0 for s in range(1, 13)})})
    assert flat["grew"] is False and flat["warning"] is None and "over_budget" not in flat


def test_a_soak_timeout_scales_with_its_steps_and_its_record_has_the_steps_that_ran():
    """The soak job's trial.timeout_s is the trials' own scaled by soak_steps / trial.steps; the
    record's `steps` is what metrics.json says finished (75), beside `steps_asked`; an OOM names
    the step it ran out of memory at."""
    assert soak.timeout_s(600.0, 3, 100000) == 600.0 * 100000 / 3
    assert soak.timeout_s(600.0, 3, 2) == 600.0  # never below the trials' own
    assert "trial.timeout_s=20000000.0" in soak.overrides(["a=1"], "s", 100000, 2e7)
    ran = soak.judge({"trial": 0, "steps_asked": 100000}, {"status": "timeout", "steps": 75, "history": []})
    assert (ran["steps"], ran["steps_asked"]) == (75, 100000)
    assert soak.words(ran).startswith("Soak of trial 0, 75 of 100000 steps: timeout")
    oom = soak.judge({"trial": 0, "steps_asked": 10}, {"status": "oom", "steps": 7, "history": _steps({1: 9, 2: 9})})
    assert oom["warning"] == "trial 0's config ran out of memory at step 8 of its 10-step soak"


def _study_with_one_winner(tmp_path):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize", storage=f"sqlite:///{tmp_path / 's.db'}")
    trial = study.ask({"b": optuna.distributions.CategoricalDistribution([1, 2])})
    trial.set_user_attr("status", "ok")
    trial.set_user_attr("overrides", ["b=1"])
    study.tell(trial, 100.0)
    return study


def test_a_soak_oom_flags_the_winner_in_best_yaml_the_summary_and_the_report(tmp_path, capsys):
    """The winner's soak ran out of memory at step 8: best.yaml has `soak_warning` and the soak's
    own record (steps 7 of 10), the printout says `Run it` is not recommended as it is, and
    report.html flags the winner in its Best config section."""
    from hydra_plugins.grpo_optuna_sweeper.summary import write_summary

    study = _study_with_one_winner(tmp_path)
    metrics = {"status": "oom", "error": "OutOfMemoryError", "steps": 7, "history": _steps({1: 9, 2: 9, 7: 9})}
    study.set_user_attr(soak.SOAK_ATTR, soak.judge({"trial": 0, "steps_asked": 10, "worker": "h:1"}, metrics))
    write_summary(study, tmp_path, storage_url="sqlite:///s.db", objective="tokens_per_s", top_k=5, headroom=None)
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    warning = "trial 0's config ran out of memory at step 8 of its 10-step soak"
    assert best["soak_warning"] == best["soak"]["warning"] == warning
    assert (best["soak"]["steps"], best["soak"]["steps_asked"], best["soak"]["status"]) == (7, 10, "oom")
    assert "worker" not in best["soak"]
    out = capsys.readouterr().out
    assert f"Run it (not recommended as it is: {warning}):" in out
    assert f"Soak of trial 0, 7 of 10 steps: oom (OutOfMemoryError). WARNING: {warning}" in out
    report = (tmp_path / "report.html").read_text()
    best_section = report[report.index("<h2>Best config</h2>") : report.index("<h2>Soak</h2>")]
    assert "id=soak-warning" in best_section and warning.replace("'", "&#x27;") in best_section


def test_an_interrupted_soak_says_so_with_the_command_that_resumes_it(tmp_path):
    """SIGTERM while the soak job runs: the record is `interrupted` with the sweep's own command,
    which a resumed sweep runs again (due); best.yaml and the printout say so. A second worker
    finding a soak `running` names the worker that runs it."""
    import signal
    import types

    from omegaconf import OmegaConf

    from grpo_sweep.report.html import soak_html
    from hydra_plugins.grpo_optuna_sweeper.loop import Interrupted, Loop

    study = _study_with_one_winner(tmp_path)
    launched = []

    def launch(jobs, initial_job_idx):
        launched.extend(jobs)
        raise Interrupted(signal.SIGTERM)

    def compose(point):
        return OmegaConf.create({"trial": {"timeout_s": 60.0, "steps": 3}})

    compose.config = OmegaConf.create(
        {
            "hydra": {
                "overrides": {
                    "hydra": ["hydra.mode=MULTIRUN", "hydra.sweeper.soak_steps=30"],
                    "task": ["+sweeps=tiny_cpu", "name=a b"],
                }
            }
        }
    )
    settings = types.SimpleNamespace(study_name="s")
    loop = types.SimpleNamespace(
        study=study,
        plan=types.SimpleNamespace(settings=settings, learning_tolerance=None, sweep_dir=tmp_path),
        compose=compose,
        launcher=types.SimpleNamespace(launch=launch),
        in_job=False,
        job_idx=0,
        _check_stop=lambda: None,
    )
    with pytest.raises(Interrupted):
        Loop._soak(loop, 30)
    assert "trial.timeout_s=600.0" in launched[0] and "trial.steps=30" in launched[0]
    record = study.user_attrs[soak.SOAK_ATTR]
    resume = "python train.py -m hydra.sweeper.soak_steps=30 +sweeps=tiny_cpu 'name=a b'"
    assert (record["status"], record["error"], record["resume"], record["steps"]) == ("interrupted", "SIGTERM", resume, None)
    assert (
        soak.words(record)
        == f"Soak of trial 0: interrupted (SIGTERM) before it recorded a step, no verdict; resume it with: {resume}"
    )
    assert soak.due(study, study.trials[0], 30, lambda worker, started: False)  # a resumed sweep runs it again
    page = soak_html(record)
    assert "trial 0's config, 30 steps: interrupted (SIGTERM)" in page and "None" not in page
    assert (
        "<pre id=soak-resume>python train.py -m hydra.sweeper.soak_steps=30 +sweeps=tiny_cpu &#x27;name=a b&#x27;</pre>" in page
    )
    running = {"trial": 0, "steps_asked": 30, "status": "running", "worker": "host:42"}
    assert soak.words(running) == (
        "Soak of trial 0, 30 steps: running in worker host:42, which writes its verdict into best.yaml when it ends"
    )
