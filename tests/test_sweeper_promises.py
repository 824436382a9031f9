"""The sweeper's promises, each with a fast test that fails when the promise is broken.

- the winner is feasible and within the headroom (on a simulated card too), in the summary,
  best.yaml, trials.csv and report.html alike, in the study's direction;
- the pre-screen prunes a point only when its prediction is over the budget by more than the margin;
- the journal heartbeat keeps a live trial RUNNING past the grace period, while a dead worker's
  trial is failed and retried;
- optuna-dashboard, read through its own API, shows an OOM trial as infeasible;
- a systematic failure is recognised, and "nothing fits" is said only when trials ran out of memory.
- the decision functions case by case, against values worked out by hand (the `*_by_hand` tests:
  what `make mutation` found unguarded, docs/mutation.md).

The studies here are real Optuna studies (a journal file), told what happened through the sweeper's
own path (outcome.judge -> tell.tell); no trial runs, so every test takes seconds.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from helpers.runners import read_csv
from helpers.studies import create_study
from helpers.sweeper import plugin_sweeper, prescreen_point, tell_outcome

from grpo_sweep.study import best as best_rule
from hydra_plugins.grpo_optuna_sweeper.outcome import memory_constraint

GIB = 2**30
BUDGET = 1 * GIB  # the simulated card (gpu=cpu_sim, gpu.memory_gib=1)


def _tell_record(sweeper, study, record: dict | None, *, headroom: float | None, number_attrs: dict | None = None):
    """One trial told through the sweeper's own judge and tell_outcome, with its point as overrides."""
    from hydra_plugins.grpo_optuna_sweeper.outcome import judge

    trial = study.ask()
    trial.set_user_attr("overrides", [f"trial.number={trial.number}"])
    trial.set_user_attr("budget_bytes", BUDGET)
    for key, value in (number_attrs or {}).items():
        trial.set_user_attr(key, value)
    outcome = judge(
        record,
        objective=sweeper.plan.objective,
        direction=sweeper.plan.settings.direction,
        budget_bytes=BUDGET,
        headroom=headroom,
    )
    tell_outcome(sweeper, study, trial, outcome)
    return trial.number


def _ok(value: float, peak_gib: float, key: str = "tokens_per_s") -> dict:
    """A trial that ran without OOM on the simulated card: its peak measured by the CPU tensor tracker."""
    return {"status": "ok", key: value, "peak_memory_bytes": peak_gib * GIB, "memory_source": "cpu-tracker"}


OOM = {"status": "oom", "error": "OutOfMemoryError: simulated card", "deficit_bytes": 0.2 * GIB, "memory_source": "cpu-tracker"}


def _report_best(sweep_dir: Path) -> str | None:
    html = (sweep_dir / "report.html").read_text()
    found = re.search(r"Best feasible trial: <b>trial (\d+)</b>", html)
    return found.group(1) if found else None


# ------------------------------------------------------------------ the winner
@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_winner_is_feasible_within_headroom_everywhere(tmp_path, direction, capsys):
    """On a simulated card with hydra.sweeper.headroom=0.5: the fastest trial ran without OOM but
    over half the card, so it is infeasible and never the best: not in best.yaml, the printed
    table, trials.csv or report.html. An OOM trial is never the best either. The best follows the
    study's direction (maximize tokens/s, or minimize step time)."""
    from hydra_plugins.grpo_optuna_sweeper.standings import best_trial

    key = "tokens_per_s" if direction == "maximize" else "step_time_s"
    sweeper = plugin_sweeper(tmp_path, direction=direction, objective=key, headroom=0.5)
    study = create_study(sweeper.plan)
    # (value, peak): the winner in each direction is the "best" value that fits half the card.
    best_value = 300.0 if direction == "maximize" else 0.1
    over = _tell_record(sweeper, study, _ok(best_value, 0.75, key), headroom=0.5)  # fits the card, not the headroom
    oom = _tell_record(sweeper, study, dict(OOM), headroom=0.5)
    fits = _tell_record(sweeper, study, _ok(200.0 if direction == "maximize" else 0.2, 0.4, key), headroom=0.5)
    worse = _tell_record(sweeper, study, _ok(100.0 if direction == "maximize" else 0.3, 0.3, key), headroom=0.5)

    frozen = {t.number: t for t in study.trials}
    assert memory_constraint(frozen[over]) == pytest.approx(0.25 * GIB)  # 0.75 - 0.5 of the card
    assert memory_constraint(frozen[oom]) == pytest.approx(0.2 * GIB + 0.5 * GIB)  # past the allowed half
    assert best_trial(study).number == fits

    from hydra_plugins.grpo_optuna_sweeper.report import write_report

    summary = write_report(study, sweeper.plan, compose=None)
    printed = capsys.readouterr().out
    assert summary["best_trial"] == fits
    best_yaml = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best_yaml["best_trial"] == fits and best_yaml["direction"] == direction
    assert best_yaml["headroom"] == 0.5 and best_yaml["peak_memory_bytes"] <= 0.5 * BUDGET
    assert f"Best: trial {fits}," in printed
    ranked = [int(line.split()[1]) for line in printed.splitlines() if re.match(r"^\d+\s+\d+\s", line)]
    assert ranked == [fits, worse]  # the table ranks feasible trials only, best first in the direction
    rows = {int(r["number"]): r for r in read_csv(tmp_path / "trials.csv")}
    assert rows[over]["feasible"] == "False" and rows[over]["objective"] == ""
    assert rows[oom]["feasible"] == "False" and rows[oom]["objective"] == ""
    assert rows[fits]["feasible"] == "True" and float(rows[fits]["objective"]) == study.trials[fits].value
    assert _report_best(tmp_path) == str(fits)


def test_headroom_applies_to_the_simulated_cards_tracker():
    """The CPU tensor tracker's peak is device memory for the simulated card: the headroom applies
    to it exactly as to CUDA's; only process RSS (no card simulated) is not comparable."""
    from hydra_plugins.grpo_optuna_sweeper.outcome import judge

    common = {"objective": "tokens_per_s", "direction": "maximize", "budget_bytes": BUDGET}
    for source in ("cpu-tracker", "cuda"):
        record = {"status": "ok", "tokens_per_s": 1.0, "peak_memory_bytes": 0.6 * GIB, "memory_source": source}
        assert judge(record, headroom=None, **common).constraint == pytest.approx(-0.4 * GIB)
        assert judge(record, headroom=0.5, **common).constraint == pytest.approx(0.1 * GIB)  # infeasible
    rss = {"status": "ok", "tokens_per_s": 1.0, "peak_memory_bytes": 0.6 * GIB, "memory_source": "cpu-rss"}
    assert judge(rss, headroom=0.5, **common).constraint == 0.0


# ------------------------------------------------------------------ the pre-screen margin
def test_prescreen_margin_boundary_on_a_real_estimate(tmp_path):
    """The sweeper's own pre-screen on a composed tiny_cpu point: a card just large enough that the
    prediction is under budget x (1 + margin) runs it; a card just too small prunes it."""
    from helpers.config import compose

    from grpo_sweep.memory.estimator import estimate
    from grpo_sweep.units import budget_bytes

    point = ["+sweeps=tiny_cpu", "max_seq_length=128", "per_device_train_batch_size=4"]
    predicted = estimate(compose(point)).total_bytes
    sweeper = plugin_sweeper(tmp_path, prescreen_margin=0.10)
    study = create_study(sweeper.plan)
    for scale, expected in ((1.001, None), (0.999, "PRUNED")):
        # budget x 1.1 = predicted x scale: just over (runs) or just under (pruned) the margin.
        gib = predicted * scale / 1.10 / GIB
        cfg = compose([*point, f"gpu.memory_gib={gib!r}"])
        assert estimate(cfg).total_bytes == predicted  # the card's size does not move this prediction
        trial = study.ask()
        verdict = prescreen_point(sweeper, trial, cfg, budget_bytes(cfg))
        assert (verdict.state if verdict else None) == expected, (scale, gib)
        assert trial.user_attrs["predicted_peak_bytes"] == int(predicted)
        if verdict is not None:
            assert verdict.constraint == pytest.approx(predicted - budget_bytes(cfg))
    assert predicted > budget_bytes(cfg)  # the point that ran was over the card, but within the margin


def test_prescreen_switches_and_fallbacks(tmp_path):
    """hydra.sweeper.prescreen=false never prunes; an estimate that fails runs the point (and says
    why); a card with no size in the config is judged against the budget the sweeper was given."""
    from helpers.config import compose
    from omegaconf import OmegaConf

    from grpo_sweep.memory.estimator import estimate

    tiny = compose(["gpu=cpu"])  # no card size: estimate(...).budget_bytes is None
    predicted = estimate(tiny).total_bytes
    assert estimate(tiny).budget_bytes is None
    off = plugin_sweeper(tmp_path / "off", prescreen=False)
    trial = create_study(off.plan).ask()
    assert prescreen_point(off, trial, tiny, 1.0) is None and "predicted_peak_bytes" not in trial.user_attrs
    on = plugin_sweeper(tmp_path / "on", prescreen_margin=0.0)
    study = create_study(on.plan)
    trial = study.ask()
    pruned = prescreen_point(on, trial, tiny, predicted / 2)  # the sweeper's own budget: half the prediction
    assert (pruned.state, pruned.constraint) == ("PRUNED", pytest.approx(predicted / 2))
    assert trial.user_attrs["predicted_peak_bytes"] == predicted
    assert prescreen_point(on, study.ask(), tiny, None) is None  # no budget anywhere: run it
    broken = OmegaConf.create(OmegaConf.to_container(tiny))
    del broken["model"]
    trial = study.ask()
    assert prescreen_point(on, trial, broken, 1.0) is None
    assert "model" in trial.user_attrs["predicted_error"] and "predicted_peak_bytes" not in trial.user_attrs


def test_prescreen_verdict_boundary():
    from hydra_plugins.grpo_optuna_sweeper.outcome import prescreen_verdict

    limit = 1000.0
    assert prescreen_verdict(1099.0, limit, 0.10) is None  # 9.9 % over: within the margin, run it
    assert prescreen_verdict(1100.0, limit, 0.10) is None  # exactly the margin: run it
    pruned = prescreen_verdict(1101.0, limit, 0.10)
    assert pruned.state == "PRUNED" and pruned.constraint == 101.0
    assert prescreen_verdict(1001.0, limit, 0.0).state == "PRUNED"
    assert prescreen_verdict(1e12, None, 0.10) is None  # no budget: nothing to prune against


# ------------------------------------------------------------------ the heartbeat
@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_heartbeat_keeps_a_live_trial_and_retries_a_dead_one(tmp_path, kind):
    """Two RUNNING trials: one whose worker beats (Heartbeat), one whose worker died after its
    first beat. Past the grace period the dead one is FAIL with its point re-queued; the live one
    is still RUNNING although it started longer ago than the grace period. Journal files: our
    timestamp; RDB storages (SQLite here, PostgreSQL alike): Optuna's own heartbeat."""
    import functools

    import optuna

    from grpo_sweep.study.storage import open_storage
    from hydra_plugins.grpo_optuna_sweeper import handles
    from hydra_plugins.grpo_optuna_sweeper.workers import Heartbeat, fail_stale_trials, retry

    grace = 2
    source = f"journal:{tmp_path / 'study.journal'}" if kind == "journal" else f"sqlite:///{tmp_path / 'study.db'}"
    storage = open_storage(
        source, heartbeat_interval=1, grace_period=grace, stale_trial_callback=functools.partial(retry, max_retry=2)
    )
    study = optuna.create_study(study_name="promises", storage=storage, direction="maximize")
    space = {"lora_rank": optuna.distributions.CategoricalDistribution([8, 16])}
    live, dead = study.ask(space), study.ask(space)
    with Heartbeat(study, [handles.trial_id(dead)], interval=1):
        pass  # the dead worker beat once, then died
    with Heartbeat(study, [handles.trial_id(live)], interval=0.25):
        deadline = time.monotonic() + 30
        failed: list[int] = []
        while not failed and time.monotonic() < deadline:
            failed = fail_stale_trials(study, grace, max_retry=2)
            time.sleep(0.2)
        assert failed == [dead.number], "the dead worker's trial was not failed within 30 s"
        trials = study.get_trials(deepcopy=False)
        started = trials[live.number].datetime_start
        assert (datetime.datetime.now() - started).total_seconds() > grace  # old enough to look dead
        assert fail_stale_trials(study, grace, max_retry=2) == []
        assert study.get_trials(deepcopy=False)[live.number].state.name == "RUNNING"
    trials = study.get_trials(deepcopy=False)
    assert trials[dead.number].state.name == "FAIL"
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == dead.number]
    assert len(retried) == 1 and retried[0].state.name == "WAITING"
    assert retried[0].params == dead.params


# ------------------------------------------------------------------ optuna-dashboard
def test_optuna_dashboard_shows_oom_trials_as_infeasible(tmp_path):
    """Read the study through optuna-dashboard's own API, as its UI does (GET /api/studies/<id> on
    its WSGI app): the OOM trial carries a positive constraint (the UI draws it as infeasible), the
    feasible one a non-positive one."""
    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is in the dev and dashboard extras")
    import io

    from optuna_dashboard import wsgi

    from grpo_sweep.study.storage import open_storage

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    ok = _tell_record(sweeper, study, _ok(200.0, 0.4), headroom=None)
    oom = _tell_record(sweeper, study, dict(OOM), headroom=None)
    app = wsgi(open_storage(sweeper.plan.storage_url, create=False))
    status: list[str] = []
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": f"/api/studies/{study._study_id}",
        "QUERY_STRING": "after=0",
        "SERVER_NAME": "test",
        "SERVER_PORT": "80",
        "wsgi.input": io.BytesIO(),
        "wsgi.url_scheme": "http",
        "wsgi.errors": io.StringIO(),
    }
    body = b"".join(app(environ, lambda s, h, *a: status.append(s)))
    assert status and status[0].startswith("200"), (status, body[:500])
    trials = {t["number"]: t for t in json.loads(body)["trials"]}
    infeasible = lambda t: any(c > 0 for c in t["constraints"])  # noqa: E731 - the UI's test
    assert infeasible(trials[oom]) and trials[oom]["constraints"] == [pytest.approx(0.2 * GIB)]
    assert not infeasible(trials[ok]) and trials[ok]["constraints"] == [pytest.approx(-0.6 * GIB)]
    # Optuna reads the same form as one constraint: what its samplers learn from.
    assert study.trials[oom].constraints == {"0": pytest.approx(0.2 * GIB)}
    assert study.trials[ok].constraints == {"0": pytest.approx(-0.6 * GIB)}


# ------------------------------------------------------------------ systematic failures
def _fail(sweeper, study, error: str, status: str = "failed"):
    return _tell_record(sweeper, study, {"status": status, "error": error}, headroom=None)


def test_systematic_failure_is_recognised_and_advised(tmp_path):
    from hydra_plugins.grpo_optuna_sweeper.failures import systematic_failure
    from hydra_plugins.grpo_optuna_sweeper.tables import command_line

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    since = sweeper.progress.started
    hub = "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them"
    _fail(sweeper, study, hub)
    _fail(sweeper, study, hub)
    assert systematic_failure(study, since, 3, command_line) is None  # two are not yet a pattern
    _tell_record(sweeper, study, dict(OOM), headroom=None)  # an OOM is an answer, and breaks the run
    for _ in range(2):
        _fail(sweeper, study, hub)
    assert systematic_failure(study, since, 3, command_line) is None
    last = _fail(sweeper, study, hub)
    stop = systematic_failure(study, since, 3, command_line)
    assert stop is not None and stop.trials == [last - 2, last - 1, last]
    assert "huggingface.co" in stop.reason and "HF_HUB_OFFLINE" in stop.advice
    assert stop.command == f"python train.py trial.number={last}"
    assert systematic_failure(study, since, 0, command_line) is None  # 0: never stop
    # Failures before this worker started belong to an earlier run (perhaps fixed since).
    assert systematic_failure(study, datetime.datetime.now(), 3, command_line) is None
    assert systematic_failure(study, since, 2, command_line).trials == [last - 1, last]  # the last two only
    # A surplus or an interrupted trial is bookkeeping: it neither counts nor breaks the run.
    for status in ("surplus", "interrupted"):
        _fail(sweeper, study, f"{status}: not run", status=status)
    assert systematic_failure(study, since, 3, command_line).trials == [last - 2, last - 1, last]
    assert systematic_failure(study, since, 1, command_line).trials == [last]  # 1: stop at the first failure
    # Three failures for different reasons are not one systematic failure.
    for error in ("ModuleNotFoundError: No module named 'vllm'", "RuntimeError: a", "RuntimeError: b"):
        _fail(sweeper, study, error)
    assert systematic_failure(study, since, 3, command_line) is None


def test_prescreened_trial_keeps_the_failure_streak(tmp_path):
    """A pre-screened point never ran: between two failures it neither counts nor breaks the run,
    so three failures around it still stop the sweep. A trial that ran (an OOM) breaks it."""
    from hydra_plugins.grpo_optuna_sweeper.failures import systematic_failure
    from hydra_plugins.grpo_optuna_sweeper.outcome import prescreen_verdict
    from hydra_plugins.grpo_optuna_sweeper.tables import command_line

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    since = sweeper.progress.started
    error = "ModuleNotFoundError: No module named 'vllm'"
    first = _fail(sweeper, study, error)
    _fail(sweeper, study, error)
    trial = study.ask()
    trial.set_user_attr("overrides", [f"trial.number={trial.number}"])
    tell_outcome(sweeper, study, trial, prescreen_verdict(2 * BUDGET, BUDGET, 0.1))
    assert study.trials[trial.number].state.name == "PRUNED"
    last = _fail(sweeper, study, error)
    stop = systematic_failure(study, since, 3, command_line)
    assert stop is not None and stop.trials == [first, first + 1, last]
    _tell_record(sweeper, study, dict(OOM), headroom=None)
    assert systematic_failure(study, since, 1, command_line) is None


def test_an_enqueue_key_the_sweep_does_not_search_is_one_line():
    """A trial sets only the searched parameters: an `enqueue` value for any other key (all of them
    when hydra.sweeper.params is empty) would be dropped without a word. It is refused in one line
    before the storage opens, naming the point, the key and the space."""
    from helpers.sweeper import tiny_sweeper

    # Exception: Hydra's plugin discovery may import the sweeper's modules again (another class object)
    with pytest.raises(Exception) as err:
        with tiny_sweeper(params=None, enqueue=[{"per_device_train_batch_size": 2}]):
            pass
    assert type(err.value).__name__ == "SweeperSettingError"
    assert str(err.value) == (
        "hydra.sweeper.enqueue[0].per_device_train_batch_size=2: not a parameter this sweep searches (search space: "
        "empty); search it in hydra.sweeper.params, or set it for every trial as a plain override"
    )
    with pytest.raises(Exception, match=r"^hydra.sweeper.enqueue\[1\].lora_rank=16: not a parameter this sweep"):
        with tiny_sweeper(enqueue=[{"per_device_train_batch_size": 2}, {"per_device_train_batch_size": 2, "lora_rank": 16}]):
            pass
    with tiny_sweeper(enqueue=[{"per_device_train_batch_size": 2}]) as tiny:  # a searched key: queued as before
        assert "per_device_train_batch_size" in tiny.plan.distributions


def test_stop_message_by_hand():
    """What a systematic failure prints and writes to best.yaml, written out by hand."""
    from hydra_plugins.grpo_optuna_sweeper.failures import Stop

    stop = Stop(reason="failed: RuntimeError: boom", trials=[3, 4, 5], advice="fix it", command="python train.py x=1")
    assert stop.message() == (
        "Sweep stopped: trials 3, 4, 5 failed in a row for the same reason, not memory: failed: RuntimeError: boom\n"
        "  What to do: fix it\n  Run one alone: python train.py x=1"
    )
    from hydra_plugins.grpo_optuna_sweeper.tables import stop_words

    assert stop_words(stop, 0) == stop.message()
    assert stop_words(stop, 2) == stop.message() + (
        "\n  2 queued trials left WAITING: the same command, run again once fixed, resumes the study and runs them first"
    )
    assert stop.as_dict() == {
        "reason": "failed: RuntimeError: boom",
        "trials": [3, 4, 5],
        "advice": "fix it",
        "command": "python train.py x=1",
    }


def test_no_best_says_nothing_fits_only_after_memory_verdicts(tmp_path):
    from hydra_plugins.grpo_optuna_sweeper.failures import why_no_best

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    _fail(sweeper, study, "RuntimeError: debug_fault=raise: injected failure")
    said = why_no_best(study)
    assert "nothing fits" not in said and "1 failed" in said and "debug_fault=raise" in said
    _tell_record(sweeper, study, dict(OOM), headroom=None)
    assert "nothing fits the budget" in why_no_best(study)


def test_systematic_failure_edges(tmp_path):
    """A negative max_failures_in_a_row is off, like 0 (a pre-screened point:
    test_prescreened_trial_keeps_the_failure_streak)."""
    from hydra_plugins.grpo_optuna_sweeper.failures import systematic_failure
    from hydra_plugins.grpo_optuna_sweeper.tables import command_line

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    since = sweeper.progress.started
    for _ in range(3):
        _fail(sweeper, study, "RuntimeError: boom")
    assert systematic_failure(study, since, 3, command_line) is not None
    assert systematic_failure(study, since, -1, command_line) is None


def test_failure_reasons_and_advice_by_hand(tmp_path):
    """What counts as one systematic failure, and the advice for it, on hand-made trials."""
    import optuna

    from hydra_plugins.grpo_optuna_sweeper.failures import DEFAULT_ADVICE, advice_for, reason_of, systematic_failure
    from hydra_plugins.grpo_optuna_sweeper.tables import command_line

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    bare = study.ask()  # failed with no error text at all (judge() always writes one; a hand-told trial need not)
    bare.set_user_attr("status", "failed")
    study.tell(bare, state=optuna.trial.TrialState.FAIL)
    empty = bare.number
    long = _fail(sweeper, study, "\n  E" + "x" * 400 + "\nsecond line")
    timeout = _fail(sweeper, study, "trial exceeded trial.timeout_s", status="timeout")
    trials = study.trials
    assert reason_of(trials[empty]) == "failed: no error message"
    assert reason_of(trials[long]) == "failed: E" + "x" * 299  # the first non-blank line, 300 characters
    assert reason_of(trials[timeout]) is None  # a large point may legitimately be slow
    assert advice_for("failed: ModuleNotFoundError: No module named 'vllm'").startswith("a package is missing")
    assert advice_for("failed: ValueError: reward must be a float").startswith("the task's reward function raised")
    assert advice_for("failed: RuntimeError: boom") == DEFAULT_ADVICE
    # Two workers: trial a (asked first) finishes after trial b; "in a row" follows the finishing order.
    a, b = study.ask(), study.ask()
    _tell_failure = {"status": "failed", "error": "RuntimeError: boom"}
    from hydra_plugins.grpo_optuna_sweeper.outcome import judge

    common = {"objective": "tokens_per_s", "direction": "maximize", "budget_bytes": BUDGET, "headroom": None}
    tell_outcome(sweeper, study, b, judge(_tell_failure, **common))
    tell_outcome(sweeper, study, a, judge(_ok(1.0, 0.1), **common))
    assert systematic_failure(study, sweeper.progress.started, 1, command_line) is None  # the last to finish ran ok
    # A trial that finished at the very moment the worker started belongs to this run.
    last = _fail(sweeper, study, "RuntimeError: boom")
    stop = systematic_failure(study, study.trials[last].datetime_complete, 1, command_line)
    assert stop is not None and stop.trials == [last]


def test_why_no_best_is_nothing_fits_only_for_memory_verdicts(tmp_path):
    """'nothing fits' needs a trial over budget (an OOM, or a pre-screened point, even by one byte);
    slow trials told COMPLETE to GP (feasible, at 0 bytes over) are not a memory verdict."""
    from hydra_plugins.grpo_optuna_sweeper.failures import why_no_best
    from hydra_plugins.grpo_optuna_sweeper.outcome import for_sampler, judge, prescreen_verdict

    nothing_fits = "No feasible trial yet: nothing fits the budget (see trials.csv for each trial's status)."
    gp = plugin_sweeper(tmp_path / "gp", sampler="gp")
    study = create_study(gp.plan)
    common = {"objective": "tokens_per_s", "direction": "maximize", "budget_bytes": BUDGET, "headroom": None}
    slow = {"status": "slow", "tokens_per_s": 3.0, "peak_memory_bytes": GIB, "memory_source": "cpu-rss"}
    tell_outcome(gp, study, study.ask(), for_sampler(judge(slow, **common), "gp", "maximize"))
    assert study.trials[0].state.name == "COMPLETE" and memory_constraint(study.trials[0]) == 0.0
    assert why_no_best(study) == "No trial ran ok (1 slow): not a memory verdict."
    tpe = plugin_sweeper(tmp_path / "tpe")
    study = create_study(tpe.plan)
    tell_outcome(tpe, study, study.ask(), prescreen_verdict(1001.0, 1000.0, 0.0))  # one byte over
    assert study.trials[0].state.name == "PRUNED"
    assert why_no_best(study) == nothing_fits


def test_why_no_best_counts_by_hand(tmp_path):
    """The no-winner line, written out by hand: each status counted (a trial still running has none
    yet: its state), and the first failure quoted."""
    from hydra_plugins.grpo_optuna_sweeper.failures import why_no_best

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    assert why_no_best(study) == "No trial ran ok (no trials): not a memory verdict."
    first = _fail(sweeper, study, "RuntimeError: a\nTraceback follows")
    _fail(sweeper, study, "RuntimeError: b")
    _tell_record(sweeper, study, {"status": "timeout", "error": "trial exceeded trial.timeout_s"}, headroom=None)
    study.ask()  # running
    assert why_no_best(study) == (
        f"No trial ran ok (2 failed, 1 running, 1 timeout): not a memory verdict; first failure (trial {first}): failed: RuntimeError: a."
    )


def test_progress_line_counts_best_and_time_left():
    from types import SimpleNamespace

    from hydra_plugins.grpo_optuna_sweeper.progress import Progress

    t0 = datetime.datetime(2026, 1, 1, 12, 0, 0)
    progress = Progress(10, t0)
    progress.start(2)  # a resumed sweep: 2 trials were already counted
    assert progress.line(2, None, "tokens_per_s", now=t0) == "trial 2/10 | no feasible trial yet"
    first = SimpleNamespace(number=3, value=123.456)
    best = best_rule.Finalist(first, [first], [123.456], 123.456)
    # 2 trials in 60 s since start: 30 s each, 6 still to count -> 3 minutes.
    line = progress.line(4, best, "tokens_per_s", now=t0 + datetime.timedelta(seconds=60))
    assert line == "trial 4/10 | best tokens_per_s=123.5 (trial 3) | ~3m00s left"
    # A config run three times shows the median of its runs, not its first run.
    again = best_rule.Finalist(first, [first, first, first], [123.456, 90.0, 100.0], 100.0)
    assert progress.line(4, again, "tokens_per_s", now=t0).startswith(
        "trial 4/10 | best tokens_per_s=100 (trial 3, median of 3 runs)"
    )


def test_a_start_point_queued_twice_runs_once(tmp_path):
    """Workers started together can each queue the sweep's start points before seeing the others':
    the later copy is a surplus (never run, not counted); a retry repeats its point on purpose."""
    from hydra_plugins.grpo_optuna_sweeper.workers import duplicate_of, retry

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    import optuna

    space = {"per_device_train_batch_size": optuna.distributions.CategoricalDistribution([2, 4])}
    study.enqueue_trial({"per_device_train_batch_size": 2})
    study.enqueue_trial({"per_device_train_batch_size": 2})  # a second worker's copy
    study.enqueue_trial({"per_device_train_batch_size": 4})
    first, copy, other = (study.ask(space) for _ in range(3))
    assert (duplicate_of(study, first), duplicate_of(study, copy), duplicate_of(study, other)) == (None, first.number, None)
    # A warm-start preset with the same parameters is another point (its preset sets other levers).
    study.enqueue_trial({"per_device_train_batch_size": 4}, user_attrs={"preset": "seed_optimized"})
    preset = study.ask(space)
    assert duplicate_of(study, preset) is None
    # The copy of a surplus is not a duplicate: the surplus never ran.
    other.set_user_attr("status", "surplus")
    study.enqueue_trial({"per_device_train_batch_size": 4})
    assert duplicate_of(study, study.ask(space)) is None
    study.tell(first, state=optuna.trial.TrialState.FAIL)
    retry(study, study.trials[first.number], max_retry=2)
    again = study.ask(space)
    assert again.params == first.params and duplicate_of(study, again) is None
    # A confirmation run repeats a finalist's point on purpose (confirm.py): never a surplus.
    from hydra_plugins.grpo_optuna_sweeper.confirm import CONFIRMS_ATTR

    study.enqueue_trial({"per_device_train_batch_size": 2}, user_attrs={CONFIRMS_ATTR: first.number})
    assert duplicate_of(study, study.ask(space)) is None


def test_start_points_never_overflow_the_search_phase(caplog):
    """Presets, `enqueue` points and the frontier are queued only while the search phase has room: a
    point the search never reaches would stay WAITING, and the confirmation phase would run it in
    place of a confirmation run. The points left out are named; a resumed sweep queues nothing twice."""
    import logging
    from dataclasses import replace

    import optuna
    from helpers.sweeper import tiny_sweeper

    from hydra_plugins.grpo_optuna_sweeper.start import enqueue_start

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    points = [{"per_device_train_batch_size": b, "gradient_checkpointing": c} for b in (2, 4) for c in (False, True)]

    def waiting(study):
        return [t.system_attrs["fixed_params"] for t in study.get_trials(deepcopy=False) if t.state.name == "WAITING"]

    def start(tiny, **changes):
        """enqueue_start on a fresh study (or `study`), the plan changed as the sweep's counts would."""
        enqueue_start(study, replace(tiny.plan, **changes), tiny.prescreen, tiny.compose)

    with tiny_sweeper(enqueue=points, start_points=5) as tiny:
        search = {"n_trials": 9, "n_search": 3}  # e.g. 3 search trials + 3 finalists x 2 runs
        study = optuna.create_study(direction="maximize")
        with caplog.at_level(logging.INFO):
            start(tiny, **search)
        assert waiting(study) == points[:3]
        assert "no room left for enqueue[3]=" in caplog.text and "n_trials=9 less 6 confirmation runs" in caplog.text
        assert "Frontier start" not in caplog.text  # no room for it either
        start(tiny, **search)  # a resumed sweep, or a second worker: nothing queued twice
        assert waiting(study) == points[:3]

        # Room for every point and two frontier points.
        study = optuna.create_study(direction="maximize")
        caplog.clear()
        with caplog.at_level(logging.INFO):
            start(tiny, n_trials=9, n_search=6)
        queued = waiting(study)
        assert queued[:4] == points and len(queued) == 6 and "not queued" not in caplog.text

    # Warm start: the presets first, while there is room; one left out is named. (A preset the held
    # recipe cannot run is dropped, named: both train 4 completions per step on 1024 tokens, and the
    # recipe settings the presets change are declared concessions.)
    presets_change = ["lora_rank", "max_prompt_length", "load_in_4bit"]
    held = ("completions_per_step=4", "max_seq_length=1024")
    with tiny_sweeper(*held, warm_start=True, enqueue=[], start_points=5, concessions=presets_change) as tiny:
        study = optuna.create_study(direction="maximize")
        caplog.clear()
        with caplog.at_level(logging.INFO):
            start(tiny, n_trials=9, n_search=1)
        presets = [t.user_attrs.get("preset") for t in study.get_trials(deepcopy=False)]
        assert presets == [tiny.plan.settings.presets[0]]
        assert f"preset={tiny.plan.settings.presets[1]} not queued" in caplog.text


@pytest.mark.slow
def test_a_systematic_failure_stops_a_real_sweep(tmp_path):
    """Every trial raises (trial.debug_fault=raise): the sweep stops after
    hydra.sweeper.max_failures_in_a_row=2 trials, not n_trials=6, exits 1 with the reason and
    what to do, and never says that nothing fits the budget."""
    from helpers.runners import SMALL, sweep_args, train_here
    from helpers.studies import load_study

    result = train_here(
        sweep_args(
            tmp_path, "hydra.sweeper.n_trials=6", "hydra.sweeper.max_failures_in_a_row=2", "trial.debug_fault=raise", *SMALL
        )
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    study = load_study(f"journal:{tmp_path / 'study.journal'}")
    assert [(t.state.name, t.user_attrs["status"]) for t in study.trials] == [("FAIL", "failed")] * 2
    assert "Sweep stopped: trials 0, 1 failed in a row for the same reason, not memory" in out
    assert "debug_fault=raise: injected failure" in out and "What to do:" in out and "Run one alone: python train.py" in out
    assert "nothing fits" not in out
    assert "No trial ran ok (2 failed): not a memory verdict" in out
    assert (tmp_path / "trials.csv").exists() and (tmp_path / "report.html").exists()


# ------------------------------------------------------------------ the search space's edges
def test_space_edges_found_by_mutation():
    """Edges `make mutation` found unguarded: a float range's top, a mixed int/float interval, the
    override text of null/bool values, and the frontier's
    boundaries (a point exactly at the allowed memory fits; exactly half the parameters differing
    is spread enough; a space of exactly MAX_CANDIDATES points is enumerated, not sampled; the
    seed decides the sample)."""
    import itertools

    from optuna.distributions import FloatDistribution

    from hydra_plugins.grpo_optuna_sweeper.space import MAX_CANDIDATES, candidates, parse_space, to_override
    from hydra_plugins.grpo_optuna_sweeper.start import pick

    dists, _ = parse_space(["gpu_memory_utilization=range(0.3,0.7,0.1)", "learning_rate=interval(1, 2.5)"])
    util = dists["gpu_memory_utilization"]
    assert isinstance(util, FloatDistribution) and util.step == pytest.approx(0.1)
    assert (util.low, util.high) == (pytest.approx(0.3), pytest.approx(0.6))  # Hydra's range excludes 0.7
    assert dists["learning_rate"] == FloatDistribution(1.0, 2.5)
    assert [to_override("k", v) for v in (None, False, True, 8, "qv")] == ["k=null", "k=false", "k=true", "k=8", "k=qv"]

    assert pick([({"a": 1}, 1.0), ({"a": 2}, 1.0001)], k=2, seed=0) == [{"a": 1}]
    half = [({"a": 1, "b": 1, "c": 1, "d": 1}, 0.9), ({"a": 1, "b": 1, "c": 2, "d": 2}, 0.8)]
    assert pick(half, k=2, seed=0) == [p for p, _ in half]
    grid = {"a": list(range(16)), "b": list(range(16))}  # exactly 256 points
    assert len(grid["a"]) * len(grid["b"]) == MAX_CANDIDATES
    assert list(candidates(grid, seed=0)) == [dict(zip("ab", v)) for v in itertools.product(range(16), range(16))]
    big = {f"p{i}": list(range(4)) for i in range(6)}
    assert list(candidates(big, seed=1)) == list(candidates(big, seed=1)) != list(candidates(big, seed=2))
    ties = [({"a": i, "b": i}, 0.5) for i in range(6)]
    assert pick(ties, k=3, seed=3) == pick(ties, k=3, seed=3)


def test_representable_by_hand():
    """A preset's lever value is enqueued only when the sweep's distribution contains it."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    from hydra_plugins.grpo_optuna_sweeper.space import representable

    batch = IntDistribution(2, 8, step=2)
    assert representable(batch, 4) and representable(batch, 8) and not representable(batch, 10)
    assert not representable(batch, "many")  # a preset's value that is not even a number: not in the space
    lora = CategoricalDistribution(["qv", "all"])
    assert representable(lora, "all") and not representable(lora, "none")


def test_to_override_keeps_text_as_hydra_reads_it():
    """Strings keep their case and are escaped for Hydra's grammar; only null and booleans are spelled out."""
    from hydra_plugins.grpo_optuna_sweeper.space import to_override

    assert to_override("lora", "QV") == "lora=QV"
    assert to_override("name", "a b") == "name=a\\ b"
    assert to_override("lr", 1e-05) == "lr=1e-05"


def test_duplicate_of_by_hand():
    """A start point queued twice (two workers) runs once: the later copy names the earlier one,
    whether asked as an optuna.Trial or read back as a FrozenTrial. A retry and a confirmation run
    repeat a point on purpose: they are never duplicates, nor the original of one."""
    import optuna
    from optuna.distributions import IntDistribution

    from hydra_plugins.grpo_optuna_sweeper.workers import duplicate_of

    space = {"a": IntDistribution(1, 9)}
    study = optuna.create_study()
    study.add_trial(
        optuna.create_trial(
            state=optuna.trial.TrialState.WAITING,
            params={"a": 3},
            distributions=space,
            system_attrs={"fixed_params": {"a": 3}, "failed_trial": 7},  # a retry of trial 7
        )
    )
    for a in (1, 1, 3, 3):
        study.enqueue_trial({"a": a})
    retried, first, second, after_retry, again = (study.ask(space) for _ in range(5))
    assert duplicate_of(study, retried) is None  # a retry repeats on purpose
    assert duplicate_of(study, first) is None
    assert duplicate_of(study, second) == first.number
    assert duplicate_of(study, study.trials[second.number]) == first.number  # a FrozenTrial too
    assert duplicate_of(study, after_retry) is None  # the retry is no one's original
    assert duplicate_of(study, again) == after_retry.number
    assert duplicate_of(study, study.ask(space)) is None  # not enqueued: no fixed point


def test_integer_intervals_and_describe_by_hand():
    """Hydra reads `interval(8, 64)` as floats: over a lever is_integer names, whole ends give an
    integer distribution, anywhere else a float one; describe writes a distribution as the space does."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from hydra_plugins.grpo_optuna_sweeper.space import describe, parse_space

    args = ["lora_rank=interval(8, 64)", "learning_rate=interval(1, 3)", "beta=interval(0.5, 2)"]
    dists, fixed = parse_space(args, is_integer=lambda key: key in ("lora_rank", "beta"))
    assert fixed == {}
    assert dists["lora_rank"] == IntDistribution(8, 64)
    assert dists["learning_rate"] == FloatDistribution(1.0, 3.0)
    assert dists["beta"] == FloatDistribution(0.5, 2.0)  # an integer lever, but the ends are not whole
    assert parse_space(args[:1])[0]["lora_rank"] == FloatDistribution(8.0, 64.0)  # no is_integer: floats
    assert describe(CategoricalDistribution([1, "qv"])) == "choice(1, qv)"
    assert describe(IntDistribution(1, 8)) == "interval(1, 8)"


def test_grid_choices_by_hand():
    """sampler=grid enumerates each discrete distribution; a log or continuous one is refused by name."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from hydra_plugins.grpo_optuna_sweeper.space import grid_choices

    grid = grid_choices(
        {
            "lora": CategoricalDistribution(["qv", "all"]),
            "max_seq_length": IntDistribution(64, 256, step=64),
            "per_device_train_batch_size": IntDistribution(1, 3),
            "gpu_memory_utilization": FloatDistribution(0.3, 0.6, step=0.1),
        }
    )
    assert grid["lora"] == ["qv", "all"]
    assert grid["max_seq_length"] == [64, 128, 192, 256]
    assert grid["per_device_train_batch_size"] == [1, 2, 3]
    assert grid["gpu_memory_utilization"] == pytest.approx([0.3, 0.4, 0.5, 0.6])
    refused = "hydra.sweeper.params.{}: sampler=grid needs discrete values (choice or range), not a continuous interval"
    for key, dist in (("lr", FloatDistribution(1e-5, 1e-3)), ("batch", IntDistribution(1, 8, log=True))):
        with pytest.raises(ValueError) as err:
            grid_choices({key: dist})
        assert str(err.value) == refused.format(key)


def test_judge_and_oom_deficit_by_hand():
    """What Optuna is told for each kind of record, with every number worked out by hand."""
    from hydra_plugins.grpo_optuna_sweeper.outcome import RECORD_ATTRS, judge, oom_deficit

    mib = 2**20
    card = {"objective": "tokens_per_s", "direction": "maximize", "budget_bytes": 1024 * mib, "headroom": None}
    # The OOM deficit, in order of trust: metrics.json's own (top level, then its `oom` block), the
    # message's (512 MiB asked, 128 MiB free: 384 over), peak - budget, the failed allocation, 1 byte.
    message = (
        "CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 1.00 GiB of which 128.00 MiB is free."
    )
    asked = "CUDA out of memory. Tried to allocate 512.00 MiB."
    assert oom_deficit({"deficit_bytes": 7, "oom": {"deficit_bytes": 9}, "error": message}, 1024 * mib) == (7.0, "metrics")
    assert oom_deficit({"deficit_bytes": 0, "oom": {"deficit_bytes": 9}, "error": message}, 1024 * mib) == (9.0, "metrics")
    assert oom_deficit({"deficit_bytes": 1, "error": message}, 1024 * mib) == (1.0, "metrics")  # one byte is a deficit
    for junk in (True, math.inf, math.nan):  # not byte counts: the next source decides
        assert oom_deficit({"deficit_bytes": junk, "error": message}, 1024 * mib) == (384.0 * mib, "oom message")
        assert oom_deficit({"peak_memory_bytes": junk}, 1024 * mib)[1].startswith("unknown")
    assert oom_deficit({"deficit_bytes": "384 MiB", "error": message}, 1024 * mib) == (384.0 * mib, "oom message")
    assert oom_deficit({"error": asked, "peak_memory_bytes": 1100 * mib}, 1024 * mib) == (76.0 * mib, "peak - budget")
    assert oom_deficit({"error": asked, "peak_memory_bytes": 1024 * mib}, 1024 * mib) == (512.0 * mib, "requested allocation")
    assert oom_deficit({"error": asked, "peak_memory_bytes": 2048 * mib}, None) == (512.0 * mib, "requested allocation")
    assert oom_deficit({}, 1024 * mib) == (1.0, "unknown (OOM with no sizes: marked just infeasible)")

    # OOM with a headroom of 0.75: the wall is 768 MiB, so 256 MiB more over than the card says.
    oom = judge({"status": "oom", "deficit_bytes": 100 * mib}, **{**card, "headroom": 0.75})
    assert (oom.state, oom.value, oom.constraint) == ("COMPLETE", 0.0, 356.0 * mib)
    assert (oom.attrs["deficit_bytes"], oom.attrs["deficit_source"]) == (100.0 * mib, "metrics")
    assert judge({"status": "oom", "deficit_bytes": 5}, **{**card, "budget_bytes": None}).constraint == 5.0

    # ok: the objective must be a finite number (not a bool); attributes keep what the record says.
    record = {key: f"v-{key}" for key in RECORD_ATTRS} | {"status": "ok", "tokens_per_s": 12, "peak_memory_bytes": 600 * mib}
    record |= {"memory_source": "cuda", "error": "x" * 1500, "levers": {"lora_rank": 8}, "unrelated": 1}
    ok = judge(record, **card)
    assert (ok.state, ok.value, ok.constraint) == ("COMPLETE", 12.0, -424.0 * mib)
    assert ok.attrs["error"] == "x" * 1000 and ok.attrs["levers"] == {"lora_rank": 8} and "unrelated" not in ok.attrs
    assert ok.attrs["run_dir"] == "v-run_dir" and ok.attrs["status"] == "ok"
    assert judge({**record, "levers": "lora_rank=8"}, **card).attrs.get("levers") is None
    assert judge({"status": "ok", "tokens_per_s": 12}, **card).constraint == 0.0  # no peak: ran, fits
    assert (
        judge({"status": "ok", "tokens_per_s": 12, "peak_memory_bytes": 2048 * mib}, **{**card, "budget_bytes": None}).constraint
        == 0.0
    )
    for bad in (True, None, float("nan"), math.inf, "12"):
        failed = judge({"status": "ok", "tokens_per_s": bad}, **card)
        assert failed.state == "FAIL" and failed.value is None
        assert failed.attrs["error"] == f"objective 'tokens_per_s' is not a number in metrics.json: {bad!r}"
        assert failed.attrs["status"] == "failed"  # never counted ok by the summary or the report

    # slow: PRUNED with its partial value, when it is a number, and its peak's constraint.
    slow = judge(
        {"status": "slow", "tokens_per_s": 5, "peak_memory_bytes": 900 * mib, "memory_source": "cuda"},
        **{**card, "headroom": 0.5},
    )
    assert (slow.state, slow.value, slow.constraint) == ("PRUNED", 5.0, 388.0 * mib)
    rss = judge({"status": "slow", "tokens_per_s": True, "peak_memory_bytes": 900 * mib, "memory_source": "cpu-rss"}, **card)
    assert (rss.state, rss.value, rss.constraint) == ("PRUNED", None, 0.0)

    interrupted = judge({"status": "interrupted"}, **card)
    assert (interrupted.state, interrupted.attrs) == ("FAIL", {"status": "interrupted", "error": "trial status 'interrupted'"})
    assert judge({"status": "failed", "error": "boom"}, **card).attrs["error"] == "boom"
    assert judge(None, **card).attrs == {"status": "failed", "error": "the job left no metrics.json"}


def test_memory_constraint_reads_either_form():
    """The list form the sweeper writes (read by Optuna as constraint "0") and Optuna 5's named form."""
    import optuna

    from hydra_plugins.grpo_optuna_sweeper.outcome import CONSTRAINT, tell_constraint

    study = optuna.create_study()
    listed, named, none = study.ask(), study.ask(), study.ask()
    tell_constraint(listed, 3.0)
    named.set_constraint(CONSTRAINT, 5.0)
    for trial in (listed, named, none):
        study.tell(trial, 1.0)
    assert [memory_constraint(t) for t in study.trials] == [3.0, 5.0, None]


def test_what_gp_is_told_by_hand():
    """GP learns from COMPLETE trials only: a pre-screened point is told COMPLETE at the worst value
    (keeping its deficit and attributes), a slow trial at its partial value, or the worst value
    when it had none; other samplers get the outcome unchanged."""
    from hydra_plugins.grpo_optuna_sweeper.outcome import Outcome, for_sampler, judge, prescreen_verdict

    pruned = prescreen_verdict(1500.0, 1000.0, 0.1)
    gp = for_sampler(pruned, "gp", "maximize")
    assert (gp.state, gp.value, gp.constraint, gp.attrs["status"]) == ("COMPLETE", 0.0, 500.0, "pruned")
    assert math.isinf(for_sampler(pruned, "gp", "minimize").value)
    assert for_sampler(pruned, "tpe", "maximize") is pruned and for_sampler(None, "gp", "maximize") is None
    slow = Outcome("PRUNED", None, 0.0, {"status": "slow"})
    assert (for_sampler(slow, "gp", "maximize").state, for_sampler(slow, "gp", "maximize").value) == ("COMPLETE", 0.0)
    assert for_sampler(Outcome("PRUNED", 7.0, 0.0, {"status": "slow"}), "gp", "minimize").value == 7.0
    ok = judge(
        {"status": "ok", "tokens_per_s": 1.0}, objective="tokens_per_s", direction="maximize", budget_bytes=None, headroom=None
    )
    assert for_sampler(ok, "gp", "maximize") is ok
    assert pruned.attrs == {
        "status": "pruned",
        "deficit_bytes": 500.0,
        "deficit_source": "estimator",
        "error": "predicted 0.00 GiB > budget 0.00 GiB + 10% margin: not run",
    }
    assert (
        prescreen_verdict(3 * GIB, 2 * GIB, 0.25).attrs["error"] == "predicted 3.00 GiB > budget 2.00 GiB + 25% margin: not run"
    )
    # An OOM known only by its peak: peak - budget, through judge too.
    oom = judge(
        {"status": "oom", "peak_memory_bytes": 1100},
        objective="tokens_per_s",
        direction="maximize",
        budget_bytes=1000,
        headroom=None,
    )
    assert (oom.constraint, oom.attrs["deficit_bytes"], oom.attrs["deficit_source"]) == (100.0, 100.0, "peak - budget")


def test_stale_trial_retry_respects_max_retry(tmp_path):
    """A dead worker's trial (journal storage) is failed; it is queued again only while retries are left."""
    from hydra_plugins.grpo_optuna_sweeper.workers import fail_stale_trials

    for max_retry, waiting in ((0, 0), (1, 1)):
        sweeper = plugin_sweeper(tmp_path / str(max_retry))
        study = create_study(sweeper.plan)
        stale = study.ask()
        assert fail_stale_trials(study, grace_period=-1, max_retry=max_retry) == [stale.number]  # no beat within -1 s
        states = [t.state.name for t in study.trials]
        assert states == ["FAIL"] + ["WAITING"] * waiting, (max_retry, states)


def test_timed_steps_by_hand():
    """The intermediate values told to Optuna: each timed step (not the warm-up one, step 1) that has
    both a step number and a finite value of the objective."""
    from hydra_plugins.grpo_optuna_sweeper.outcome import timed_steps

    history = [
        {"step": 1, "tokens_per_s": 10.0},  # warm-up
        {"step": 2, "tokens_per_s": 20.0},
        {"tokens_per_s": 25.0},  # no step number
        {"step": 4, "tokens_per_s": float("nan")},
        {"step": 5, "tokens_per_s": True},  # not a number
        {"step": 6},
        {"step": 7, "tokens_per_s": 70},
    ]
    assert timed_steps({"history": history}, "tokens_per_s") == [(2, 20.0), (7, 70.0)]
    assert timed_steps({"history": history}, "step_time_s") == []
    assert timed_steps(None, "tokens_per_s") == timed_steps({}, "tokens_per_s") == []
    # num_iterations=2: every other step trains the last generation again, 0 new tokens: no tokens/s of its own
    reuse = [{"step": s, "tokens": 96 if s % 2 else 0, "tokens_per_s": 50.0 if s % 2 else 0.0} for s in range(1, 6)]
    assert timed_steps({"history": reuse}, "tokens_per_s") == [(3, 50.0), (5, 50.0)]


def test_trials_csv_rows_by_hand(tmp_path):
    """trials.csv's row for a trial: the swept value, else the lever value the trial recorded
    (a fixed lever is still a column), lists joined by spaces, the first line of an error."""
    from optuna.distributions import IntDistribution

    from hydra_plugins.grpo_optuna_sweeper.summary import rows

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    trial = study.ask({"per_device_train_batch_size": IntDistribution(2, 8, step=2)})
    swept = trial.params["per_device_train_batch_size"]
    levers = {"per_device_train_batch_size": 99, "lora_rank": 8, "lora_target_modules": ["q_proj", "v_proj"]}
    record = _ok(10.0, 0.5) | {"levers": levers, "error": "first line\nsecond line", "run_dir": "runs/0"}
    from hydra_plugins.grpo_optuna_sweeper.outcome import judge

    common = {"objective": "tokens_per_s", "direction": "maximize", "budget_bytes": BUDGET, "headroom": None}
    tell_outcome(sweeper, study, trial, judge(record, **common))
    columns, (row,) = rows(study)
    assert columns[:5] == ["number", "state", "status", "feasible", "objective"]
    assert columns[5:12] == [
        "peak_memory_bytes",
        "predicted_peak_bytes",
        "predicted_calibrated_bytes",
        "prescreen_correction",
        "prescreen_allowance",
        "budget_bytes",
        "deficit_bytes",
    ]
    assert columns[-6:] == ["learning", "preset", "worker", "run_dir", "wandb_run_id", "error"]
    assert (row["per_device_train_batch_size"], row["lora_rank"], row["lora_target_modules"]) == (swept, 8, "q_proj v_proj")
    assert (row["error"], row["run_dir"], row["preset"]) == ("first line", "runs/0", "")
    assert (row["state"], row["status"], row["feasible"], row["objective"]) == ("COMPLETE", "ok", True, 10.0)
    assert row["peak_memory_bytes"] == 0.5 * GIB and row["predicted_peak_bytes"] == ""
    assert row["learning"] == ""  # no learning check given: nothing said
    # the learning check's verdict, per trial: flagged -> "changed"; an ok trial it compared -> "same"
    assert rows(study, {trial.number: object()})[1][0]["learning"] == "changed"
    assert rows(study, {})[1][0]["learning"] == "same"


def test_best_trial_with_confirmation_runs_by_hand(tmp_path):
    """With confirmation runs, best_trial is the original trial of the config with the best median
    over its runs that ran ok: a confirmation run joins the trial it confirms; one that ran out of
    memory adds no value to the median; once the plan chose its finalists, a config run once does not
    compete with confirmed ones."""
    from hydra_plugins.grpo_optuna_sweeper.standings import best_trial

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    assert best_trial(study) is None  # nothing ran
    oom_only = _tell_record(sweeper, study, dict(OOM), headroom=None)
    over_by_one_byte = {"status": "ok", "tokens_per_s": 500.0, "peak_memory_bytes": BUDGET + 1, "memory_source": "cuda"}
    _tell_record(sweeper, study, over_by_one_byte, headroom=None)
    assert best_trial(study) is None  # an OOM and a trial one byte over: nothing feasible
    a = _tell_record(sweeper, study, _ok(100.0, 0.5), headroom=None)
    b = _tell_record(sweeper, study, _ok(150.0, 0.5), headroom=None)
    assert best_trial(study).number == b
    _tell_record(sweeper, study, _ok(130.0, 0.5), headroom=None, number_attrs={"confirms": a})  # a: median 115
    _tell_record(sweeper, study, dict(OOM), headroom=None, number_attrs={"confirms": b})  # b: still 150 (the OOM adds nothing)
    assert best_trial(study).number == b
    _tell_record(sweeper, study, _ok(70.0, 0.5), headroom=None, number_attrs={"confirms": b})  # b: median of 150, 70 = 110
    assert best_trial(study).number == a
    single = _tell_record(sweeper, study, _ok(1000.0, 0.5), headroom=None)
    assert best_trial(study).number == single  # before confirmation chose finalists, every config competes
    study.set_user_attr("confirmation", {"finalists": [a, b], "runs": []})  # what confirm.choose records
    assert best_trial(study).number == a and single != oom_only  # never confirmed: not a finalist


def test_boundaries_mutation_found_in_the_best_rule(tmp_path):
    """A trial at exactly 0 bytes over (CPU RSS: ran without OOM, not comparable with a card) is
    feasible and can win; equal values go to the earlier trial; GP is told a pre-screened point as
    COMPLETE at the worst value (it ignores PRUNED ones)."""
    from helpers.config import compose

    from grpo_sweep.units import budget_bytes
    from hydra_plugins.grpo_optuna_sweeper.standings import best_trial

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    rss = {"status": "ok", "tokens_per_s": 50.0, "peak_memory_bytes": 5 * GIB, "memory_source": "cpu-rss"}
    first = _tell_record(sweeper, study, rss, headroom=None)
    _tell_record(sweeper, study, dict(rss), headroom=None)  # the same value, later
    assert memory_constraint(study.trials[first]) == 0.0 and best_trial(study).number == first

    gp = plugin_sweeper(tmp_path / "gp", sampler="gp")
    cfg = compose(["+sweeps=tiny_cpu", "gpu.memory_gib=0.001"])
    verdict = prescreen_point(gp, create_study(gp.plan).ask(), cfg, budget_bytes(cfg))
    assert (verdict.state, verdict.value) == ("COMPLETE", 0.0) and verdict.constraint > 0


def test_counts_and_room_by_hand(tmp_path):
    """What counts toward n_trials: COMPLETE, PRUNED, and a FAIL that was neither retried nor a
    surplus; room = target - counted - running - queued. Worked out by hand on a real study."""
    import optuna

    from hydra_plugins.grpo_optuna_sweeper.progress import counts, room
    from hydra_plugins.grpo_optuna_sweeper.workers import retry

    study = create_study(plugin_sweeper(tmp_path).plan)
    assert counts(study) == (0, []) and room(study, 5) == 5
    done, pruned, failed, retried, surplus = (study.ask() for _ in range(5))
    study.tell(done, 1.0)
    study.tell(pruned, state=optuna.trial.TrialState.PRUNED)
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    study.tell(retried, state=optuna.trial.TrialState.FAIL)
    surplus.set_user_attr("status", "surplus")
    study.tell(surplus, state=optuna.trial.TrialState.FAIL)
    assert counts(study) == (4, [])  # the retry is not enqueued yet: the failure counts
    retry(study, study.trials[retried.number], max_retry=2)  # WAITING, its retry_history names `retried`
    running = [study.ask() for _ in range(3)]  # the retry first, then two new trials
    assert counts(study) == (3, sorted(t.number for t in running))
    study.enqueue_trial({})
    assert room(study, 10) == 10 - 3 - 3 - 1
    assert room(study, 3) == 3 - 3 - 3 - 1  # negative: more than the target under way


def test_time_left_and_durations_by_hand():
    from hydra_plugins.grpo_optuna_sweeper.progress import Progress, _duration, _num

    t0 = datetime.datetime(2026, 1, 1, 12, 0, 0)
    fresh = Progress(4, t0)
    assert fresh.time_left(0, t0) is None and fresh.time_left(1, t0 + datetime.timedelta(seconds=10)) == 30.0
    assert fresh.time_left(6, t0 + datetime.timedelta(seconds=10)) == 0.0  # past the target: nothing left
    resumed = Progress(10, t0)
    resumed.start(3)
    assert resumed.time_left(3, t0) is None and resumed.time_left(2, t0) is None
    assert resumed.time_left(5, t0 + datetime.timedelta(seconds=100)) == 100 / 2 * 5
    assert resumed.line(12, None, "x", now=t0) == (
        "trial 10/10 (+2 confirmation runs within confirm_budget) | no feasible trial yet | ~0s left"
    )
    assert [_duration(s) for s in (0, 59.4, 59.6, 60, 61, 3599, 3600, 3661, 7322)] == [
        "0s", "59s", "1m00s", "1m00s", "1m01s", "59m59s", "1h00m", "1h01m", "2h02m",
    ]  # fmt: skip
    assert [_num(v) for v in (123.456, 0.000123456, 1e9, math.inf, -math.inf)] == ["123.5", "0.0001235", "1e+09", "inf", "-inf"]
    best = SimpleNamespace(number=7)
    one = best_rule.Finalist(best, [best], [math.nan], math.nan)
    assert Progress(2, t0).line(1, one, "tps", now=t0) == "trial 1/2 | best tps=nan (trial 7) | ~0s left"


def test_the_told_line_and_what_is_told_by_hand(tmp_path, caplog):
    """tell records the outcome's attributes and constraint on the trial and tells the study the
    value only for COMPLETE; its line shows the value to one decimal, `-` otherwise, and says
    `infeasible` for a constraint over 0. A progress line that fails does not fail the trial; a
    GridSampler's end of grid (Study.stop) is not an error, any other RuntimeError is."""
    import logging

    import optuna

    from hydra_plugins.grpo_optuna_sweeper import tell as tell_module
    from hydra_plugins.grpo_optuna_sweeper.outcome import Outcome

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    cases = [
        (Outcome("COMPLETE", 12.345, 0.0, {"status": "ok"}), "COMPLETE ok (tokens_per_s=12.3)"),
        (Outcome("COMPLETE", 9.0, 5.0, {"status": "ok"}), "COMPLETE ok (tokens_per_s=9.0, infeasible)"),
        (Outcome("PRUNED", 3.0, 2.0, {"status": "prescreened"}), "PRUNED prescreened (tokens_per_s=-, infeasible)"),
        (Outcome("FAIL", None, None, {"status": "failed", "error": "boom"}), "FAIL failed (tokens_per_s=-)"),
    ]
    for outcome, shown in cases:
        trial = study.ask()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=tell_module.__name__):
            tell_outcome(sweeper, study, trial, outcome)
        (line,) = [r.getMessage() for r in caplog.records if r.name == tell_module.__name__]
        assert line.startswith(f"Trial {trial.number}: {shown} | trial "), line
        frozen = study.trials[trial.number]
        assert frozen.state.name == outcome.state
        assert frozen.value == (outcome.value if outcome.state == "COMPLETE" else None)
        assert {k: frozen.user_attrs[k] for k in outcome.attrs} == outcome.attrs
        assert memory_constraint(frozen) == outcome.constraint
    assert tell_module.progress_line(study, "tokens_per_s", "not a Progress") == "progress unavailable (AttributeError)"

    class Stopping:
        def __init__(self, message):
            self.message = message

        def tell(self, *args, **kwargs):
            raise RuntimeError(self.message)

        def get_trials(self, deepcopy=True, states=None):
            return study.get_trials(deepcopy=deepcopy, states=states)

    grid_end = Stopping("`Study.stop` is supposed to be invoked inside an objective function or a callback.")
    tell_module.tell(grid_end, study.ask(), Outcome("COMPLETE", 1.0), "tokens_per_s", sweeper.progress)
    with pytest.raises(RuntimeError, match="another"):
        tell_module.tell(Stopping("another"), study.ask(), Outcome("COMPLETE", 1.0), "tokens_per_s", sweeper.progress)
    assert tell_module.state("PRUNED") is optuna.trial.TrialState.PRUNED


def test_prescreen_returns_its_prediction_by_hand(tmp_path):
    """The pre-screen returns its prediction for the caller to record: each phase in whole bytes,
    the generation waves, the calibrated peak; with the pre-screen off, nothing. The throughput
    model's tokens/s is the forecast's, not the pre-screen's."""
    from helpers.config import compose

    from grpo_sweep.memory.estimator import estimate
    from hydra_plugins.grpo_optuna_sweeper.forecast import predicted_tokens_per_s

    cfg = compose(["gpu=l4_24g"])
    est = estimate(cfg)
    speed = predicted_tokens_per_s(cfg)
    assert speed is not None and speed > 0
    on = plugin_sweeper(tmp_path / "on")
    verdict = on.prescreen.verdict(cfg, None)
    attrs = verdict.attrs
    assert verdict.outcome is None and verdict.runs
    assert attrs["predicted_phases"] == {p: int(v) for p, v in est.phases.items()} and attrs["predicted_phases"]
    assert all(type(v) is int for v in attrs["predicted_phases"].values())
    assert attrs["generation_waves"] == est.assumptions.get("generation_waves")
    assert attrs["predicted_peak_bytes"] == int(est.total_bytes) and "predicted_tokens_per_s" not in attrs
    assert {k: attrs[k] for k in verdict.calibrated.attrs()} == verdict.calibrated.attrs()
    with pytest.raises(TypeError):
        attrs["predicted_peak_bytes"] = 0  # frozen: the caller records a copy
    off = plugin_sweeper(tmp_path / "off", prescreen=False).prescreen.verdict(cfg, None)
    assert off.runs and dict(off.attrs) == {} and off.calibrated is None
    from omegaconf import OmegaConf

    unpriced = OmegaConf.create(OmegaConf.to_container(cfg))
    del unpriced["model"]
    assert predicted_tokens_per_s(unpriced) is None  # a config the model cannot price: no prediction


def test_the_told_line_ends_with_the_progress_by_hand(tmp_path, caplog):
    """The told line ends with the study's progress in the sweep's objective: the count, the best
    feasible value so far and its trial, the time left."""
    import logging

    from hydra_plugins.grpo_optuna_sweeper import tell as tell_module
    from hydra_plugins.grpo_optuna_sweeper.outcome import Outcome

    sweeper = plugin_sweeper(tmp_path)
    study = create_study(sweeper.plan)
    trial = study.ask()
    with caplog.at_level(logging.INFO, logger=tell_module.__name__):
        tell_outcome(sweeper, study, trial, Outcome("COMPLETE", 12.5, 0.0, {"status": "ok"}))
    (line,) = [r.getMessage() for r in caplog.records if r.name == tell_module.__name__]
    told, _, left = line.partition(" | ~")
    assert told == "Trial 0: COMPLETE ok (tokens_per_s=12.5) | trial 1/8 | best tokens_per_s=12.5 (trial 0)"
    assert re.fullmatch(r"\d+s left", left), line


def test_the_prescreen_judges_the_estimate_it_is_given_against_its_budget_by_hand(tmp_path):
    """The pre-screen judges the estimate the caller passes (not one of its own), against the budget
    that estimate names; the caller's budget only where the estimate names none. The tiny model
    needs 57.4 MiB (60,159,104 bytes): over a 10 MiB simulated card by far, within an L4."""
    from helpers.config import compose

    from grpo_sweep.memory.estimator import estimate

    prescreen = plugin_sweeper(tmp_path).prescreen
    on_l4 = compose(["gpu=l4_24g"])
    small_card = estimate(compose(["gpu=cpu_sim", "gpu.memory_gib=0.01"]))
    assert (small_card.total_bytes, small_card.budget_bytes) == (60_159_104, 10_737_418)
    pruned = prescreen.verdict(on_l4, 10**15, est=small_card).outcome
    assert pruned.state == "PRUNED" and pruned.constraint == 60_159_104 - 10_737_418
    assert prescreen.verdict(on_l4, 10**15).runs  # its own estimate: within the L4
    unsized = compose(["gpu=l4_24g", "gpu.memory_gib=null"])
    assert prescreen.verdict(unsized, 10**15).runs
    assert prescreen.verdict(unsized, 2**20).outcome.state == "PRUNED"  # no card named: the caller's budget


def test_the_calibrated_prescreen_line_by_hand():
    """A calibrated verdict's line: the calibrated and raw predictions, their ratio, the trials behind
    it, the budget and the allowance, in GiB to three decimals."""
    from hydra_plugins.grpo_optuna_sweeper.outcome import prescreen_verdict

    gib = 2**30
    pruned = prescreen_verdict(3 * gib, 2 * gib, 0.125, raw_bytes=2.5 * gib, trials=4)
    assert pruned.attrs["error"] == (
        "calibrated prediction 3.000 GiB (raw 2.500 GiB x 1.200, from 4 measured trials) > budget 2.000 GiB "
        "+ 12.5% allowance: not run"
    )
    assert pruned.constraint == gib and pruned.attrs["deficit_bytes"] == gib
    assert prescreen_verdict(2.25 * gib, 2 * gib, 0.125, raw_bytes=2 * gib, trials=4) is None  # at the allowance


def test_the_prescreens_verdict_records_the_estimates_waves_and_a_cut_error_by_hand(monkeypatch):
    """The verdict's attributes carry the generation waves the estimate states, and an estimate that
    fails is recorded as its error's first 300 characters, the point let run (no outcome)."""
    from omegaconf import OmegaConf

    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.memory.estimator import estimate
    from grpo_sweep.study.attrs import Key
    from hydra_plugins.grpo_optuna_sweeper import prescreen as prescreen_module
    from hydra_plugins.grpo_optuna_sweeper.config import GrpoOptunaSweeperConf

    screen = prescreen_module.Prescreen(OmegaConf.structured(GrpoOptunaSweeperConf))
    cfg = compose_train_config(["+sweeps=tiny_cpu_vllm"])
    waves = estimate(cfg).assumptions["generation_waves"]
    assert waves is not None
    assert screen.verdict(cfg, None).attrs[Key.GENERATION_WAVES] == waves

    def fails(_cfg):
        raise ValueError("x" * 500)

    monkeypatch.setattr(prescreen_module, "estimate", fails)
    verdict = screen.verdict(cfg, None)
    assert verdict.outcome is None and verdict.attrs[Key.PREDICTED_ERROR] == "x" * 300
