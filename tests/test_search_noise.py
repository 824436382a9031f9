"""Issue 15: early stop of trials that cannot win, and a winner confirmed under noise.

Fast tests check the rules (the median-of-runs winner, the stop threshold, what Optuna is told for a
slow trial); the real ones run tiny-model trials (a trial stopped by its speed meter, with its peak
kept) and real sweeps (`python train.py -m +sweeps=tiny_cpu`, a real journal storage).
"""

from __future__ import annotations

import math

import pytest
import yaml
from helpers.config import compose
from helpers.runners import IN_PROCESS_TRIALS, SMALL, SPLIT_SPACE, load_metrics, sweep_args, train_here
from helpers.studies import counted, load_study

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
    sigma, configs = best_rule.relative_noise(ranked)
    assert configs == 2 and best_rule.within_noise(ranked[0], ranked[1], sigma) is True  # 0's runs 100-200: noisy
    assert best_rule.finalists(runs, value=lambda r: r[1], group=lambda r: r[0], direction="minimize")[0].item[0] == 2
    # Without confirmation runs the rule is the plain best; a single run says nothing about noise.
    single = [(0, 1.0), (1, 3.0), (2, 2.0)]
    winner = best_rule.finalists(single, value=lambda r: r[1], group=lambda r: r[0], direction="maximize")[0]
    assert winner.item == best_rule.best(single, value=lambda r: r[1], direction="maximize") == (1, 3.0)
    assert best_rule.relative_noise([winner]) == (None, 0)
    assert best_rule.within_noise(winner, winner, None) is None
    # Clear winner: ranges apart.
    apart = [(0, 10.0), (0, 11.0), (1, 5.0), (1, 6.0)]
    top = best_rule.finalists(apart, value=lambda r: r[1], group=lambda r: r[0], direction="maximize")
    assert best_rule.within_noise(top[0], top[1], best_rule.relative_noise(top)[0]) is False


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
    """The median-of-runs winner (`finalists`), the spread and the noise overlap on hand-made runs."""
    value, group = (lambda r: r[1]), (lambda r: r[0])
    # No confirmation runs: exactly the best single value.
    assert best_rule.finalists([(0, 1.0), (1, 2.0)], value=value, group=group, direction="maximize")[0].item == (1, 2.0)
    assert best_rule.finalists([(0, 1.0), (1, 2.0)], value=value, group=group, direction="minimize")[0].item == (0, 1.0)
    assert best_rule.finalists([(0, None)], value=value, group=group, direction="maximize") == []
    # Config 0 ran twice (median 12), config 1 once (13): every config competes by its median.
    runs = [(0, 10.0), (1, 13.0), (0, 14.0)]
    won = best_rule.finalists(runs, value=value, group=group, direction="maximize")[0]
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
    # The noise: runs' sample variance relative to their mean, pooled over configs by degrees of freedom.
    assert best_rule.relative_noise([fin(90.0, 110.0, median=100.0), fin(5.0)]) == (pytest.approx(0.02**0.5), 1)
    pooled, configs = best_rule.relative_noise([fin(90.0, 110.0, median=100.0), fin(100.0, 100.0, 100.0)])
    assert configs == 2 and pooled == pytest.approx((0.02 / 3) ** 0.5)  # 0.02 of squares over 1 + 2 degrees of freedom
    assert best_rule.relative_noise([fin(100.0, 100.0)])[0] == best_rule.NOISE_FLOOR  # equal runs: the floor
    # A config's interval: median +- 2 sigma |median| / sqrt(runs); two configs tie while theirs overlap.
    a, b = fin(90.0, 110.0, median=100.0), fin(120.0, 130.0, median=125.0)
    assert best_rule.interval(a, 0.1) == pytest.approx((100 - 20 / 2**0.5, 100 + 20 / 2**0.5))
    assert best_rule.within_noise(a, b, 0.1) is True and best_rule.within_noise(b, a, 0.1) is True
    assert best_rule.within_noise(a, b, 0.02) is False and best_rule.within_noise(b, a, 0.02) is False
    assert best_rule.within_noise(a, b, None) is None  # no noise measured: nothing can be said


def test_a_tie_is_won_by_the_config_with_the_most_memory_headroom():
    """decide: configs within the leader's noise tie; among the tied ones shown within 5 % of the
    leader the one whose worst run used the smallest share of the budget wins, else the best median;
    a leader separated from the rest wins outright."""
    budget = 1000
    # (group, value, peak): config 0 leads on median (150) at 90 % of the budget, config 1 (146) at 60 %,
    # config 2 (100) is separated; the noise, about 3 %, comes from the configs' own runs.
    runs = [(0, 154.0, 900), (1, 150.0, 600), (2, 100.0, 500), (0, 146.0, 880), (1, 142.0, 610), (2, 98.0, 500)]

    def decide(items, compete=None):
        return best_rule.decide(
            items,
            value=lambda r: r[1],
            group=lambda r: r[0],
            direction="maximize",
            compete=compete,
            peak_of=lambda r: r[2],
            budget_of=lambda r: budget,
        )

    def six(group: int, median: float, peaks) -> list:
        """Six runs of a config around `median` (+-1), its peaks in order."""
        return [(group, median + d, peak) for d, peak in zip((1, -1, 0, 0, 1, -1), peaks)]

    ruling = decide(runs)
    assert [f.item[0] for f in ruling.by_median] == [0, 1, 2] and ruling.leader.item[0] == 0
    assert ruling.sigma == pytest.approx((0.003127 / 3) ** 0.5, rel=1e-3) and ruling.noise_configs == 3
    assert [f.item[0] for f in ruling.tie] == [0, 1]  # config 2 is separated: not in the tie
    # Two runs each: config 1's interval (141.9-150.1) reaches 5.4 % below the leader's 150, not shown
    # within 5 %: the tie is reported and the best median wins it, whatever the memory.
    assert ruling.close == [] and ruling.winner.item[0] == 0 and [f.item[0] for f in ruling.ranked] == [0, 1, 2]
    assert [f.item[0] for f in ruling.unseparated()] == [1] == [f.item[0] for f in ruling.undecided()]
    # Six runs each, 150 against 148: config 1's interval (145.6-150.4) lies within 5 % of the
    # leader's 150: config 1, with the more headroom, wins; it is no longer undecided.
    close = six(0, 150.0, [900] * 6) + six(1, 148.0, [600, 610, 600, 600, 605, 600]) + [(2, 100.0, 500), (2, 98.0, 500)]
    ruling = decide(close)
    assert ruling.sigma == best_rule.NOISE_FLOOR and [f.item[0] for f in ruling.tie] == [0, 1]
    assert [f.item[0] for f in ruling.close] == [0, 1] and best_rule.indifferent(ruling.tie[0], ruling.tie[1], ruling.sigma)
    assert ruling.winner.item[0] == 1 and [f.item[0] for f in ruling.ranked] == [1, 0, 2]
    assert ruling.memory(ruling.winner) == (610, pytest.approx(0.61))  # its worst run's peak
    assert [f.item[0] for f in ruling.unseparated()] == [1] and ruling.undecided() == []
    # Separated: config 1 slower by far, the leader wins whatever its memory.
    apart = [(0, 154.0, 900), (1, 120.0, 600), (0, 150.0, 900), (1, 121.0, 600)]
    ruling = decide(apart)
    assert ruling.tie == [] and ruling.winner.item[0] == 0 and ruling.unseparated() == []
    # No noise measured (every config ran once): no tie claimed, and every config is unseparated.
    ruling = decide([(0, 154.0, 900), (1, 150.0, 600)])
    assert ruling.sigma is None and ruling.tie == [] and ruling.winner.item[0] == 0
    assert [f.item[0] for f in ruling.unseparated()] == [1] == [f.item[0] for f in ruling.undecided()]
    assert not best_rule.indifferent(ruling.by_median[0], ruling.by_median[1], None)
    # A tied config whose peak is unknown is never the safer one; equal headroom keeps the better median.
    unknown = six(0, 150.0, [900] * 6) + six(1, 148.0, [None] * 6)
    assert len(decide(unknown).close) == 2 and decide(unknown).winner.item[0] == 0
    equal = six(0, 150.0, [600] * 6) + six(1, 148.0, [600] * 6)
    assert decide(equal).winner.item[0] == 0 and len(decide(equal).tie) == 2 == len(decide(equal).close)
    # Only the competing configs (confirmation's finalists) can tie; the noise is every config's.
    assert decide(runs, compete=[0, 2]).tie == [] and decide(runs, compete=[0, 2]).winner.item[0] == 0
    assert decide(close, compete=[0, 2]).tie == [] and decide(close, compete=[0, 2]).winner.item[0] == 0


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


def test_repeats_pool_and_confirmation_runs_on_while_the_finalists_overlap():
    """A point run again joins its config (user attr `repeats`); the plan ranks configs by their
    median and runs the finalists again in rounds while they overlap, past 1 + confirm_repeats runs
    (the budget, not confirm_repeats, bounds it); only finalists compete then."""
    import logging

    import optuna

    from hydra_plugins.grpo_optuna_sweeper.standings import best_trial, finalists

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
    log = logging.getLogger("test")
    # The finalists: the top 3 by median, b=2 (180, 1 run), b=4 (175, 1 run), b=1 (120, 3 runs).
    assert confirm.choose(study, 3, log) == [1, 5, 0] == study.user_attrs["confirmation"]["finalists"]
    assert confirm.choose(study, 3, log) == [1, 5, 0]  # once per study
    # b=1's runs (100-140) measure about 17 % of noise: nothing is separated or within 5 %. The
    # leader and every finalist run again, b=1 too though it already has 1 + confirm_repeats = 3 runs.
    assert [r["confirms"] for r in _round(study, space, {2: [120.0], 4: [170.0], 1: [130.0]}, log)] == [1, 5, 0]
    # b=4 leads now (175, 170); b=1 (4 runs, 125) and b=2 (180, 120) are still within its noise: all run again.
    assert [r["confirms"] for r in _round(study, space, {4: [172.0], 2: [110.0], 1: [125.0]}, log)] == [5, 1, 0]
    # Still overlapping at 16 % noise, the whole budget left (1); the next round would take confirmation
    # past the search's own 6 trials, the bound confirm_budget=1 keeps: it stops, the leader unseparated.
    assert confirm.next_round(study, 1.0, log) is False
    state = study.user_attrs["confirmation"]
    assert (state["stopped"], state["rounds"], len(state["runs"]), state["leader"]) == ("runs", 2, 6, 5)
    assert "as many trials as the search (6)" in state["why"]
    assert confirm.next_round(study, 1.0, log) is False  # stopped stays stopped
    # b=4: 175, 170, 172 -> 172; b=1: 100, 120, 140, 130, 125 -> 125; b=2: 180, 120, 110 -> 120.
    # b=3 (90, one run) never competes again. No peaks recorded: the leader keeps the tie.
    assert [(f.item.number, f.median) for f in finalists(study)] == [(5, 172.0), (0, 125.0), (1, 120.0)]
    assert best_trial(study).number == 5


def _search(values: list[tuple[int, float]], peaks: dict[int, int] | None = None, predicted: dict[int, float] | None = None):
    """An in-memory study whose search ran `values` ((b, value) per trial) as the sweeper records them;
    `predicted`: b -> the throughput model's tokens/s, recorded as the pre-screen records it."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    space = {"b": optuna.distributions.CategoricalDistribution([1, 2, 3, 4])}
    for b, value in values:
        study.enqueue_trial({"b": b})
        trial = study.ask(space)
        trial.set_user_attr("overrides", [f"b={b}"])
        confirm.mark_repeat(study, trial, [f"b={b}"])
        _record(trial, b, peaks)
        if predicted:
            trial.set_user_attr("predicted_tokens_per_s", predicted[b])
        study.tell(trial, value)
    return study, space


def _record(trial, b: int, peaks: dict[int, int] | None) -> None:
    trial.set_user_attr("status", "ok")
    if peaks:
        trial.set_user_attr("peak_memory_bytes", peaks[b])
        trial.set_user_attr("budget_bytes", 1000)


def _round(study, space, values: dict[int, list[float]], log, *, budget=1.0, seconds=None, peaks=None) -> list[dict]:
    """One confirmation round: next_round decides and queues it, each queued run is answered from
    `values` (b -> its next runs' values, in order) as the loop would launch and tell it."""
    before = confirm.planned(study)
    kwargs = {"seconds_of": lambda t: seconds.get(t.number)} if seconds is not None else {}
    if not confirm.next_round(study, budget, log, **kwargs):
        return []
    queued = study.user_attrs["confirmation"]["runs"][before:]
    for run in queued:
        trial = study.ask(space)
        assert trial.user_attrs["confirms"] == run["confirms"] and trial.params == run["params"]
        b = trial.params["b"]
        _record(trial, b, peaks)
        study.tell(trial, values[b].pop(0))
        if seconds is not None:
            seconds[trial.number] = seconds[run["confirms"]]  # a run costs what its config's first did
    return queued


def test_confirmation_stops_inside_the_zone_when_runs_and_model_agree_and_the_safer_config_wins(tmp_path, capsys):
    """No config ran twice (no noise measured), but the finalists' runs (180 and 176) and the model's
    predictions (1000 and 990 tokens/s) agree they lie within 5 % of each other: confirmation stops
    (`indifferent`) without one run, and b=4, 40 % of its budget free against b=2's 10 %, wins; the
    summary says "within 5 % of each other: the safer one wins". Where the model disagrees (b=4
    predicted 20 % slower), the round runs both; with a zone of 1 % the runs disagree and it runs too."""
    import logging

    from hydra_plugins.grpo_optuna_sweeper.standings import best_trial
    from hydra_plugins.grpo_optuna_sweeper.summary import write_summary

    log = logging.getLogger("test")
    peaks = {1: 500, 2: 900, 3: 500, 4: 600}
    values = [(1, 100.0), (2, 180.0), (3, 90.0), (4, 176.0)]

    def confirmed(predicted: dict[int, float], zone: float = 0.05):
        study, _ = _search(values, peaks, predicted)
        called: list[tuple[int, bool]] = []
        confirm.phases(
            study,
            top=2,
            n_trials=8,
            searched=4,
            budget=1.0,
            run_to=lambda target, search: called.append((target, search)) or True,
            log=log,
            zone=zone,
            seconds_of=lambda t: 10.0,
        )
        return study, called

    agree = {1: 600.0, 2: 1000.0, 3: 500.0, 4: 990.0}
    study, called = confirmed(agree)
    state = study.user_attrs["confirmation"]
    assert called == [(4, False)] and (state["stopped"], state["runs"], state["agreed"]) == ("indifferent", [], [1, 3])
    assert best_trial(study).number == 3  # b=4: the median 176 against 180, but 40 % of its budget free
    write_summary(
        study, tmp_path, storage_url=f"journal:{tmp_path / 's.journal'}", objective="tokens_per_s", top_k=5, headroom=None
    )
    out = capsys.readouterr().out
    assert "within 5 % of each other: the safer one wins, trial 3" in out
    study, called = confirmed({**agree, 4: 800.0})  # the model sees b=4 20 % slower: it runs
    state = study.user_attrs["confirmation"]
    assert state.get("agreed") is None and [r["confirms"] for r in state["runs"][:2]] == [1, 3]
    study, called = confirmed(agree, zone=0.01)  # 176 is 2.2 % below 180: outside a 1 % zone
    state = study.user_attrs["confirmation"]
    assert state.get("agreed") is None and [r["confirms"] for r in state["runs"][:2]] == [1, 3]


def test_confirmation_stops_once_the_leader_is_separated():
    """No noise is known before confirmation: the first round runs every finalist once more. Their
    runs agree (the floor's 2 %), and the leader's interval clears the others': it stops after one
    round, 3 runs where topping up to 1 + 2 runs each would have run 6."""
    import logging

    from hydra_plugins.grpo_optuna_sweeper.standings import best_trial, verdict

    log = logging.getLogger("test")
    study, space = _search([(1, 100.0), (2, 180.0), (3, 90.0), (4, 170.0)])
    assert confirm.choose(study, 3, log) == [1, 3, 0]
    queued = _round(study, space, {2: [181.0], 4: [171.0], 1: [101.0]}, log)
    assert [r["confirms"] for r in queued] == [1, 3, 0]  # the leader first, then by median
    assert _round(study, space, {}, log) == []
    state = study.user_attrs["confirmation"]
    assert (state["stopped"], state["rounds"], len(state["runs"])) == ("separated", 1, 3)
    assert state["sigma"] == best_rule.NOISE_FLOOR and "clear of every other finalist" in state["why"]
    ruling = verdict(study)
    assert ruling.tie == [] and ruling.unseparated() == [] and best_trial(study).number == 1


def test_confirmation_stops_when_its_budget_is_spent():
    """confirm_budget=0.25 of the sweep's seconds: 4 search trials of 10 s each leave room for one
    10 s run (10 <= 0.25 x 50), not two; after it, the next would pass the share: stopped, spent
    and the reason recorded on the study. With a larger share the rounds run on past 1 +
    confirm_repeats runs while what is left of it could still settle the finalists, and stop when it
    could not (`undecidable`)."""
    import logging

    from hydra_plugins.grpo_optuna_sweeper.standings import verdict

    log = logging.getLogger("test")
    search = [(1, 100.0), (2, 180.0), (3, 90.0), (4, 176.0)]
    study, space = _search(search)
    seconds = {t.number: 10.0 for t in study.trials}
    confirm.choose(study, 3, log)
    queued = _round(study, space, {2: [180.0]}, log, budget=0.25, seconds=seconds)
    assert [r["confirms"] for r in queued] == [1]  # the leader only: a second run would pass 25 %
    assert _round(study, space, {}, log, budget=0.25, seconds=seconds) == []
    state = study.user_attrs["confirmation"]
    assert (state["stopped"], state["rounds"], state["spent_s"], state["sweep_s"]) == ("budget", 1, 10.0, 50.0)
    assert state["spent_s"] <= 0.25 * state["sweep_s"] and "confirm_budget=0.25" in state["why"]
    # A share of 0.5, and a search of 8 trials (b=3 run 5 times: the noise, 2 %, is known from the
    # start, and b=1 is separated at once). b=4 (170, then 175 a run) stays within b=2's noise and
    # its interval reaches more than 5 % below b=2's 180: the two run on, past 1 + confirm_repeats = 3
    # runs each, until b=4's interval (4 runs, 171.5-178.5) lies within 5 % of 180 (`indifferent`).
    study, space = _search(search[:3] + [(4, 170.0)] + [(3, 90.0)] * 4)
    seconds = {t.number: 10.0 for t in study.trials}
    confirm.choose(study, 3, log)
    for _ in range(3):
        queued = _round(study, space, {2: [180.0], 4: [175.0]}, log, budget=0.5, seconds=seconds)
        assert [r["confirms"] for r in queued] == [1, 3]
    assert _round(study, space, {}, log, budget=0.5, seconds=seconds) == []
    state = study.user_attrs["confirmation"]
    assert (state["stopped"], state["rounds"], state["spent_s"], state["sweep_s"]) == ("indifferent", 3, 60.0, 140.0)
    assert [len(f.runs) for f in verdict(study).by_median] == [4, 4, 1]
    # b=4 at 172, then 174 a run: after two rounds (3 runs each) it is still undecided, and the budget
    # left (0.5 x 120 - 40 s) buys about 1.9 more runs of each: at 4.9 runs neither separated nor
    # within 5 % (its interval would reach 5.1 % below 180). Confirmation stops with the share unspent.
    study, space = _search(search[:3] + [(4, 172.0)] + [(3, 90.0)] * 4)
    seconds = {t.number: 10.0 for t in study.trials}
    confirm.choose(study, 3, log)
    for _ in range(2):
        assert [r["confirms"] for r in _round(study, space, {2: [180.0], 4: [174.0]}, log, budget=0.5, seconds=seconds)] == [1, 3]
    assert _round(study, space, {}, log, budget=0.5, seconds=seconds) == []
    state = study.user_attrs["confirmation"]
    assert (state["stopped"], state["rounds"], state["spent_s"], state["sweep_s"]) == ("undecidable", 2, 40.0, 120.0)
    assert "room for about 1.9 more runs of each undecided finalist" in state["why"] and verdict(study).undecided()
    assert not confirm.given_back(study) and state["finalists"] == [1, 3, 0]  # runs were bought: the finalists stay
    assert best_rule.decidable(verdict(study).leader, verdict(study).undecided()[0], state["sigma"], 3.0)  # 6 runs would
    # The same study with the whole sweep to spend (budget 1) runs on: no limit to what it could buy.
    state.pop("stopped")
    study.set_user_attr("confirmation", state)
    assert [r["confirms"] for r in _round(study, space, {2: [180.0], 4: [174.0]}, log, budget=1.0, seconds=seconds)] == [1, 3]
    # The default clock: a finished trial's seconds from its start to its end; a queued one has none.
    finished = study.trials[0]
    assert confirm.trial_seconds(finished) == (finished.datetime_complete - finished.datetime_start).total_seconds() >= 0
    study.enqueue_trial({"b": 1})
    assert confirm.trial_seconds(study.trials[-1]) is None


def test_confirmation_undecidable_from_the_start_gives_its_runs_back_to_the_search():
    """At a noise no budget could settle (b=2 ran 180 and 120: 28 %), confirmation decides before its
    first round that it cannot tell the finalists apart: it runs nothing, gives its reserved runs back
    to the search and drops the finalists (the ones chosen kept as `chosen`), so every config competes
    by its median. A config the search runs afterwards can then win, which it could not against
    finalists chosen before it ran."""
    import logging

    from hydra_plugins.grpo_optuna_sweeper.standings import best_trial, verdict

    log = logging.getLogger("test")
    study, space = _search([(1, 100.0), (2, 180.0), (3, 90.0), (4, 170.0), (2, 120.0)])
    seconds = {t.number: 10.0 for t in study.trials}
    assert confirm.choose(study, 3, log) == [3, 1, 0]
    assert not confirm.given_back(study) and best_rule.competing(study.user_attrs) == [3, 1, 0]
    assert _round(study, space, {}, log, budget=0.25, seconds=seconds) == []
    state = study.user_attrs["confirmation"]
    assert (state["stopped"], state["rounds"], state["runs"], state["chosen"]) == ("undecidable", 0, [], [3, 1, 0])
    assert confirm.given_back(study) and state["finalists"] == [] and best_rule.competing(study.user_attrs) is None
    assert "reserved runs went back to the search" in state["why"]
    # The search runs on: b=3, out of the finalists on its one run of 90, now runs at 200 twice.
    for value in (200.0, 200.0):
        study.enqueue_trial({"b": 3})
        trial = study.ask(space)
        trial.set_user_attr("overrides", ["b=3"])
        assert confirm.mark_repeat(study, trial, ["b=3"]) == 2
        _record(trial, 3, None)
        study.tell(trial, value)
    assert best_trial(study).number == 2 and verdict(study).leader.median == 200.0
    # A resumed sweep finds the decision: no finalists to confirm, nothing queued.
    assert confirm.choose(study, 3, log) == [] and not confirm.next_round(study, 0.25, log)


def test_the_confirmation_phases_run_the_search_on_to_n_trials_when_confirmation_gives_its_runs_back():
    """confirm.phases (the sweep loop's confirmation): undecidable from the start, the search phase
    runs again, to n_trials, with its neighbour moves; decided or confirmed, it does not."""
    import logging

    def phases(search: list[tuple[int, float]]) -> list[tuple[int, bool]]:
        study, _ = _search(search)
        seconds = {t.number: 10.0 for t in study.trials}
        called: list[tuple[int, bool]] = []
        confirm.phases(
            study,
            top=3,
            n_trials=len(search) + 6,
            searched=len(search),
            budget=0.25,
            run_to=lambda target, search: called.append((target, search)) or True,
            log=logging.getLogger("test"),
            seconds_of=lambda t: seconds.get(t.number),  # the trials' seconds, as the replay gives them
        )
        return called

    assert phases([(1, 100.0), (2, 180.0), (3, 90.0), (4, 170.0), (2, 120.0)]) == [(5, False), (11, True)]
    # b=2 ran 180 and 181 (the floor's 2 %): b=1 and b=3 are separated from it at once, nothing given back.
    assert phases([(1, 100.0), (2, 180.0), (3, 90.0), (2, 181.0)]) == [(4, False)]


def test_confirmation_runs_only_the_undecided_and_stops_once_the_rest_are_within_5pct():
    """A finalist shown within 5 % of the leader (both intervals inside 5 % of its median) is not run:
    a run could not make the pick worse than that. The leader and the undecided ones run; once none
    is left undecided confirmation stops (`indifferent`), the budget unspent."""
    import logging

    from hydra_plugins.grpo_optuna_sweeper.standings import verdict

    log = logging.getLogger("test")
    # b=2 (180) and b=4 (179) ran 5 times each in the search: 2 % noise, within 5 % of each other.
    # b=1 ran once (172): its interval (165-179) reaches 8 % below the leader's.
    runs = [(2, 180.0), (4, 179.0), (1, 172.0), (2, 181.0), (4, 178.0), (2, 179.0), (4, 180.0), (2, 180.0)]
    study, space = _search(runs + [(4, 179.0), (2, 181.0), (4, 179.0)])
    assert confirm.choose(study, 3, log) == [0, 1, 2]
    ruling = verdict(study)
    assert [f.item.number for f in ruling.unseparated()] == [1, 2] and [f.item.number for f in ruling.undecided()] == [2]
    assert [r["confirms"] for r in _round(study, space, {2: [180.0], 1: [179.0]}, log)] == [0, 2]  # not b=4
    assert [r["confirms"] for r in _round(study, space, {2: [179.0], 1: [179.0]}, log)] == [0, 2]
    # b=1 at 179 (3 runs: 175-183) is now within 5 % too: nothing is left to decide.
    assert _round(study, space, {}, log) == []
    state = study.user_attrs["confirmation"]
    assert (state["stopped"], state["rounds"], len(state["runs"])) == ("indifferent", 2, 4)
    assert "within 5 % of it: any of them is as good a pick" in state["why"]
    ruling = verdict(study)
    assert [f.item.number for f in ruling.tie] == [0, 1, 2] == [f.item.number for f in ruling.close]


def test_a_tie_is_reported_and_the_safer_config_wins(tmp_path, capsys):
    """b=2 (180) and b=4 (178) stay within each other's noise, and one round shows b=4 within 5 % of
    b=2 (`indifferent`); b=4 peaks at 60 % of the budget, b=2 at 90 %: b=4 wins the tie. best.yaml's
    `tie:` lists both with their medians, the summary says so in one line, and report.html has the
    tie. A tie not shown within 5 % goes to the best median, and says so."""
    import logging

    import yaml

    from hydra_plugins.grpo_optuna_sweeper.standings import best_trial
    from hydra_plugins.grpo_optuna_sweeper.summary import write_summary

    log = logging.getLogger("test")
    peaks = {1: 500, 2: 900, 3: 500, 4: 600}
    # b=3 run 5 times: the noise (2 %) is known from the start, and b=1 (100) is separated at once.
    fillers = [(3, 90.0)] * 4
    study, space = _search([(1, 100.0), (2, 180.0), (3, 90.0), (4, 178.0)] + fillers, peaks)
    confirm.choose(study, 3, log)
    # One run each: b=4's interval (170.9-185.1) reaches past 5 % below 180: undecided, both run.
    assert [r["confirms"] for r in _round(study, space, {2: [180.0], 4: [178.0]}, log, peaks=peaks)] == [1, 3]
    assert _round(study, space, {}, log) == [] and study.user_attrs["confirmation"]["stopped"] == "indifferent"
    assert best_trial(study).number == 3  # b=4: median 178 against b=2's 180, but 40 % of the budget free
    summary = write_summary(
        study,
        tmp_path,
        storage_url=f"journal:{tmp_path / 'study.journal'}",
        objective="tokens_per_s",
        top_k=5,
        headroom=None,
    )
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["best_trial"] == summary["best_trial"] == 3 and best["best_value"] == 178.0
    assert [(t["trial"], t["median"], t["within_5pct"], t["winner"]) for t in best["tie"]] == [
        (1, 180.0, True, False),
        (3, 178.0, True, True),
    ]
    assert [t["headroom"] for t in best["tie"]] == [pytest.approx(0.1), pytest.approx(0.4)]
    assert best["top_two_within_noise"] is True and best["confirmation"]["stopped"] == "indifferent"
    assert best["confirmation"]["runs"] == 2 and best["noise"]["configs"] == 3
    out = capsys.readouterr().out
    tie_lines = [line for line in out.splitlines() if line.startswith("Tie:")]
    assert tie_lines == [best["tie_note"]] and (
        "within 5 % of each other: the safer one wins, trial 3, with the most memory headroom "
        "(40% headroom vs 10% headroom)" in tie_lines[0]
    )
    assert "stopped: every finalist within the leader's noise is, at that noise, within 5 % of it" in out
    report = (tmp_path / "report.html").read_text()
    assert "id=tie-note" in report and "trial 3 wins the tie with the most memory headroom" in report
    assert "<p id=confirmation-note>Confirmation: 2 runs in 1 rounds" in report and "stopped: every finalist" in report
    assert "<b>trial 3</b>" in report
    # b=4 at 174, one run (its interval reaches 7.2 % below 180): a tie not shown within 5 %: b=2,
    # the best median, wins whatever its memory, and the summary says why.
    study, space = _search([(1, 100.0), (2, 180.0), (3, 90.0), (4, 174.0)] + fillers, peaks)
    confirm.choose(study, 3, log)
    out_dir = tmp_path / "early"
    out_dir.mkdir()
    write_summary(
        study,
        out_dir,
        storage_url=f"journal:{out_dir / 'study.journal'}",
        objective="tokens_per_s",
        top_k=5,
        headroom=None,
    )
    best = yaml.safe_load((out_dir / "best.yaml").read_text())
    assert best["best_trial"] == 1 and [(t["trial"], t["within_5pct"], t["winner"]) for t in best["tie"]] == [
        (1, False, True),
        (3, False, False),
    ]
    assert "none is shown within 5 % of the leader, so trial 1 wins with the best median" in best["tie_note"]
    report = (out_dir / "report.html").read_text()
    assert "trial 1 wins the tie with the best median" in report


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
    overrides = ["trial.steps=5", *SMALL, "num_generations=2", *gpu, "trial.stop_below=1e9"]
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
    record = run_trial(compose(["trial.steps=3", *SMALL, "num_generations=2", "trial.stop_below=0.001"]), tmp_path)
    assert record["status"] == "ok" and record["steps"] == 3 and record["error"] is None


def test_stop_below_must_be_positive():
    from grpo_sweep.config.schema import ConfigError
    from grpo_sweep.config.validate import validate

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
    result = train_here(sweep_args(tmp_path, "hydra.sweeper.n_trials=1", *args, enqueue=True))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    result = train_here(sweep_args(tmp_path, "hydra.sweeper.n_trials=3", *args, "trial.debug_fault=slow", enqueue=True))
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
    """n_trials=6, top 2 x 1 repeat: 4 search trials, then the finalists run again while within each
    other's noise and not within 5 % (the whole budget allowed: at most the search's 4 runs), all in
    the study; the best median wins, or from a tie within 5 % the config with the most memory
    headroom. Over 20 s: a real sweep of up to eight trials."""
    result = train_here(
        sweep_args(
            tmp_path,
            "hydra.sweeper.n_trials=6",
            "hydra.sweeper.search_stop=false",  # the 4 search trials are the point here, not the model's stop
            "hydra.sweeper.confirm_top=2",
            "hydra.sweeper.confirm_repeats=1",
            "hydra.sweeper.confirm_budget=1",
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
    state = study.user_attrs["confirmation"]
    assert state["finalists"] == finalists and state["stopped"] in ("separated", "indifferent", "runs")
    # Only finalists run again, at most as many runs as the search's 4 trials (confirm_budget=1's bound).
    assert set(t.user_attrs["confirms"] for t in confirmations) <= set(finalists) and len(confirmations) <= 4
    assert len(counted(study)) == len(study.trials) == 4 + len(confirmations) == 4 + len(state["runs"])
    for t in confirmations:
        assert t.params == study.trials[t.user_attrs["confirms"]].params
        assert "stop_below" not in t.user_attrs  # a confirmation run always runs to its end
    medians, peaks = {}, {}
    for n in finalists:
        members = [t for t in study.trials if n in (t.number, t.user_attrs.get("repeats"), t.user_attrs.get("confirms"))]
        medians[n] = median([t.value for t in members if t.user_attrs["status"] == "ok"])
        peaks[n] = max(t.user_attrs["peak_memory_bytes"] for t in members if t.user_attrs["status"] == "ok")
    fastest = max(medians, key=medians.get)
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    report = (tmp_path / "report.html").read_text()
    if best.get("tie"):  # within noise: among those within 5 %, the config with the smaller peak (one budget) wins
        tied = [t["trial"] for t in best["tie"]]
        close = [t["trial"] for t in best["tie"] if t["within_5pct"]]
        assert fastest in tied and best["best_trial"] == (min(close, key=lambda n: (peaks[n], -medians[n])) if close else fastest)
        assert best["tie_note"] in result.stdout and "id=tie-note" in report
    else:
        assert best["best_trial"] == fastest and "id=noise-note" in report
    assert best["best_value"] == pytest.approx(medians[best["best_trial"]])
    # best.yaml lists the configs confirmation compared, as the report does, whether or not each ran again.
    assert [f["trial"] for f in best["finalists"]][:1] == [best["best_trial"]]
    assert {f["trial"] for f in best["finalists"]} == set(finalists)
    assert all((f["spread"] is not None) == (len(f["runs"]) >= 2) for f in best["finalists"])
    assert best["confirmation"]["stopped"] == state["stopped"] and "Confirmation:" in result.stdout
    assert "id=finalists" in report


def test_the_noise_is_measured_even_when_no_config_competes():
    """The noise comes from every config of the study; a verdict with no competing config (none
    confirmed yet) still carries it, for the report to show."""
    items = [("a", 90.0), ("a", 110.0), ("b", 50.0)]
    verdict = best_rule.decide(items, value=lambda x: x[1], group=lambda x: x[0], direction="maximize", compete=[])
    assert (verdict.by_median, verdict.tie, verdict.winner, verdict.ranked) == ([], [], None, [])
    assert (verdict.sigma, verdict.noise_configs) == (pytest.approx(0.02**0.5), 1)  # (90, 110) about 100: 0.1 each


def test_best_yaml_lists_every_finalist_confirmation_compared_even_one_run_once():
    """The leader can be separated before any confirmation run (the sampler's repeats measured the
    noise): best.yaml's `finalists` are still the configs confirmation compared, the winner first,
    as the report lists them; a config run once has no spread. Without a confirmation phase they
    are the configs the sampler happened to run more than once."""
    from types import SimpleNamespace

    from hydra_plugins.grpo_optuna_sweeper.summary import noise_summary

    runs = [("a", 100.0), ("a", 102.0), ("b", 50.0), ("c", 60.0)]
    items = [SimpleNamespace(number=n, config=c, value=v) for n, (c, v) in enumerate(runs)]
    ruling = best_rule.decide(items, value=lambda t: t.value, group=lambda t: t.config, direction="maximize", compete=["a", "b"])
    assert ruling.tie == [] and ruling.winner is ruling.ranked[0]  # 50 is far outside 100's noise: separated
    chosen = noise_summary(ruling, chosen=True)
    assert chosen["finalists_from"] == "confirmation"
    assert [(f["trial"], len(f["runs"]), f["spread"] is None) for f in chosen["finalists"]] == [(0, 2, False), (2, 1, True)]
    sampled = noise_summary(ruling, chosen=False)
    assert sampled["finalists_from"] == "repeated by the sampler" and [f["trial"] for f in sampled["finalists"]] == [0]


def test_a_lead_no_noise_can_judge_is_said_to_rest_on_one_run():
    """No config ran twice: best.yaml and the console say by how much the winner leads the runner-up
    and that one run each cannot tell that lead from a lucky run; once the noise is measured the
    finalists' verdict (`top_two_within_noise`) says it instead."""
    from types import SimpleNamespace

    from hydra_plugins.grpo_optuna_sweeper.summary import noise_summary

    def summary_of(runs):
        items = [SimpleNamespace(number=n, config=c, value=v) for n, (c, v) in enumerate(runs)]
        return noise_summary(
            best_rule.decide(items, value=lambda t: t.value, group=lambda t: t.config, direction="maximize"), False
        )

    once = summary_of([("a", 1051.0), ("b", 1152.0), ("c", 900.0)])
    assert "noise" not in once and "top_two_within_noise" not in once
    assert once["lead_note"].startswith("No config ran twice") and "trial 1's lead of 10% over trial 0" in once["lead_note"]
    twice = summary_of([("a", 1051.0), ("a", 1060.0), ("b", 1152.0)])
    assert "lead_note" not in twice and twice["top_two_within_noise"] in (True, False)


def test_a_confirm_budget_too_small_for_one_run_gives_its_runs_back(tmp_path, capsys):
    """confirm_budget=0.01 of 4 search trials' 40 s has no room for one 10 s run: confirmation stops
    (`budget`) before its first round and gives its reserved runs back to the search, as an
    undecidable one does, so the loop runs the search on to n_trials; the summary lists no
    "Confirmed finalists" (none was confirmed)."""
    import logging

    from hydra_plugins.grpo_optuna_sweeper.summary import write_summary

    log = logging.getLogger("test")
    study, space = _search([(1, 100.0), (2, 180.0), (3, 90.0), (4, 176.0)])
    seconds = {t.number: 10.0 for t in study.trials}
    called: list[tuple[int, bool]] = []
    confirm.phases(
        study,
        top=3,
        n_trials=10,
        searched=4,
        budget=0.01,
        run_to=lambda target, search: called.append((target, search)) or True,
        log=log,
        seconds_of=lambda t: seconds.get(t.number),  # the trials' seconds, as the replay gives them
    )
    state = study.user_attrs["confirmation"]
    assert (state["stopped"], state["runs"], state["finalists"], state["chosen"]) == ("budget", [], [], [1, 3, 0])
    assert confirm.given_back(study) and "reserved runs went back to the search" in state["why"]
    assert called == [(4, False), (10, True)]  # the search runs on to n_trials
    write_summary(
        study,
        tmp_path,
        storage_url=f"journal:{tmp_path / 's.journal'}",
        objective="tokens_per_s",
        top_k=5,
        headroom=None,
    )
    out = capsys.readouterr().out
    assert "Confirmed finalists" not in out and "stopped: the next run would take confirmation past confirm_budget=0.01" in out


def test_a_flagged_config_in_a_tie_never_wins_anywhere(tmp_path, capsys):
    """b=2 (trial 1: 180, 90 % of the budget) and b=4 (trial 3: 178, 60 %) tie within 5 % of each
    other, and b=4's runs changed the learning (their grad_norm departs from the other configs').
    study.best.decide settles the tie among the configs that did not, once: trial 1 wins in best.yaml,
    the printout and report.html, and no tie line names trial 3 as the winner."""
    import optuna
    import yaml

    from hydra_plugins.grpo_optuna_sweeper.standings import best_trial, learning_verdict
    from hydra_plugins.grpo_optuna_sweeper.summary import write_summary

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    space = {"b": optuna.distributions.CategoricalDistribution([1, 2, 3, 4])}
    peaks = {1: 500, 2: 900, 3: 500, 4: 600}
    for b, value in [(1, 100.0), (2, 180.0), (3, 90.0), (4, 178.0), *[(3, 90.0)] * 4, (2, 180.0), (4, 178.0)]:
        study.enqueue_trial({"b": b})
        trial = study.ask(space)
        trial.set_user_attr("overrides", [f"b={b}"])
        confirm.mark_repeat(study, trial, [f"b={b}"])
        _record(trial, b, peaks)
        trial.set_user_attr("metrics", {"history": [{"grad_norm": 0.75 if b == 4 else 0.7}]})
        study.tell(trial, value)
    ruling, flagged = learning_verdict(study, None)
    assert sorted(flagged) == [3, 9] and ruling.winner.item.number == best_trial(study).number == 1
    assert ruling.tie == [] and not ruling.winner_flagged and ruling.passed_over == []
    write_summary(
        study,
        tmp_path,
        storage_url=f"journal:{tmp_path / 's.journal'}",
        objective="tokens_per_s",
        top_k=5,
        headroom=None,
    )
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["best_trial"] == 1 and "tie_note" not in best and "tie" not in best
    assert best["changed_the_learning"]["passed_over"] == [] and not best["changed_the_learning"]["winner_flagged"]
    out = capsys.readouterr().out
    assert "\nBest: trial 1," in out and "trial 3 wins" not in out
    report = (tmp_path / "report.html").read_text()
    assert "Best feasible trial: <b>trial 1</b>" in report and "trial 3 wins" not in report

    # decide by hand: a flagged leader is passed over (named), a tie is settled among the others;
    # every config flagged: the best wins, flagged.
    runs = [("a", 200.0), ("b", 180.0), ("c", 100.0)]
    kwargs = {"value": lambda r: r[1], "group": lambda r: r[0], "direction": "maximize"}
    passed = best_rule.decide(runs, **kwargs, flagged=lambda r: r[0] == "a")
    assert (passed.winner.item, [f.item for f in passed.passed_over], passed.winner_flagged) == (
        ("b", 180.0),
        [("a", 200.0)],
        False,
    )
    assert [f.item[0] for f in passed.ranked] == ["b", "a", "c"]
    every = best_rule.decide(runs, **kwargs, flagged=lambda r: True)
    assert (every.winner.item, every.passed_over, every.winner_flagged) == (("a", 200.0), [], True)
    assert best_rule.decide(runs, **kwargs).winner.item == ("a", 200.0)


def test_agreement_counts_only_when_it_includes_the_leader_by_hand():
    """`agreed` makes configs close without a measured noise only when the leader is among them: with
    the runner-up within noise but not within the zone, and agreed naming it alone, the leader wins
    though the runner-up uses less memory; naming both, the safer runner-up wins."""
    runs = [("a", 100.0, 9.0), ("a", 90.0, 9.0), ("a", 110.0, 9.0), ("b", 95.0, 5.0), ("b", 85.0, 5.0), ("b", 105.0, 5.0)]

    def ruling(agreed):
        return best_rule.decide(
            runs,
            value=lambda r: r[1],
            group=lambda r: r[0],
            direction="maximize",
            peak_of=lambda r: r[2],
            budget_of=lambda r: 10.0,
            agreed=agreed,
        )

    alone = ruling({"b"})
    assert [f.item[0] for f in alone.tie] == ["a", "b"]  # within each other's noise
    assert alone.close == [] and alone.winner.item[0] == "a"  # not within 5 %, and the leader did not agree
    both = ruling({"a", "b"})
    assert [f.item[0] for f in both.close] == ["a", "b"] and both.winner.item[0] == "b"
