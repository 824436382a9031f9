"""Confirmation runs: the top feasible configs run again, only while the study cannot tell them apart.

A CPU (or shared GPU) measurement of one run moves by 10-30 %, so the best single run is often a
lucky one. Every run of a config counts: when the sampler asks for a point the study already ran,
the trial runs it again and joins that config (user attr `repeats` = the config's first trial;
mark_repeat). After the search phase the sweeper ranks the configs by the median of their runs and
takes the `confirm_top` best feasible ones as the finalists (choose). Then it runs rounds
(next_round): each round runs once more the leader (the best median) and every finalist still
undecided, as ordinary trials with the user attr `confirms` = the config's first trial, all of a
round launched before the next is decided (drift touches every finalist alike). At the noise the
study measured (runs of one config, pooled; grpo_sweep.study.best.relative_noise) a finalist is
separated from the leader when their intervals no longer overlap (a run cannot make it the winner),
and indifferent when its whole interval lies within best.INDIFFERENCE (5 %) of the leader's median
(picking it costs at most that: best.indifferent); the others are undecided. Neither kind is run, but every
finalist is judged again each round (the measured noise moves as runs come in). Before any config
ran twice no noise is known: every finalist is undecided, unless its runs and the model agree.

The zone is hydra.sweeper.indifference (best.INDIFFERENCE, 5 %, by default). When every undecided
finalist's runs and the throughput model's prediction agree with the leader's to within the zone
(the medians within it, the predictions within it, at a measured noise no larger than it: agreeing),
a run could only tell apart configs the user need not tell apart: confirmation stops (`indifferent`)
without more runs, records them (`agreed`), and the one with the most memory headroom wins
(standings.verdict; the summary: "within 5 % of each other: the safer one wins").

Confirmation stops when no finalist is undecided (`separated`: the leader is clear of every other;
`indifferent`: the ones still within its noise are within 5 % of it), when the next run would take
its seconds past `confirm_budget` of the sweep's seconds (`budget`: every finished trial's seconds,
confirmation's included; a run is priced at its config's longest run so far raised by the measured
noise, so a slow run stays within the share), when all the budget left, spread over this round's
configs, could not settle any undecided finalist at the medians and noise measured now
(`undecidable`: best.decidable; at 20 % noise a handful of runs cannot tell configs 5 % apart, and
spending them bought no better picks in bench/search_real_space.py), or, a bound for
confirm_budget=1, once it has run as many trials as the search.

Undecidable before its first round, or with a budget too small for one run (`budget` before any
run), confirmation gives its reserved runs back to the search (given_back): it runs nothing, the
search runs on to n_trials trials, and the finalists are dropped, so every config competes by the
median of its runs, as in a sweep without confirmation. Finalists chosen on one or two runs each at
a noise no budget could settle are a guess among a few configs, and often a guess without the best
one in it (a run slowed by the machine ranks a fast config out of them); the same runs spent on the
search find and repeat more configs, and cost no seconds beyond the n_trials the user asked for.
Once a round has run, the finalists stay (their runs were bought to tell them apart). The study
records what it spent and why it stopped (study user attr `confirmation`). A leader never separated
is a tie (grpo_sweep.study.best.decide: the configs within noise; among those shown within 5 % of
the leader the safer one wins, else the best median).

Budget: `confirm_repeats` runs per finalist are reserved in n_trials: the search phase gets
n_trials - top x repeats trials, and confirmation needs the search to keep at least two thirds of
them (top is lowered to fit, and below two finalists it is off: one config confirmed cannot change
the winner; repeats 0: off). Confirmation then runs as long as its budget allows, past the reserved
runs when the finalists stay undecided (the study then holds more than n_trials trials) or fewer
when they are decided early (fewer). The grid sampler runs every point once: no confirmation.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial, Trial

from grpo_sweep.study import best as best_rule
from grpo_sweep.study.attrs import ConfirmationState, Key, Status
from grpo_sweep.study.best import CONFIRMS_ATTR, REPEATS_ATTR

from .standings import is_ok, verdict

OVERRIDES_ATTR = Key.OVERRIDES  # trial user attr: the point as `python train.py` overrides (the sweeper's)


def effective_top(n_trials: int, top: int, repeats: int, sampler: str) -> int:
    """How many finalists this sweep confirms; see the module docstring.

    Args:
        n_trials: The sweep's trial count.
        top: confirm_top.
        repeats: confirm_repeats.
        sampler: The sweep's sampler.

    Returns:
        The finalists to confirm (0: off).
    """
    if top <= 0 or repeats <= 0 or sampler == "grid":
        return 0
    fitted = min(top, n_trials // (3 * repeats))
    return fitted if fitted >= 2 else 0


def off_reason(n_trials: int, top: int, repeats: int, sampler: str) -> str:
    """Why confirmation is off.

    Args:
        n_trials: The sweep's trial count.
        top: confirm_top.
        repeats: confirm_repeats.
        sampler: The sweep's sampler.

    Returns:
        The sentence the log shows.
    """
    if sampler == "grid":
        return "Confirmation off: the grid sampler runs every point once"
    return (
        f"Confirmation off: n_trials={n_trials} leaves no room for confirm_top={top} x confirm_repeats={repeats} "
        f"runs (needs n_trials >= {3 * 2 * repeats} for two finalists); the winner is the best single run"
    )


def search_trials(study: Study) -> list[FrozenTrial]:
    """The study's feasible ok trials that are not confirmation runs (the search's own results)."""

    return [t for t in study.get_trials(deepcopy=False) if is_ok(t) and t.user_attrs.get(CONFIRMS_ATTR) is None]


def repeat_of(study: Study, trial: Trial, point: list[str]) -> int | None:
    """The config an earlier trial of the same point (the same overrides) started: the trial's runs
    pool with that config's.

    Args:
        study: The sweep's study.
        trial: The trial to place.
        point: The trial's overrides.

    Returns:
        The first trial of that config; None: a new config.
    """
    for other in study.get_trials(deepcopy=False):
        if other.number >= trial.number:
            break
        if other.user_attrs.get(OVERRIDES_ATTR) == point and other.user_attrs.get(Key.STATUS) != Status.SURPLUS:
            return best_rule.config_group(other.user_attrs, other.number)
    return None


def mark_repeat(study: Study, trial: Trial, point: list[str]) -> int | None:
    """repeat_of, recorded on the trial (user attr `repeats`) when there is one.

    Args:
        study: The sweep's study.
        trial: The trial to place and mark.
        point: The trial's overrides.

    Returns:
        The first trial of the config it repeats; None: a new config.
    """
    first = repeat_of(study, trial, point)
    if first is not None:
        trial.set_user_attr(REPEATS_ATTR, first)
    return first


def trial_seconds(trial: Any) -> float | None:
    """A finished trial's seconds, from its start to its end as the study recorded them."""
    start, end = trial.datetime_start, trial.datetime_complete
    return (end - start).total_seconds() if start is not None and end is not None else None


def choose(study: Any, top: int, log: Any) -> list:
    """The finalists, chosen once per study (a resumed sweep finds them and reuses them), recorded in
    the study's `confirmation` attr.

    Args:
        study: The sweep's study.
        top: How many configs with the best median after the search to choose.
        log: The logger.

    Returns:
        The finalists' first trials.
    """
    existing = ConfirmationState.from_dict(study.user_attrs.get(Key.CONFIRMATION))
    if existing is not None:
        return existing.finalists
    top_configs = best_rule.finalists(
        search_trials(study),
        value=lambda t: t.value,
        group=lambda t: best_rule.config_group(t.user_attrs, t.number),
        direction=study.direction,
    )[:top]
    chosen = [best_rule.config_group(f.item.user_attrs, f.item.number) for f in top_configs] if len(top_configs) >= 2 else []
    state = ConfirmationState(finalists=chosen)
    if not chosen:
        state.stopped, state.why = "one config", "fewer than two feasible configs to compare"
        log.info("Confirmation skipped: fewer than two feasible configs to compare")
    else:
        log.info(
            "Confirmation: finalists %s (runs so far: %s), run again while within each other's noise",
            ", ".join(str(first) for first in chosen),
            ", ".join(str(len(f.members)) for f in top_configs),
        )
    study.set_user_attr(Key.CONFIRMATION, state.to_dict())
    return chosen


def given_back(study: Any) -> bool:
    """Whether confirmation, undecidable before its first round, gave its reserved runs back to the
    search (the search then runs on to n_trials; see the module docstring)."""
    return best_rule.gave_back(study.user_attrs.get(Key.CONFIRMATION))


def planned(study: Any) -> int:
    """The confirmation runs queued so far (the loop's target is the search's trials plus these)."""
    state = ConfirmationState.from_dict(study.user_attrs.get(Key.CONFIRMATION))
    return len(state.runs) if state else 0


def seconds_so_far(study: Any, seconds_of: Callable[[Any], float | None] = trial_seconds) -> tuple[float, float]:
    """(the sweep's seconds: every finished trial's, the confirmation runs' seconds among them)."""
    sweep = spent = 0.0
    for t in study.get_trials(deepcopy=False):
        if t.state.name in ("WAITING", "RUNNING") or t.user_attrs.get(Key.STATUS) == Status.SURPLUS:
            continue
        seconds = seconds_of(t) or 0.0
        sweep += seconds
        if t.user_attrs.get(CONFIRMS_ATTR) is not None:
            spent += seconds
    return sweep, spent


def predicted_of(trial: Any) -> float | None:
    """The throughput model's tokens/s for a trial's config, as the pre-screen recorded it."""
    value = trial.user_attrs.get(Key.PREDICTED_TOKENS_PER_S)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def agreeing(ruling: Any, zone: float, predicted: Callable[[Any], float | None] = predicted_of) -> list:
    """The unseparated finalists whose runs and forecast both put them within the zone of the leader:
    the median of their runs within it of the leader's median (at a measured noise no larger than the
    zone: runs noisier than it cannot show it), and the model's prediction within it of the leader's.

    Args:
        ruling: The finalists' standing: the leader, the noise, the unseparated finalists.
        zone: The indifference zone, a fraction of the leader's value.
        predicted: A finalist's predicted value (None: no prediction).

    Returns:
        The agreeing finalists; empty when the leader has no prediction or the noise is too large.
    """
    leader = ruling.leader
    if leader is None or (ruling.sigma is not None and ruling.sigma > zone):
        return []
    lead_p = predicted(leader.item)
    if lead_p is None:
        return []
    out = []
    for f in ruling.unseparated():
        p = predicted(f.item)
        runs_agree = abs(f.median - leader.median) <= zone * abs(leader.median)
        if p is not None and runs_agree and abs(p - lead_p) <= zone * lead_p:
            out.append(f)
    return out


def next_round(
    study: Any,
    budget: float,
    log: Any,
    seconds_of: Callable[[Any], float | None] = trial_seconds,
    zone: float = best_rule.INDIFFERENCE,
) -> bool:
    """Decide and queue the next round; see the module docstring.

    Args:
        study: The sweep's study.
        budget: confirm_budget.
        log: The logger.
        seconds_of: A trial's seconds.
        zone: The indifference zone (hydra.sweeper.indifference).

    Returns:
        True when there are runs to run; False once confirmation has stopped (the reason recorded in
        the study's `confirmation` attr).
    """

    state = ConfirmationState.from_dict(study.user_attrs.get(Key.CONFIRMATION))
    if state is None or state.stopped:
        return False
    state.zone = zone
    study.set_user_attr(Key.CONFIRMATION, {**study.user_attrs.get(Key.CONFIRMATION), "zone": zone})
    ruling = verdict(study)
    sweep_s, spent_s = seconds_so_far(study, seconds_of)
    state.spent_s, state.sweep_s, state.budget, state.sigma = spent_s, sweep_s, budget, ruling.sigma
    state.leader = best_rule.config_group(ruling.leader.item.user_attrs, ruling.leader.item.number) if ruling.leader else None
    undecided = ruling.undecided()
    agreed = agreeing(ruling, zone)
    if undecided and all(any(f is a for a in agreed) for f in undecided):
        state.agreed = [best_rule.config_group(f.item.user_attrs, f.item.number) for f in (ruling.leader, *agreed)]
        undecided = []
    wanted = [ruling.leader, *undecided] if ruling.leader is not None and undecided else []
    trials = study.get_trials(deepcopy=False)
    searched = sum(1 for t in trials if t.user_attrs.get(CONFIRMS_ATTR) is None and t.state.name != "WAITING")
    runs, more = _priced_runs(trials, wanted, ruling.sigma, budget, (sweep_s, spent_s), seconds_of)
    stop, why = _stop_reason(
        ruling,
        undecided,
        zone,
        agreed=bool(state.agreed),
        over_runs=planned(study) + len(runs) > searched,
        runs=runs,
        more=more,
        words={"budget": budget, "spent_s": spent_s, "sweep_s": sweep_s, "searched": searched},
    )
    current = ConfirmationState.from_dict(study.user_attrs.get(Key.CONFIRMATION)) or ConfirmationState()
    if current.rounds != state.rounds or current.stopped:
        return not current.stopped  # another worker decided this round first: its runs are the ones
    if stop in ("undecidable", "budget") and not state.runs:  # nothing bought: the search gets the runs
        state.chosen, state.finalists, state.given_back = state.finalists, [], True
        why = f"{why}; its reserved runs went back to the search, and every config competes by its median"
    if stop is not None:
        state.stopped, state.why = stop, why
        study.set_user_attr(Key.CONFIRMATION, state.to_dict())
        log.info("Confirmation stopped after %d rounds (%.0f of %.0f s): %s", state.rounds, spent_s, sweep_s, why)
        return False
    state.runs = state.runs + runs
    state.rounds += 1
    study.set_user_attr(Key.CONFIRMATION, state.to_dict())
    for run in runs:
        attrs = {CONFIRMS_ATTR: run[Key.CONFIRMS], **({Key.PRESET: run[Key.PRESET]} if run[Key.PRESET] else {})}
        study.enqueue_trial(run["params"], user_attrs=attrs)
    log.info(
        "Confirmation round %d: %s (noise %s); runs of trials %s queued (%.0f of %.0f s spent so far)",
        state.rounds,
        f"trials {', '.join(str(best_rule.config_group(f.item.user_attrs, f.item.number)) for f in undecided)} neither "
        f"separated from the leader, trial {state.leader}, nor within {zone:.0%} of it",
        f"{ruling.sigma:.1%}" if ruling.sigma is not None else "not measured yet",
        ", ".join(str(r[Key.CONFIRMS]) for r in runs),
        spent_s,
        sweep_s,
    )
    return True


def _priced_runs(
    trials: list,
    wanted: list,
    sigma: float | None,
    budget: float,
    seconds: tuple[float, float],
    seconds_of: Callable[[Any], float | None],
) -> tuple[list[dict], float | None]:
    """The runs the budget affords this round.

    Args:
        trials: the study's trials.
        wanted: the leader, then its undecided contenders.
        sigma: the measured run noise (None: not yet).
        budget: confirm_budget.
        seconds: (the sweep's seconds, confirmation's seconds so far).
        seconds_of: a trial's seconds.

    Returns:
        (the runs of `wanted` the budget affords this round, how many more runs of each the budget
        left could buy: None, no limit).
    """
    sweep_s, spent_s = seconds
    known = [s for t in trials if t.user_attrs.get(Key.STATUS) != Status.SURPLUS and (s := seconds_of(t))]
    # A run is priced at its config's longest run so far (none yet: the sweep's median trial), raised by
    # the measured noise (a run's seconds vary as its throughput does), so a slow run stays within budget.
    slack = 1.0 + best_rule.INTERVAL_Z * (sigma or 0.0)
    priced = []
    for f in wanted:  # the leader first, then its closest contenders
        costs = [s for m in f.members if (s := seconds_of(m)) is not None]
        priced.append((f, (max(costs) if costs else statistics.median(known or [0.0])) * slack))
    # The seconds confirmation may still spend: x more keep spent + x <= budget x (sweep + x), so
    # x <= (budget x sweep - spent) / (1 - budget); no limit at budget 1.
    room_s = (budget * sweep_s - spent_s) / (1.0 - budget) if budget < 1 else math.inf
    # What that could buy, spread over the configs this round runs: `more` runs each (None: no limit).
    price = statistics.fmean(cost for _, cost in priced) if priced else 0.0
    more = room_s / price / len(priced) if priced and price and math.isfinite(room_s) else None
    runs: list[dict] = []
    queued_s = 0.0
    for f, cost in priced:
        if queued_s + cost > room_s:
            continue
        queued_s += cost
        first = best_rule.config_group(f.item.user_attrs, f.item.number)
        runs.append({Key.CONFIRMS: first, "params": dict(f.item.params), Key.PRESET: f.item.user_attrs.get(Key.PRESET)})
    return runs, more


def _stop_reason(
    ruling: Any, undecided: list, zone: float, *, agreed: bool, over_runs: bool, runs: list, more: float | None, words: dict
) -> tuple[str | None, str | None]:
    """Why confirmation stops now; see the module docstring.

    Args:
        ruling: The finalists' standing: the leader, the noise, the unseparated finalists.
        undecided: The finalists neither separated from the leader nor within the zone of it.
        zone: The indifference zone.
        agreed: Whether the runs and the model agree the finalists lie within the zone.
        over_runs: Whether confirmation has run as many trials as the search.
        runs: The runs the budget affords this round.
        more: How many more runs of each the budget left could buy (None: no limit).
        words: budget, spent_s, sweep_s, searched (for the sentence).

    Returns:
        (a word, a sentence); (None, None): it runs `runs`.
    """
    budget = words["budget"]
    if ruling.leader is None:
        return "no value", "no finalist has a run that finished within memory"
    if not ruling.unseparated():
        return "separated", "the leader's interval is clear of every other finalist's at the measured noise"
    if not undecided:
        zone_words = f"{zone:.0%}".replace("%", " %")
        if agreed:
            return (
                "indifferent",
                f"the finalists' runs and the model agree they lie within {zone_words} of each other: the safer one wins",
            )
        return (
            "indifferent",
            f"every finalist within the leader's noise is, at that noise, within {zone_words} of it: "
            "any of them is as good a pick",
        )
    if over_runs:
        return "runs", f"confirmation has run as many trials as the search ({words['searched']})"
    if not runs:
        return "budget", (
            f"the next run would take confirmation past confirm_budget={budget:g} of the sweep's seconds "
            f"({words['spent_s']:.0f} of {words['sweep_s']:.0f} s spent)"
        )
    sigma = ruling.sigma
    if (
        more is not None
        and sigma is not None
        and not any(best_rule.decidable(ruling.leader, f, sigma, more, zone) for f in undecided)
    ):
        return "undecidable", (
            f"confirm_budget={budget:g} has room for about {more:.1f} more runs of each undecided finalist, too few to "
            f"separate any from the leader or show it within {zone:.0%} of it at the measured noise ({sigma:.1%})"
        )
    return None, None


def phases(
    study: Any,
    *,
    top: int,
    n_trials: int,
    searched: int,
    budget: float,
    run_to: Callable[[int, bool], bool],
    log: Any,
    zone: float = best_rule.INDIFFERENCE,
    search_done: bool = False,
    seconds_of: Callable[[Any], float | None] = trial_seconds,
) -> None:
    """The confirmation phases, as the sweep loop and the search replay run them: choose the
    finalists, run the queued runs (a resumed sweep's, another worker's), then round after round
    until confirmation stops; given back, the search runs on to n_trials unless it stopped itself.

    Args:
        study: The sweep's study.
        top: confirm_top.
        n_trials: The sweep's trial count.
        searched: The search phase's trials.
        budget: confirm_budget.
        run_to: run_to(target, search) runs trials until the study counts `target` (search: the
            sampler's); False when the sweep must stop (a systematic failure).
        log: The logger.
        zone: The indifference zone.
        search_done: Whether the search stopped itself (the model predicted nothing better).
        seconds_of: A trial's seconds.
    """
    choose(study, top, log)
    while True:
        if not run_to(searched + planned(study), False):
            return
        if not next_round(study, budget, log, seconds_of, zone):
            break
    if given_back(study) and not search_done:  # undecidable or unaffordable from the start: its runs search instead
        run_to(n_trials, True)
