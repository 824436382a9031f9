"""Issue 15: early stop of trials that cannot win, and a winner confirmed under noise.

Fast tests check the rules (the median-of-runs winner, the stop threshold, what Optuna is told for a
slow trial); the real ones run tiny-model trials (a trial stopped by its speed meter, with its peak
kept) and real sweeps (`python train.py -m +sweeps=tiny_cpu`, a real journal storage).
"""

from __future__ import annotations

import math

import pytest
import yaml
from conftest import IN_PROCESS_TRIALS, compose, load_metrics
from test_sweeper_helpers import SMALL, SPLIT_SPACE, counted, load_study, run_here, sweep_cmd

from grpo_sweep.metrics import KEYS, STATUSES
from grpo_sweep.study import best as best_rule
from grpo_sweep.trial.parent import run_trial
from hydra_plugins.grpo_optuna_sweeper import confirm
from hydra_plugins.grpo_optuna_sweeper.outcome import for_sampler, judge, memory_constraint, stop_threshold, timed_steps


# ------------------------------------------------------------------------------------- the rules
def test_best_median_wins_not_the_luckiest_run():
    # (group, value): config 0 had one lucky run (200) and two slow ones; config 1 is steadily fast.
    runs = [(0, 200.0), (1, 150.0), (2, 90.0), (0, 100.0), (1, 140.0), (0, 110.0), (1, 145.0), (2, None)]
    ranked = best_rule.finalists(runs, value=lambda r: r[1], group=lambda r: r[0], direction="maximize")
    assert [f.item for f in ranked] == [(1, 150.0), (0, 200.0), (2, 90.0)]
    assert ranked[0].median == 145.0 and ranked[0].runs == [150.0, 140.0, 145.0]
    assert ranked[1].spread == pytest.approx((200 - 100) / 110)
    assert best_rule.within_noise(ranked[0], ranked[1]) is True  # 0's range 100-200 covers 1's 140-150
    assert best_rule.best_of_runs(runs, value=lambda r: r[1], group=lambda r: r[0], direction="minimize").item[0] == 2
    # Without confirmation runs the rule is the plain best; a single run says nothing about noise.
    single = [(0, 1.0), (1, 3.0), (2, 2.0)]
    winner = best_rule.best_of_runs(single, value=lambda r: r[1], group=lambda r: r[0], direction="maximize")
    assert winner.item == best_rule.best(single, value=lambda r: r[1], direction="maximize") == (1, 3.0)
    assert best_rule.within_noise(winner, winner) is None
    # Clear winner: ranges apart.
    apart = [(0, 10.0), (0, 11.0), (1, 5.0), (1, 6.0)]
    top = best_rule.finalists(apart, value=lambda r: r[1], group=lambda r: r[0], direction="maximize")
    assert best_rule.within_noise(top[0], top[1]) is False


def test_best_rule_by_hand():
    """The one best-trial rule on hand-made values: the direction, ties, and what is no value at all
    (None, NaN, infinities and booleans never win, whichever direction)."""
    from optuna.study import StudyDirection

    items = [("a", 3.0), ("b", None), ("c", 5.0), ("d", 5.0), ("e", float("nan")), ("f", True), ("g", -math.inf), ("h", 4)]
    value = lambda r: r[1]  # noqa: E731
    assert best_rule.best(items, value=value, direction="maximize") == ("c", 5.0)  # a tie: the earlier
    assert best_rule.best(items, value=value, direction=StudyDirection.MINIMIZE) == ("a", 3.0)
    assert best_rule.best([("x", None), ("y", math.inf)], value=value, direction="maximize") is None
    assert best_rule.ranked(items, value=value, direction="maximize") == [("c", 5.0), ("d", 5.0), ("h", 4), ("a", 3.0)]
    assert best_rule.ranked(items, value=value, direction="MINIMIZE") == [("a", 3.0), ("h", 4), ("c", 5.0), ("d", 5.0)]
    with pytest.raises(ValueError, match="direction=up: must be one of maximize, minimize"):
        best_rule.best(items, value=value, direction="up")


def test_best_rule_ties_go_to_the_earlier_item_whatever_it_is():
    """Equal values: the earlier item wins even when a later one would sort first by itself."""
    value = lambda r: r[1]  # noqa: E731
    assert best_rule.best([("z", 5.0), ("a", 5.0)], value=value, direction="maximize") == ("z", 5.0)
    assert best_rule.ranked([("z", 5.0), ("a", 5.0)], value=value, direction="minimize") == [("z", 5.0), ("a", 5.0)]


def test_median_of_runs_rule_by_hand():
    """best_of_runs, the spread and the noise overlap on hand-made runs."""
    value, group = (lambda r: r[1]), (lambda r: r[0])
    # No confirmation runs: exactly the best single value.
    assert best_rule.best_of_runs([(0, 1.0), (1, 2.0)], value=value, group=group, direction="maximize").item == (1, 2.0)
    assert best_rule.best_of_runs([(0, 1.0), (1, 2.0)], value=value, group=group, direction="minimize").item == (0, 1.0)
    assert best_rule.best_of_runs([(0, None)], value=value, group=group, direction="maximize") is None
    # Config 0 ran twice (median 12), config 1 once (13): every config competes by its median.
    runs = [(0, 10.0), (1, 13.0), (0, 14.0)]
    won = best_rule.best_of_runs(runs, value=value, group=group, direction="maximize")
    assert (won.item, won.runs, won.median) == ((1, 13.0), [13.0], 13.0)
    # Once confirmation chose its finalists, only they compete: config 1's single run cannot win.
    top = best_rule.finalists(runs, value=value, group=group, direction="maximize", compete=[0])
    assert [(f.item, f.members, f.runs, f.median) for f in top] == [((0, 10.0), [(0, 10.0), (0, 14.0)], [10.0, 14.0], 12.0)]
    assert top[0].spread == pytest.approx(4 / 12)
    # A config's first run without a value (it ran out of memory) is not the one named: its first valued run is.
    flaky = best_rule.finalists([(0, None), (0, 7.0), (0, 9.0)], value=value, group=group, direction="maximize")
    assert (flaky[0].item, len(flaky[0].members), flaky[0].median) == ((0, 7.0), 3, 8.0)
    # The group of a trial: the config's first trial (a confirmation run, a repeat), else its own number.
    assert best_rule.config_group({"confirms": 3}, 9) == 3 and best_rule.config_group({"repeats": 4}, 9) == 4
    assert best_rule.config_group({"repeats": None}, 9) == 9 and best_rule.config_group({}, None) is None
    assert best_rule.competing({"confirmation": {"finalists": [2, 5], "runs": []}}) == [2, 5]
    assert best_rule.competing({"confirmation": {"finalists": [], "runs": []}}) is None and best_rule.competing({}) is None

    def fin(*runs, median=None):
        return best_rule.Finalist(runs[0], list(runs), list(runs), runs[0] if median is None else median)

    assert fin(5.0).spread is None  # one run: no spread
    assert fin(-1.0, 1.0, median=0.0).spread is None  # a zero median: no relative spread
    assert fin(90.0, 110.0, median=100.0).spread == pytest.approx(0.2)  # (max - min) / |median|
    assert fin(-90.0, -110.0, median=-100.0).spread == pytest.approx(0.2)
    assert best_rule.within_noise(fin(1.0, 2.0), fin(2.0, 3.0)) is True  # touching ranges overlap
    assert best_rule.within_noise(fin(2.0, 3.0), fin(1.0, 2.0)) is True
    assert best_rule.within_noise(fin(1.0, 2.0), fin(2.5, 3.0)) is False
    assert best_rule.within_noise(fin(2.5, 3.0), fin(1.0, 2.0)) is False
    assert best_rule.within_noise(fin(1.0), fin(1.0, 2.0)) is None
    assert best_rule.within_noise(fin(1.0, 2.0), fin(1.0)) is None


def test_stop_threshold_and_slow_outcome():
    assert stop_threshold(1000.0, 0.5, "tokens_per_s", "maximize") == 500.0
    assert stop_threshold(None, 0.5, "tokens_per_s", "maximize") is None  # nothing feasible yet
    assert stop_threshold(1000.0, None, "tokens_per_s", "maximize") is None  # off
    assert stop_threshold(1000.0, 0.5, "reward_mean", "maximize") is None  # the meter watches tokens/s only
    record = {
        "status": "slow",
        "tokens_per_s": 120.0,
        "peak_memory_bytes": 50,
        "memory_source": "cpu-tracker",
        "history": [{"step": 1, "tokens_per_s": 80.0}, {"step": 2, "tokens_per_s": 120.0}],
    }
    out = judge(record, objective="tokens_per_s", direction="maximize", budget_bytes=100, headroom=None)
    assert (out.state, out.value, out.constraint, out.attrs["status"]) == ("PRUNED", 120.0, -50.0, "slow")
    assert timed_steps(record, "tokens_per_s") == [(2, 120.0)]  # the warm-up step is not reported
    assert for_sampler(out, "tpe", "maximize").state == "PRUNED"
    gp = for_sampler(out, "gp", "maximize")  # GP learns from COMPLETE only: the partial value is real
    assert (gp.state, gp.value) == ("COMPLETE", 120.0)
    assert "slow" in STATUSES


def test_repeats_pool_and_confirmation_tops_up_by_hand():
    """A point run again joins its config (user attr `repeats`); the plan ranks configs by their
    median and tops the best ones up to 1 + repeats runs, interleaved; only finalists compete then."""
    import logging

    import optuna

    from hydra_plugins.grpo_optuna_sweeper.summary import best_trial, finalists

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    space = {"b": optuna.distributions.CategoricalDistribution([1, 2, 3, 4])}

    values = [(1, 100.0), (2, 180.0), (1, 120.0), (3, 90.0), (1, 140.0), (4, 175.0)]
    for b, value in values:
        study.enqueue_trial({"b": b})
        trial = study.ask(space)
        point = [f"b={b}"]
        trial.set_user_attr("overrides", point)
        assert confirm.mark_repeat(study, trial, point) == trial.user_attrs.get("repeats")
        trial.set_user_attr("status", "ok")
        study.tell(trial, value)
    assert [t.user_attrs.get("repeats") for t in study.trials] == [None, None, 0, None, 0, None]
    # Before confirmation every config competes by its median: b=2's one run (180) leads b=1's 120.
    assert best_trial(study).number == 1
    assert [(f.item.number, f.runs) for f in finalists(study)][:2] == [(1, [180.0]), (5, [175.0])]
    runs = confirm.plan(study, 3, 2, logging.getLogger("test"))
    # Top 3 by median: b=2 (180, 1 run), b=4 (175, 1 run), b=1 (120, 3 runs: needs none).
    assert study.user_attrs["confirmation"]["finalists"] == [1, 5, 0]
    assert [r["confirms"] for r in runs] == [1, 5, 1, 5]  # round-robin, topped up to 3 runs each
    assert confirm.plan(study, 3, 2, logging.getLogger("test")) == runs  # once per study
    for planned, value in zip(runs, [120.0, 170.0, 110.0, 172.0]):
        trial = study.ask(space)
        assert (
            trial.params == {"b": study.trials[planned["confirms"]].params["b"]}
            and trial.user_attrs["confirms"] == planned["confirms"]
        )
        trial.set_user_attr("status", "ok")
        study.tell(trial, value)
    # b=4: 175, 170, 172 -> 172; b=1: 100, 120, 140 -> 120; b=2: 180, 120, 110 -> 120 (a tie: the
    # earlier config first). b=3 (90, one run) never competes again.
    assert [(f.item.number, f.median) for f in finalists(study)] == [(5, 172.0), (0, 120.0), (1, 120.0)]
    assert best_trial(study).number == 5


def test_confirmation_budget_rule():
    assert confirm.effective_top(20, 3, 2, "tpe") == 3
    assert confirm.effective_top(12, 3, 2, "tpe") == 2
    assert confirm.effective_top(8, 3, 2, "tpe") == 0  # one finalist cannot change the winner: off
    assert confirm.effective_top(40, 0, 2, "tpe") == 0
    assert confirm.effective_top(40, 3, 2, "grid") == 0


# ----------------------------------------------------------------------------------- real trials
@IN_PROCESS_TRIALS
@pytest.mark.parametrize(
    "gpu, first_timed",
    [
        (["gpu=cpu_sim", "gpu.memory_gib=0.1"], 2),  # the tracker enforces a budget on every step
        (["gpu=cpu"], 3),  # the tracker measures steps 1-2 and stops: step 3 is the first untracked one
    ],
)
def test_slow_trial_stops_after_its_first_timed_step_with_its_peak(tmp_path, gpu, first_timed):
    overrides = ["trial.steps=5", "task.num_prompts=64", *SMALL, "num_generations=2", *gpu, "trial.stop_below=1e9"]
    record = run_trial(compose(overrides), tmp_path)
    assert record["status"] == "slow", record["error"]
    assert "trial.stop_below" in record["error"]
    on_disk = load_metrics(tmp_path)
    assert set(on_disk) <= KEYS
    assert on_disk["steps"] == first_timed and [r["step"] for r in on_disk["history"]] == list(range(1, first_timed + 1))
    assert on_disk["peak_memory_bytes"] > 0 and on_disk["memory_source"] == "cpu-tracker"
    assert on_disk["tokens_per_s"] > 0  # the partial throughput is kept


@IN_PROCESS_TRIALS
def test_fast_trial_is_not_stopped(tmp_path):
    record = run_trial(
        compose(["trial.steps=3", "task.num_prompts=64", *SMALL, "num_generations=2", "trial.stop_below=0.001"]), tmp_path
    )
    assert record["status"] == "ok" and record["steps"] == 3 and record["error"] is None


def test_stop_below_must_be_positive():
    from grpo_sweep.config.schema import ConfigError, validate

    with pytest.raises(ConfigError, match="trial.stop_below"):
        validate(compose(["trial.stop_below=-5"]))


# ----------------------------------------------------------------------------------- real sweeps
@pytest.mark.slow
def test_sweep_prunes_slow_trials_with_intermediate_values(tmp_path):
    """stop_below=1 against the study's best: a first sweep's one trial (batch 8) is feasible; the same
    command again with trial.debug_fault=slow (every step 1 s longer: several times slower, whatever
    this machine's noise; a knob, so the study is the same) runs the next two (batch 2 and 4) below
    it, and both stop after their first timed step. Over 20 s: two sweeps, and two trials made 1 s a step slower on
    purpose."""
    args = [
        "hydra.sweeper.stop_below=1",
        "hydra.sweeper.enqueue=[{per_device_train_batch_size:8},{per_device_train_batch_size:2},{per_device_train_batch_size:4}]",
        "trial.steps=3",
        "max_seq_length=64",
        *SPLIT_SPACE,
        "per_device_train_batch_size=choice(2,4,8)",
    ]
    result = run_here(sweep_cmd(tmp_path, "hydra.sweeper.n_trials=1", *args, enqueue=True))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    result = run_here(sweep_cmd(tmp_path, "hydra.sweeper.n_trials=3", *args, "trial.debug_fault=slow", enqueue=True))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(f"journal:{tmp_path / 'study.journal'}")
    first, *rest = study.trials
    assert first.state.name == "COMPLETE" and first.user_attrs["status"] == "ok"
    assert sorted(first.intermediate_values) == [2, 3]  # each timed step's tokens/s
    assert rest and len(counted(study)) == 3  # a slow trial counts as a trial, like any other
    for t in rest:
        assert t.state.name == "PRUNED" and t.user_attrs["status"] == "slow", t.user_attrs
        assert t.user_attrs["stop_below"] == pytest.approx(first.value, rel=1e-5)
        assert list(t.intermediate_values) == [2] and t.value == t.intermediate_values[2]
        assert t.user_attrs["peak_memory_bytes"] > 0 and memory_constraint(t) <= 0
        metrics = load_metrics(t.user_attrs["run_dir"])
        assert metrics["status"] == "slow" and metrics["steps"] == 2
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["best_trial"] == first.number and best["trials"] == {"COMPLETE": 1, "PRUNED": 2}
    report = (tmp_path / "report.html").read_text()
    assert "2 slow" in report and 'class="slow' in report


@pytest.mark.slow
def test_confirmation_runs_are_recorded_and_the_best_median_wins(tmp_path):
    """n_trials=6, top 2 x 1 repeat: 4 search trials, then each finalist topped up to 2 runs, all in the study."""
    result = run_here(
        sweep_cmd(
            tmp_path,
            "hydra.sweeper.n_trials=6",
            "hydra.sweeper.confirm_top=2",
            "hydra.sweeper.confirm_repeats=1",
            "hydra.sweeper.stop_below=null",
            "hydra.sweeper.prescreen=false",
            *SPLIT_SPACE,
            "max_seq_length=64,128",
            "per_device_train_batch_size=2,4",
            "completions_per_step=4",
            "hydra.sweeper.concessions=[max_seq_length]",
            "lora_rank=8",
            "lora=qv",
        )
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(f"journal:{tmp_path / 'study.journal'}")
    search = study.trials[:4]
    confirmations = study.trials[4:]
    assert all(t.user_attrs.get("confirms") is not None for t in confirmations)
    # Runs of one point pool under the config's first trial (a repeat asked by the sampler, a confirmation run).
    group = {t.number: t.user_attrs.get("repeats", t.number) for t in search}
    for t in search:
        assert t.params == study.trials[group[t.number]].params
    runs = {}
    for t in search:
        if t.user_attrs["status"] == "ok":
            runs.setdefault(group[t.number], []).append(t.value)
    median = lambda vs: sorted(vs)[len(vs) // 2] if len(vs) % 2 else sum(sorted(vs)[len(vs) // 2 - 1 : len(vs) // 2 + 1]) / 2  # noqa: E731
    finalists = sorted(runs, key=lambda n: -median(runs[n]))[:2]
    assert study.user_attrs["confirmation"]["finalists"] == finalists
    # Each finalist is topped up to 1 + confirm_repeats = 2 runs, interleaved; counted in n_trials.
    assert sorted(t.user_attrs["confirms"] for t in confirmations) == sorted(n for n in finalists if len(runs[n]) < 2)
    assert len(counted(study)) == len(study.trials) == 4 + len(confirmations)
    for t in confirmations:
        assert t.params == study.trials[t.user_attrs["confirms"]].params
        assert "stop_below" not in t.user_attrs  # a confirmation run always runs to its end
    medians = {}
    for n in finalists:
        values = runs[n] + [t.value for t in confirmations if t.user_attrs["confirms"] == n and t.user_attrs["status"] == "ok"]
        medians[n] = median(values)
    winner = max(medians, key=medians.get)
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["best_trial"] == winner and best["best_value"] == pytest.approx(medians[winner])
    assert [f["trial"] for f in best["finalists"]] == sorted(finalists, key=lambda n: -medians[n])
    assert all(len(f["runs"]) >= 2 and f["spread"] is not None for f in best["finalists"])
    assert isinstance(best["top_two_within_noise"], bool)
    assert "Confirmed finalists" in result.stdout
    report = (tmp_path / "report.html").read_text()
    assert "id=finalists" in report and "id=noise-note" in report
