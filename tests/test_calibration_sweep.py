"""Calibration moves the pre-screen's verdict both ways, on real tiny sweeps (real TRL trials on the
CPU tensor tracker's simulated card).

Each sweep runs three small measured points first (calibration needs 3: hydra.sweeper.prescreen_calibrate),
then a point X whose card is set from X's own raw prediction so that the fixed 10 % margin and the
calibrated prediction disagree:

- worst-case lengths (the estimator's own assumption: measured / predicted within a few percent):
  the card is 1/1.05 of X's raw prediction. The fixed margin would run X (5 % over is within
  10 %) and X runs out of memory (checked with a real trial); calibrated (factor ~0.99, allowance
  ~3 %) the sweep prunes it.
- natural lengths (trial.worst_case_lengths=false: completions end at EOS, so the raw worst-case
  prediction over-predicts by tens of percent): the card is 1/1.3 of X's raw prediction. The fixed
  margin would prune X; calibrated, the sweep runs it and it fits.
"""

from __future__ import annotations

import pytest
from helpers.config import compose
from helpers.runners import SPLIT_SPACE, load_metrics, read_csv, sweep_args, train_here
from helpers.studies import load_study

from grpo_sweep.memory.estimator import estimate
from grpo_sweep.metrics import KEYS
from hydra_plugins.grpo_optuna_sweeper.outcome import prescreen_verdict

# tiny_cpu's recipe (8 completions per step, 128 tokens) and card; the sweeps search the split and checkpointing.
SMALL = [(1, "false"), (2, "false"), (1, "true")]  # (per_device_train_batch_size, gradient_checkpointing)
X = (4, "false")


def _point(batch: int, ckpt: str) -> str:
    return f"{{per_device_train_batch_size:{batch},gradient_checkpointing:{ckpt}}}"


def _overrides(point: tuple) -> list[str]:
    return ["+sweeps=tiny_cpu", f"per_device_train_batch_size={point[0]}", f"gradient_checkpointing={point[1]}"]


def _sweep(tmp_path, card_gib: float, *extra: str):
    points = ",".join(_point(*p) for p in [*SMALL, X])
    cmd = sweep_args(
        tmp_path,
        *SPLIT_SPACE,
        "hydra.sweeper.n_trials=4",
        f"hydra.sweeper.enqueue=[{points}]",
        f"gpu.memory_gib={card_gib!r}",
        *extra,
    )
    result = train_here(cmd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return load_study(f"journal:{tmp_path / 'study.journal'}")


def _raw(*extra: str) -> int:
    return estimate(compose([*_overrides(X), *extra])).total_bytes


def test_the_fixed_margin_runs_x_on_the_first_card_and_prunes_it_on_the_second():
    """The premise of both sweeps below, from the estimator alone: on the card 1/1.05 of X's raw
    prediction the fixed 10 % margin would run X; on the card 1/1.3 of it (natural lengths), prune it.
    Calibration must then turn each verdict around."""
    natural = "trial.worst_case_lengths=false"
    for extra, ratio, verdict in (((), 1.05, None), ((natural,), 1.3, "PRUNED")):
        raw = _raw(*extra)
        est = estimate(compose([*_overrides(X), *extra, f"gpu.memory_gib={raw / ratio / 2**30!r}"]))
        assert est.total_bytes == raw  # the card sets the budget, not the prediction
        outcome = prescreen_verdict(raw, est.budget_bytes, 0.10)
        assert (outcome and outcome.state) == verdict, (ratio, raw, est.budget_bytes)


@pytest.mark.slow
def test_calibration_prunes_a_point_the_fixed_margin_would_run_into_an_oom(tmp_path):
    """Over 20 s: a real 4-trial sweep, and X run alone."""
    raw = _raw()
    card = raw / 1.05 / 2**30
    study = _sweep(tmp_path / "sweep", card)
    budget = study.trials[0].user_attrs["budget_bytes"]
    x = study.trials[3]
    assert [t.user_attrs["status"] for t in study.trials[:3]] == ["ok", "ok", "ok"]
    assert x.state.name == "PRUNED" and x.user_attrs["status"] == "pruned", x.user_attrs
    a = x.user_attrs
    assert a["predicted_peak_bytes"] == raw and a["prescreen_calibration_trials"] == 3
    assert prescreen_verdict(raw, budget, 0.10) is None  # the fixed margin would have run it
    assert a["predicted_calibrated_bytes"] > budget * (1 + a["prescreen_allowance"])
    # The estimator is close here (measured / predicted within a few %), so the allowance is far below 10 %.
    assert abs(a["prescreen_correction"] - 1) < 0.03 and a["prescreen_allowance"] < 0.05
    assert "calibrated prediction" in a["error"] and "from 3 measured trials" in a["error"]
    # What the fixed margin would have launched: the same point on the same card, run for real, OOMs.
    out = tmp_path / "x"
    one = train_here([*_overrides(X), f"gpu.memory_gib={card!r}", f"hydra.run.dir={out}"])
    assert load_metrics(out)["status"] == "oom", one.stdout[-2000:] + one.stderr[-2000:]
    rows = read_csv(tmp_path / "sweep" / "trials.csv")
    assert rows[3]["predicted_calibrated_bytes"] and float(rows[3]["prescreen_correction"]) == pytest.approx(
        a["prescreen_correction"]
    )


@pytest.mark.slow
def test_calibration_runs_a_point_the_fixed_margin_would_prune(tmp_path):
    """Over 20 s: a real 4-trial sweep."""
    natural = "trial.worst_case_lengths=false"
    raw = _raw(natural)
    card = raw / 1.3 / 2**30
    study = _sweep(tmp_path, card, natural)
    budget = study.trials[0].user_attrs["budget_bytes"]
    x = study.trials[3]
    a = x.user_attrs
    assert prescreen_verdict(raw, budget, 0.10).state == "PRUNED"  # the fixed margin would have pruned it
    assert x.state.name == "COMPLETE" and a["status"] == "ok", a
    assert a["prescreen_calibration_trials"] == 3 and a["prescreen_correction"] < 1 / 1.3
    assert a["peak_memory_bytes"] <= budget  # and it fits: the prune would have been wrong
    m = load_metrics(a["run_dir"])
    assert m["predicted_peak_bytes"] == raw and m["predicted_calibrated_bytes"] == a["predicted_calibrated_bytes"]
    assert m["prescreen_correction"] == a["prescreen_correction"] and m["prescreen_calibration_scope"] in (
        "backend/phase",
        "backend",
    )
    assert m["logits_mode"] == "chunked" and m["logits_mode_trl_version"]
    assert set(m) <= KEYS, set(m) - KEYS  # every key declared in metrics.TrialMetrics
