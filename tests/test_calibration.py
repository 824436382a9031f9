"""The pre-screen's calibration (hydra_plugins.grpo_optuna_sweeper.calibration): pure functions over
the study's finished trials, checked against numbers worked out by hand, and the sweeper's own
pre-screen (prescreen.Prescreen) using them (a real Optuna study; no trial runs here: tests/test_calibration_sweep.py runs
real sweeps)."""

from __future__ import annotations

import math

import pytest

from hydra_plugins.grpo_optuna_sweeper import calibration as cal
from hydra_plugins.grpo_optuna_sweeper.outcome import prescreen_verdict

MIB = 2**20


def _attrs(measured, predicted=100 * MIB, *, status="ok", backend="trl", phase="backward", gen=None, **extra):
    phases = {"training": predicted, "generation": gen if gen is not None else predicted // 2}
    return {
        "status": status,
        "backend": backend,
        "peak_phase": phase,
        "peak_memory_bytes": measured,
        "predicted_phases": phases,
        **extra,
    }


def test_observation_reads_a_trial_and_skips_what_it_cannot_compare():
    o = cal.observation(_attrs(112 * MIB))
    assert (o.backend, o.phase, o.predicted, o.measured, o.lower_bound) == ("trl", "training", 100 * MIB, 112 * MIB, False)
    g = cal.observation(_attrs(60 * MIB, phase="generation", gen=50 * MIB))
    assert (g.phase, g.predicted) == ("generation", 50 * MIB)
    # An OOM: at least budget + deficit was needed.
    oom = cal.observation(_attrs(None, status="oom", budget_bytes=96 * MIB, deficit_bytes=20 * MIB))
    assert (oom.measured, oom.lower_bound) == (116 * MIB, True)
    assert cal.observation(_attrs(None, status="oom", budget_bytes=96 * MIB)) is None  # no deficit: no bound
    assert cal.observation(_attrs(112 * MIB, status="failed")) is None
    assert cal.observation(_attrs(112 * MIB, memory_source="cpu-rss")) is None  # process RSS is not the card
    assert cal.observation({"status": "ok", "backend": "trl", "peak_memory_bytes": 1}) is None  # no prediction (pruned by hand)
    assert cal.observation(_attrs(0)) is None


def test_prior_until_enough_trials_then_the_fit_by_hand():
    obs = cal.observations([_attrs(110 * MIB), _attrs(115 * MIB)])
    prior = cal.correct(obs, "trl", "training", margin=0.10)
    assert (prior.factor, prior.allowance, prior.trials, prior.scope) == (1.0, 0.10, 0, "prior")
    obs = cal.observations([_attrs(m * MIB) for m in (110, 115, 112)])
    c = cal.correct(obs, "trl", "training", margin=0.10)
    logs = [math.log(r) for r in (1.10, 1.15, 1.12)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    assert c.factor == pytest.approx(math.exp(mean)) and c.trials == 3 and c.scope == "backend/phase"
    assert c.allowance == pytest.approx(1.645 * sd * math.sqrt(1 + 1 / 3))
    # Identical ratios: the allowance floor, not zero.
    same = cal.observations([_attrs(88 * MIB)] * 4)
    assert cal.correct(same, "trl", "training", 0.10).allowance == cal.FLOOR
    assert cal.correct(same, "trl", "training", 0.10).factor == pytest.approx(0.88)
    # Another backend's trials do not calibrate this one; the backend's other phase does, as a fallback.
    assert cal.correct(same, "trl_vllm", "training", 0.10).scope == "prior"
    assert cal.correct(same, "trl", "generation", 0.10).scope == "backend"
    assert cal.correct(obs, "trl", "training", 0.10, min_trials=4).scope == "prior"


def test_calibrate_corrects_each_phase_and_takes_the_larger():
    train = [_attrs(m * MIB) for m in (120, 120, 120)]  # training under-predicted by 20 %
    gen = [_attrs(40 * MIB, phase="generation", gen=50 * MIB) for _ in range(3)]  # generation over by 25 %
    obs = cal.observations(train + gen)
    c = cal.calibrate({"training": 100 * MIB, "generation": 110 * MIB}, "trl", obs, 0.10)
    # 100 x 1.2 = 120 > 110 x 0.8 = 88: training sets the calibrated peak, though generation's raw was larger.
    assert c.raw_bytes == 110 * MIB and c.calibrated_bytes == pytest.approx(120 * MIB, rel=1e-9) and c.phase == "training"
    assert c.factor == pytest.approx(120 / 110) and c.trials == 3
    assert set(c.attrs()) == set(cal.Calibrated.attr_keys())
    none = cal.calibrate({"training": 100 * MIB, "generation": 110 * MIB}, "trl", [], 0.10)
    assert (none.calibrated_bytes, none.factor, none.allowance, none.scope) == (110 * MIB, 1.0, 0.10, "prior")


def test_calibration_moves_the_verdict_both_ways_by_hand():
    """The same raw prediction and budget, judged with the fixed margin and calibrated."""
    budget = 100 * MIB
    # Raw 105 MiB: within the 10 % margin (runs); the trials say the estimator under-predicts by 12 %.
    under = cal.observations([_attrs(m * MIB) for m in (112, 112.5, 111.5)])
    c = cal.calibrate({"training": 105 * MIB, "generation": 1}, "trl", under, 0.10)
    assert prescreen_verdict(105 * MIB, budget, 0.10) is None
    pruned = prescreen_verdict(c.calibrated_bytes, budget, c.allowance, raw_bytes=c.raw_bytes, trials=c.trials)
    assert (
        pruned.state == "PRUNED"
        and "calibrated prediction" in pruned.attrs["error"]
        and "from 3 measured trials" in pruned.attrs["error"]
    )
    # Raw 115 MiB: over the margin (pruned); the trials say it over-predicts by 15 %.
    over = cal.observations([_attrs(m * MIB) for m in (85, 85.5, 84.5)])
    c = cal.calibrate({"training": 115 * MIB, "generation": 1}, "trl", over, 0.10)
    assert prescreen_verdict(115 * MIB, budget, 0.10).state == "PRUNED"
    assert prescreen_verdict(c.calibrated_bytes, budget, c.allowance, raw_bytes=c.raw_bytes, trials=c.trials) is None


def test_the_sweepers_prescreen_learns_from_the_study(tmp_path):
    """Prescreen.learn / verdict on a real study: three measured trials over-predicted by
    20 % turn a point the margin prunes into one that runs, with raw, calibrated and correction in
    its user attributes (trials.csv's columns) and in the trial's override (metrics.json)."""
    from helpers.config import compose
    from helpers.studies import create_study
    from helpers.sweeper import plugin_sweeper, prescreen_point

    from grpo_sweep.memory.estimator import estimate
    from grpo_sweep.units import budget_bytes

    point = ["+sweeps=tiny_cpu", "max_seq_length=128", "per_device_train_batch_size=4"]
    est = estimate(compose(point))
    predicted = est.total_bytes
    gib = predicted / 1.2 / 2**30  # the raw prediction is 20 % over this card: the 10 % margin prunes
    cfg = compose([*point, f"gpu.memory_gib={gib!r}"])
    sweeper = plugin_sweeper(tmp_path, prescreen_margin=0.10)
    study = create_study(sweeper.plan)
    sweeper.prescreen.learn(study)
    assert prescreen_point(sweeper, study.ask(), cfg, budget_bytes(cfg)).state == "PRUNED"
    for _ in range(3):  # measured trials of the same backend: 0.8 x their prediction
        t = study.ask()
        for key, value in _attrs(int(0.8 * est.phases["training"]), est.phases["training"], gen=est.phases["generation"]).items():
            t.set_user_attr(key, value)
        study.tell(t, 1.0)
    sweeper.prescreen.learn(study)
    trial = study.ask()
    assert prescreen_point(sweeper, trial, cfg, budget_bytes(cfg)) is None
    attrs = trial.user_attrs
    assert attrs["predicted_peak_bytes"] == predicted and attrs["prescreen_calibration_trials"] == 3
    assert attrs["prescreen_correction"] == pytest.approx(0.8, rel=1e-3)
    assert attrs["predicted_calibrated_bytes"] == pytest.approx(0.8 * predicted, rel=1e-3)
    # hydra.sweeper.prescreen_calibrate=0: the fixed margin only.
    fixed = plugin_sweeper(tmp_path / "fixed", prescreen_margin=0.10, prescreen_calibrate=0)
    fixed.prescreen.learn(study)
    assert prescreen_point(fixed, study.ask(), cfg, budget_bytes(cfg)).state == "PRUNED"


def test_the_report_figure_and_table_show_raw_and_calibrated(tmp_path):
    """report.html's predicted-vs-measured figure draws the calibrated prediction beside the raw one
    (a hollow marker joined to it), and the trials table gains the calibrated and correction columns."""
    import matplotlib

    matplotlib.use("Agg")
    from grpo_sweep.report import figures, trials_table
    from grpo_sweep.report.trials import Trial

    rec = {"status": "ok", "tokens_per_s": 10.0, "peak_memory_bytes": 90 * MIB, "predicted_peak_bytes": 100 * MIB}
    calibrated = [
        Trial(f"trial {i}", {**rec, "predicted_calibrated_bytes": 91 * MIB, "prescreen_correction": 0.91}, number=i)
        for i in range(2)
    ]
    raw_only = [Trial("trial 9", dict(rec), number=9)]
    drawn = []
    original = figures.plt.Axes.scatter

    def spy(self, *args, **kwargs):
        drawn.append(kwargs.get("facecolors"))
        return original(self, *args, **kwargs)

    figures.plt.Axes.scatter = spy
    try:
        assert figures.predicted_vs_measured(calibrated, tmp_path / "both.png").stat().st_size > 5000
        hollow_with = drawn.count("none")
        drawn.clear()
        assert figures.predicted_vs_measured(raw_only, tmp_path / "raw.png") is not None
        hollow_without = drawn.count("none")
    finally:
        figures.plt.Axes.scatter = original
    assert hollow_with == 3 and hollow_without == 0  # two calibrated points + the legend's marker
    headers = [header for _, header, _ in trials_table._columns(calibrated)]
    assert "calibrated GiB" in headers and "correction" in headers
    assert "calibrated GiB" not in [header for _, header, _ in trials_table._columns(raw_only)]
