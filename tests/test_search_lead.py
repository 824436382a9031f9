"""The model-led search (lead.py): the calibrated model's next point, the stop rule, the flat space,
on real Optuna studies as the sweeper records them, and a wrong model replayed on the shipped spaces."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from hydra_plugins.grpo_optuna_sweeper import lead, start
from hydra_plugins.grpo_optuna_sweeper.forecast import Forecast

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _forecasts(speeds: dict[int, float], shares: dict[int, float] | None = None) -> list[Forecast]:
    shares = shares or {}
    return [
        Forecast({"b": b}, predicted_bytes=shares.get(b, 0.5) * 1000, limit_bytes=1000, runs=True, tokens_per_s=s)
        for b, s in speeds.items()
    ]


def _study(runs: list[tuple[int, float, float]]):
    """An in-memory study whose trials ran `runs` ((b, measured tokens/s, predicted tokens/s)) as the
    sweeper records them (status ok, the pre-screen's predicted tokens/s, repeats pooled)."""
    import optuna

    from hydra_plugins.grpo_optuna_sweeper import confirm

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    space = {"b": optuna.distributions.CategoricalDistribution([1, 2, 3, 4, 5, 6])}
    for b, value, predicted in runs:
        study.enqueue_trial({"b": b})
        trial = study.ask(space)
        trial.set_user_attr("overrides", [f"b={b}"])
        confirm.mark_repeat(study, trial, [f"b={b}"])
        trial.set_user_attr("status", "ok")
        trial.set_user_attr("predicted_tokens_per_s", predicted)
        study.tell(trial, value)
    return study


def test_the_search_stops_when_the_model_predicts_nothing_better():
    """b=1 and b=2 ran at 100 and 90, where the model predicted 200 and 180 (calibrated: x0.5, its
    error under 1 %). The untried b=3..6 are predicted at 150 or less, 75 calibrated: none can beat
    100 by the noise plus 5 %, and the search stops with one line. Had b=6 been predicted at 240
    (120 calibrated), the model's next point is b=6 and the search goes on."""
    study = _study([(1, 100.0, 200.0), (2, 90.0, 180.0)])
    candidates = _forecasts({1: 200.0, 2: 180.0, 3: 150.0, 4: 140.0, 5: 120.0, 6: 100.0})
    line = lead.study_stop_line(study, candidates, 0.05)
    assert line is not None and line.startswith("Search stopped: the calibrated model predicts no untried point beats")
    assert "(100 tokens/s)" in line and "predicted at 75" in line
    faster = _forecasts({1: 200.0, 2: 180.0, 3: 150.0, 4: 140.0, 5: 120.0, 6: 240.0})
    assert lead.study_stop_line(study, faster, 0.05) is None
    assert lead.study_next_point(study, faster) == {"b": 6}
    # One measured config: the model's error is unknown, so it never stops on one trial.
    assert lead.study_stop_line(_study([(1, 100.0, 200.0)]), candidates, 0.05) is None


def test_a_queued_point_counts_as_tried_unless_the_rule_reads_it_withdrawn():
    """The sweeper runs every queued start point, so the stop rule counts it as tried; the bench's
    counterfactual (queued=False) reads it as untried: a waiting b=6 predicted at 240 (120 calibrated)
    then holds the search open."""
    import optuna

    study = _study([(1, 100.0, 200.0), (2, 90.0, 180.0)])
    study.enqueue_trial({"b": 6})
    assert any(t.state == optuna.trial.TrialState.WAITING for t in study.trials)
    assert lead.tried_keys(study) == lead.tried_keys(study, queued=False) | lead.tried_keys(_study([(6, 1.0, 1.0)]))
    candidates = _forecasts({1: 200.0, 2: 180.0, 3: 150.0, 6: 240.0})
    assert lead.study_stop_line(study, candidates, 0.05) is not None
    assert lead.study_stop_line(study, candidates, 0.05, queued=False) is None


def test_a_model_that_measures_wrong_keeps_the_search_going():
    """The same predictions, but b=2 ran at 150 where b=1 ran at 100 (the model said b=2 is 10 %
    slower): the model's measured error raises its untried predictions past the bar, so it goes on."""
    study = _study([(1, 100.0, 200.0), (2, 150.0, 180.0)])
    candidates = _forecasts({1: 200.0, 2: 180.0, 3: 150.0, 4: 140.0})
    records = [r for r in lead.measured_records(study)[0]]
    speed = lead.fit(records)
    assert lead.error(records, speed) > 0.2
    assert lead.study_stop_line(study, candidates, 0.05) is None


def test_a_flat_space_is_announced_and_its_safest_point_is_the_one_start():
    """Five of six runnable points are predicted within 5 % of the fastest: the start is `flat`, its
    one point the safest of them (the least predicted share of the budget), said in one line."""
    forecasts = _forecasts({1: 100.0, 2: 99.0, 3: 98.0, 4: 97.0, 5: 96.0, 6: 60.0}, shares={1: 0.9, 2: 0.8, 3: 0.4, 4: 0.6})
    mode, picks, _ = start.choose("model", forecasts, 5, 0, 0.05)
    assert (mode, picks) == ("flat", [{"b": 3}])
    found = lead.flat(forecasts, 0.05)
    assert found is not None and lead.flat_line(found, 0.05).startswith(
        "Flat space: the model predicts 5 of the 6 points the pre-screen lets run within 5% of the fastest"
    )
    # Spread out (only 2 of 6 within 5 %): the model start as before, fastest first.
    spread = _forecasts({1: 100.0, 2: 99.0, 3: 80.0, 4: 70.0, 5: 60.0, 6: 50.0})
    mode, picks, _ = start.choose("model", spread, 3, 0, 0.05)
    assert mode == "model" and picks == [{"b": 1}, {"b": 2}, {"b": 3}]
    assert start.choose("model", forecasts, 5, 0)[0] == "model"  # no zone given: no flat rule


@pytest.mark.parametrize("space", ["tiny_cpu_vllm", "gemma3_1b_l4_knobs"])
def test_a_wrong_model_still_reaches_a_good_point(space):
    """The replay of the sweep (bench/search_seconds.py: the sweeper's own start.choose, lead.py,
    confirm.phases and standings.verdict on a real Optuna study) with the model's forecast of every
    point disturbed by exp(N(0, 0.3)), at run noise 0.03: the pick lies within 5 % of the optimum
    in at least 9 of 10 seeds."""
    sys.path.insert(0, str(BENCH))
    import landscapes
    import search_seconds

    logging.getLogger("replay").setLevel(logging.WARNING)
    land = landscapes.tiny_cpu_vllm(sigma=0.03) if space == "tiny_cpu_vllm" else landscapes.gemma3_1b_l4_knobs(0.03)
    picks = [
        search_seconds.sweep(land, seed, n_trials=40, stop_below=0.5, confirm_top=3, lead=True, model_error=0.3)["pick"]
        for seed in range(10)
    ]
    assert sum(p is not None and search_seconds.good(p, land) for p in picks) >= 9


def test_the_earliest_stop_withdraws_the_waiting_start_points():
    """The bench's counterfactual (search_seconds.sweep withdraw=True) reads the stop rule after every
    trial: on the measured tiny landscape with the model as recorded it stops before the five start
    points have run, and the ones left waiting are withdrawn unrun (FAIL, `withdrawn`), never run as
    confirmation; the sweeper's own reading runs all five first."""
    import optuna

    sys.path.insert(0, str(BENCH))
    import landscapes
    import search_seconds

    logging.getLogger("replay").setLevel(logging.WARNING)
    land = landscapes.tiny_cpu_vllm(sigma=0.03)
    kwargs = {"n_trials": 40, "stop_below": 0.5, "confirm_top": 3, "lead": True}
    earliest = search_seconds.sweep(land, 0, withdraw=True, **kwargs)
    usual = search_seconds.sweep(land, 0, **kwargs)
    withdrawn = [t for t in earliest["study"].trials if t.user_attrs.get("withdrawn")]
    assert withdrawn and all(t.state == optuna.trial.TrialState.FAIL for t in withdrawn)
    assert not any(t.user_attrs.get("confirms") is not None for t in withdrawn)
    assert earliest["trials"] < usual["trials"] and earliest["seconds"] < usual["seconds"]
    assert not any(t.user_attrs.get("withdrawn") for t in usual["study"].trials)


def test_the_sweep_says_a_flat_space_is_flat_before_its_first_trial(monkeypatch, caplog):
    """enqueue_frontier on the tiny_cpu_vllm sweep's real plan, its forecast flattened (every point the
    throughput model prices at its fastest speed, less 1 % for half of them): the start says the space
    is flat in one line, before any trial, and queues one start point, the safest of the flat ones, as
    the forecast's least share of the allowed memory."""
    import dataclasses

    import optuna
    from helpers.sweeper import tiny_sweeper

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tiny_sweeper("backend.vllm_enable_prefix_caching=false", sweep="+sweeps=tiny_cpu_vllm") as tiny:
        # Imported here: Hydra's plugin scan in tiny_sweeper loads the plugin's modules afresh.
        from hydra_plugins.grpo_optuna_sweeper import start as start_now

        real = start_now.forecast.forecast

        def flattened(*args, **kwargs):
            points = real(*args, **kwargs)
            fastest = max(f.tokens_per_s or 0.0 for f in points)
            return [dataclasses.replace(f, tokens_per_s=fastest * (0.99 if i % 2 else 1.0)) for i, f in enumerate(points)]

        monkeypatch.setattr(start_now.forecast, "forecast", flattened)
        study = optuna.create_study(direction="maximize")
        with caplog.at_level(logging.INFO):
            forecasts = start_now.enqueue_frontier(study, tiny.plan, tiny.prescreen, tiny.compose.cache(), 4)
    flat_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Flat space:")]
    assert len(flat_lines) == 1 and "the sweep runs the safest of them" in flat_lines[0]
    queued = study.get_trials(deepcopy=False)
    assert len(queued) == 1 and queued[0].user_attrs["start"] == "flat" and queued[0].state.name == "WAITING"
    runnable = [f for f in forecasts if f.runs and f.fits and f.tokens_per_s]
    safest = min(runnable, key=lambda f: f.share)
    assert queued[0].system_attrs["fixed_params"] == safest.params


def test_the_plan_says_a_flat_space_is_flat(monkeypatch):
    """`grpo-sweep plan` (preview.build and format_text) on the tiny_cpu_vllm sweep's real plan, its
    forecast flattened as above: the plan prints the flat-space line and the one start point the sweep
    would queue; the same plan with its real forecast prints no such line."""
    import dataclasses

    from helpers.sweeper import tiny_sweeper

    with tiny_sweeper("backend.vllm_enable_prefix_caching=false", sweep="+sweeps=tiny_cpu_vllm") as tiny:
        from hydra_plugins.grpo_optuna_sweeper import preview

        real = preview.forecast.forecast
        honest = preview.format_text(preview.build(tiny.plan, tiny.compose))

        def flattened(*args, **kwargs):
            points = real(*args, **kwargs)
            fastest = max(f.tokens_per_s or 0.0 for f in points)
            return [dataclasses.replace(f, tokens_per_s=fastest * (0.99 if i % 2 else 1.0)) for i, f in enumerate(points)]

        monkeypatch.setattr(preview.forecast, "forecast", flattened)
        data = preview.build(tiny.plan, tiny.compose)
    text = preview.format_text(data)
    assert "Flat space:" not in honest
    flat = [line for line in text.splitlines() if line.startswith("Flat space:")]
    assert len(flat) == 1 and "the sweep runs the safest of them" in flat[0]
    assert len(data["start"]["points"]) == 1


def test_among_points_the_model_cannot_tell_apart_the_start_changes_the_least():
    """Prefix caching on and off are predicted equal when the prompt fills no KV block (nothing shared):
    whatever the seed, the start runs the point that keeps what the user's config does (vLLM's default,
    on, for a null setting) rather than a change the model has no view on."""
    from helpers.config import compose

    from hydra_plugins.grpo_optuna_sweeper import forecast

    base = compose(["+sweeps=tiny_cpu_vllm"])
    on, off = {"backend.vllm_enable_prefix_caching": True}, {"backend.vllm_enable_prefix_caching": False}
    assert (forecast.departures(on, base), forecast.departures(off, base)) == (0, 1)
    assert forecast.departures({"per_device_train_batch_size": base.per_device_train_batch_size}, base) == 0
    assert forecast.departures({"per_device_train_batch_size": 64}, base) == 1
    tied = [
        Forecast({"b": 1, **off}, predicted_bytes=500, limit_bytes=1000, runs=True, tokens_per_s=200.0, departures=1),
        Forecast({"b": 1, **on}, predicted_bytes=500, limit_bytes=1000, runs=True, tokens_per_s=200.0, departures=0),
        Forecast({"b": 2}, predicted_bytes=500, limit_bytes=1000, runs=True, tokens_per_s=150.0, departures=1),
    ]
    for seed in range(8):
        picks = forecast.fastest_first(tied, 2, seed)
        assert [f.params for f in picks] == [{"b": 1, **on}, {"b": 2}]
    # the model-led turns too: the untried point that changes the least, where the model ties
    same = lambda record: next(iter(record.values()))  # noqa: E731 - the model's prediction as it stands
    assert lead.next_point(tied, set(), same) == {"b": 1, **on}
    assert lead.next_point(tied[::-1], set(), same) == {"b": 1, **on}


def test_only_a_config_faster_than_predicted_widens_the_models_error():
    """Three configs ran as the model said; a fourth ran at half its prediction (overpredicted: it
    cannot hide a faster point) or at twice it (underpredicted: another point may be faster than the
    model says too). Only the second widens the error that holds the search open."""
    speed = lambda record: record["predicted_tokens_per_s"]  # noqa: E731 - a calibration that is the identity
    right = [{"predicted_tokens_per_s": p, "tokens_per_s": p} for p in (100.0, 90.0, 80.0)]
    over = lead.error([*right, {"predicted_tokens_per_s": 120.0, "tokens_per_s": 60.0}], speed)
    under = lead.error([*right, {"predicted_tokens_per_s": 60.0, "tokens_per_s": 120.0}], speed)
    assert over == 0.0
    assert under > 0.5


def test_a_point_the_model_cannot_tell_from_a_measured_one_is_not_the_models_next_run():
    """b=3 is predicted as b=1 ran (200: they differ only in a lever the model does not price): the
    model-led turn runs b=4, the fastest point it has a view on, and the stop rule takes b=1's run
    for b=3, so the search stops once b=4 is predicted below the bar."""
    study = _study([(1, 100.0, 200.0), (2, 90.0, 180.0)])
    same = lambda record: next(iter(record.values())) / 2  # noqa: E731 - the calibrated model: half the prediction
    candidates = _forecasts({1: 200.0, 2: 180.0, 3: 200.0, 4: 150.0})
    tried = {lead.point_key({"b": 1}), lead.point_key({"b": 2})}
    assert lead.next_point(candidates, tried, same, measured=[200.0, 180.0]) == {"b": 4}
    assert lead.next_point(candidates, tried, same) == {"b": 3}  # no measured configs given: b=3 runs
    assert lead.study_next_point(study, candidates) == {"b": 4}
    assert lead.study_stop_line(study, candidates, 0.05) is not None
