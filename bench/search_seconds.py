"""Search cost in machine seconds, and how often the final pick is truly within 5 % of the optimum.

Replays the sweep on a landscape (bench/landscapes.py: the tiny CPU grid measured for real, and a
model of the seed's Gemma 3 1B / L4 space) with the sweeper's own pieces: build_sampler, judge,
for_sampler, the pre-screen, stop_threshold/timed_steps (early stop: PRUNED with the per-step
throughputs as intermediate values), confirm.choose / next_round (the confirmation rounds, enqueued in the study while the finalists
are within noise and confirm_budget of the replay's seconds is left) and standings.verdict (the
median-of-runs winner, a tie to the safer config, grpo_sweep.study.best). Each run of a point
shows one noisy throughput (one of its measured runs, or true x exp(N(0, sigma)) on a model) and costs
its seconds: start + every step it ran (an early-stopped trial: up to its first timed step), an OOM its time until it failed.

Per seed:
- seconds to a point within 5 %: the sweep keeps searching until it has run a truly-good point to
  its end (an early-stopped good point does not count), plus, for ours, the confirmation runs its
  sweep spends at the end (charged in full);
- the pick: a sweep of N_TRIALS trials (counted as the sweeper counts: pruned and invalid too),
  with confirmation (search N_TRIALS - 3 x 2, then rounds of the finalists while undecided, within confirm_budget; best median
  wins; undecidable before its first round, the reserved runs search instead and every config competes) and
  without (N_TRIALS search trials; best single run wins); judged by the picked point's true value.
Strategies: ours (pre-screen + early stop + confirmation), tpe_unconstrained (hydra-optuna-sweeper:
OOM = failed trial, every trial to its end), random (uniform without replacement, every trial to
its end), grid (every point: a grid knows its best only after the last).
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median
from landscapes import key

WITHIN = 0.05
N_TRIALS = 40  # the sweep budget for the final pick (hydra.sweeper.n_trials of the seed's sweeps)
CAP = 600  # a sweep that has not found a good point after this many trials is charged what it ran
OBJECTIVE = "tokens_per_s"


def good(point: dict, land: dict) -> bool:
    return point["status"] == "ok" and point["tokens_per_s"] >= (1 - WITHIN) * land["optimum"]


def full_seconds(point: dict) -> float:
    return point["oom_s"] if point["status"] == "oom" else point["start_s"] + sum(point["step_s"])


def run_point(land: dict, point: dict, rng: random.Random, threshold: float | None) -> tuple[dict, float]:
    """One trial of `point` as metrics.json would record it, and its seconds: one of the point's
    measured runs drawn at random (tiny_cpu), or its true value x exp(N(0, sigma)) at its costs."""
    base = {"peak_memory_bytes": point.get("peak_memory_bytes"), "memory_source": point.get("memory_source")}
    if point["status"] == "oom":
        return {**base, "status": "oom", "deficit_bytes": point.get("deficit_bytes")}, point["oom_s"]
    drawn = draw_run(land, point, rng)
    value, start, step_s = drawn["tokens_per_s"], drawn["start_s"], drawn["step_s"]
    steps, first = land["steps"], land["first_timed_step"]
    history = [{"step": i + 1, OBJECTIVE: value} for i in range(steps)]
    if threshold is not None and first < steps and value < threshold:  # the speed meter stops it
        return {**base, "status": "slow", OBJECTIVE: value, "history": history[:first]}, start + sum(step_s[:first])
    return {**base, "status": "ok", OBJECTIVE: value, "history": history}, start + sum(step_s)


def draw_run(land: dict, point: dict, rng: random.Random) -> dict:
    """One run of a point that fits: one of its measured runs drawn at random (tiny_cpu's noise), or
    its true value x exp(N(0, sigma)) at its costs (a model): tokens_per_s, start_s, step_s."""
    measured = point.get("measured_runs") if land.get("noise") == "measured runs" else None
    if measured:
        return rng.choice(measured)
    value = point["tokens_per_s"] * math.exp(rng.gauss(0.0, land["sigma"]))
    return {"tokens_per_s": value, "start_s": point["start_s"], "step_s": point["step_s"]}


def sweep(
    land: dict,
    seed: int,
    *,
    n_trials: int,
    stop_below: float | None,
    confirm_top: int,
    confirm_repeats: int = 2,
    confirm_budget: float = 0.25,
    prescreen: bool = True,
    constrained: bool = True,
    until_found: bool = False,
    sampler: str = "tpe",
    frontier: int | None = None,
    n_startup_trials: int | None = None,
    neighbour_every: int | None = None,
    calibrate: bool = False,
    start: str | None = None,
    lead: bool = False,
    model_error: float = 0.0,
    zone: float | None = None,
    withdraw: bool = False,
) -> dict:
    """The sweeper's loop on `land`: returns seconds to the first good point run to its end (None if
    not found), the search and confirmation seconds, the pick and the counted trials.
    frontier / n_startup_trials / neighbour_every / start: None, the plugin's defaults (hydra.sweeper.start_points,
    n_startup_trials, neighbour_every, start). A landscape whose points carry the sweeper's forecast
    (landscapes.forecasts) starts as the sweeper's start.choose does (model: the predicted fastest fits;
    memory: the fullest); one without (the old landscapes) starts from memory, by its predicted peaks.
    lead: the model-led search (lead.py: the calibrated model's next point on the model's turns, the
    stop rule, the flat space; confirmation judged with the trials' predictions), its own seconds
    charged as measured here; model_error: each point's forecast tokens/s disturbed by
    exp(N(0, model_error)), drawn once per seed (a wrong model); zone: hydra.sweeper.indifference.
    withdraw: a counterfactual, not the sweeper: the stop rule is read after every trial, the start
    points still waiting counted as untried, and when it fires they are withdrawn unrun (the earliest
    a model-led search can stop: two measured configs, the fewest that price the model's error)."""
    import logging

    import optuna

    from grpo_sweep.study.attrs import ConfirmationState, Key
    from hydra_plugins.grpo_optuna_sweeper import confirm, neighbours
    from hydra_plugins.grpo_optuna_sweeper.config import GrpoOptunaSweeperConf
    from hydra_plugins.grpo_optuna_sweeper.opening import build_sampler
    from hydra_plugins.grpo_optuna_sweeper.outcome import (
        CONSTRAINT,
        for_sampler,
        judge,
        prescreen_verdict,
        stop_threshold,
        timed_steps,
    )
    from hydra_plugins.grpo_optuna_sweeper.standings import best_finalist, best_trial, verdict

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    conf = GrpoOptunaSweeperConf()
    frontier = conf.start_points if frontier is None else frontier
    n_startup_trials = conf.n_startup_trials if n_startup_trials is None else n_startup_trials
    neighbour_every = conf.neighbour_every if neighbour_every is None else neighbour_every
    space = {name: optuna.distributions.CategoricalDistribution(values) for name, values in land["grid"].items()}
    study = optuna.create_study(direction="maximize", sampler=build_sampler(sampler, seed, space, n_startup_trials))
    start = conf.start if start is None else start
    zone = conf.indifference if zone is None else zone
    forecast_of = disturbed(land, seed, model_error) if lead else {}
    candidates = list(forecast_of.values())
    composed: list = []
    if frontier and start != "none":  # hydra.sweeper.start_points points, as hydra.sweeper.start says
        from hydra_plugins.grpo_optuna_sweeper import space as space_rules
        from hydra_plugins.grpo_optuna_sweeper import start as start_points
        from hydra_plugins.grpo_optuna_sweeper.forecast import Forecast

        if "forecast" in land["points"][0]:
            composed = [forecast_of.get(key(p["levers"]), p["forecast"]) for p in land["points"]]
            estimated = [f for f in composed if f.error is None]
        else:
            # the old landscapes forecast the peak alone: start=model falls back to memory in start.choose
            composed = list(space_rules.candidates(land["grid"], seed))
            estimated = [
                Forecast(
                    params, predicted_bytes=land["by_key"][key(params)]["predicted_peak_bytes"], limit_bytes=land["budget_bytes"]
                )
                for params in composed
                if key(params) in land["by_key"]
            ]
        mode, picks, _ = start_points.choose(start, estimated, frontier, seed, zone if lead else None)
        for params in picks:
            study.enqueue_trial(params, user_attrs={"start": mode})
    rng = random.Random(1_000_003 * seed + 17)
    compose_s = land.get("compose_s", 0.0)  # the sweeper composes and estimates a config: measured per landscape
    # A neighbour move's candidate is composed from the sweeper's ComposeCache (a copy of a composition per
    # group choice): move_check_s, measured with the frontier start's; else a full composition each.
    top = confirm.effective_top(n_trials, confirm_top, confirm_repeats, sampler)
    n_search = n_trials - top * confirm_repeats
    budget = land["budget_bytes"]
    # The frontier start composes and estimates every candidate before the first trial (charged here:
    # its measured seconds, measure_frontier_s, else one compose per candidate).
    clock = land.get("frontier_s", compose_s * len(composed)) if composed else 0.0
    found_s, counted, pick_no_confirm = None, 0, None
    verdicts: dict = {}  # the sweeper's Prescreen.move_verdicts: a neighbour move's candidate -> may it run
    stopped_good: list[int] = []  # trials of a point within 5 % that early stop cut short (noise)

    from hydra_plugins.grpo_optuna_sweeper import calibration

    oom_trials, false_prunes, observed = [0], [0], [0]
    trial_s: dict[int, float] = {}  # each trial's seconds on the landscape: what confirmation's budget counts

    def prescreen_of(point: dict):
        """The sweeper's Prescreen.verdict on the landscape: the raw prediction and the fixed margin, or
        (calibrate) the correction the study's measured trials give (calibration.py)."""
        phases = {"training": point["predicted_peak_bytes"]}
        if not calibrate:
            return prescreen_verdict(point["predicted_peak_bytes"], point.get("limit_bytes", budget), conf.prescreen_margin)
        finished = [t.user_attrs for t in study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED")]
        c = calibration.calibrate(
            phases, "trl", calibration.observations(finished), conf.prescreen_margin, conf.prescreen_calibrate
        )
        return prescreen_verdict(c.calibrated_bytes, budget, c.allowance, raw_bytes=c.raw_bytes, trials=c.trials)

    def run(trial, point, threshold):
        nonlocal clock, found_s
        record, seconds = run_point(land, point, rng, threshold)
        clock += seconds
        trial_s[trial.number] = seconds
        if lead and key(point["levers"]) in forecast_of:  # what the pre-screen records: the model's tokens/s
            trial.set_user_attr("predicted_tokens_per_s", forecast_of[key(point["levers"])].tokens_per_s)
        oom_trials[0] += record["status"] == "oom"
        if calibrate:  # what the sweeper's trial attrs hold for calibration.observation
            trial.set_user_attr("predicted_phases", {"training": point["predicted_peak_bytes"]})
            trial.set_user_attr("backend", "trl")
            trial.set_user_attr("peak_phase", "backward")
            trial.set_user_attr("budget_bytes", budget)
            for name in ("peak_memory_bytes", "memory_source", "deficit_bytes"):
                if record.get(name) is not None:
                    trial.set_user_attr(name, record[name])
        if not constrained:  # hydra-optuna-sweeper: an OOM is a failed trial, nothing else is known
            if record["status"] == "oom":
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                trial.set_user_attr("status", "ok")
                study.tell(trial, record[OBJECTIVE])
        else:
            outcome = for_sampler(
                judge(record, objective=OBJECTIVE, direction="maximize", budget_bytes=budget, headroom=None), sampler, "maximize"
            )
            for step, value in timed_steps(record, OBJECTIVE):
                trial.report(value, step)
            # What the sweeper's tell records: the outcome's attrs (status, the peak) and the trial's budget,
            # which the tie rule (standings.verdict: the most memory headroom) reads.
            trial.set_user_attr("budget_bytes", budget)
            for name, attr in outcome.attrs.items():
                trial.set_user_attr(name, attr)
            if outcome.constraint is not None:
                trial.set_constraint(CONSTRAINT, outcome.constraint)
            study.tell(
                trial, outcome.value if outcome.state == "COMPLETE" else None, state=optuna.trial.TrialState[outcome.state]
            )
        if found_s is None and record["status"] == "ok" and good(point, land):
            found_s = clock
        if record["status"] == "slow" and good(point, land):
            stopped_good.append(trial.number)

    def search_to(target: int) -> None:
        """The sweeper's search phase: sampler trials (neighbour moves on their turns) until `target` count."""
        while counted < target or (until_found and found_s is None and counted < CAP):
            if lead and lead_stopped():
                return
            search_trial()

    def timed(call, *args):
        """A call of the sweeper's own model, its seconds on this machine charged to the replay's clock."""
        nonlocal clock
        started = time.perf_counter()
        out = call(*args)
        clock += time.perf_counter() - started
        return out

    def lead_stopped() -> bool:
        """The sweeper's Loop._search_over: never while a start point waits (withdraw: after every
        trial); the stop line once."""
        if ended:
            return True
        waiting = [t for t in study.get_trials(deepcopy=False) if t.state.name == "WAITING"]
        if waiting and not withdraw:
            return False
        line = timed(lead_rules.study_stop_line, study, candidates, zone, not withdraw)
        if line is not None:
            ended.append((line, counted))
            for _ in waiting:  # withdraw: each waiting start point leaves the queue unrun
                withdrawn = study.ask(space)
                withdrawn.set_user_attr("withdrawn", True)
                study.tell(withdrawn, state=optuna.trial.TrialState.FAIL)
        return bool(ended)

    def search_trial() -> None:
        nonlocal clock, counted, pick_no_confirm
        if counted == n_search and pick_no_confirm is None:
            pick_no_confirm = _picked(best_trial(study), land)
        model_turn = constrained and neighbours.due(counted, n_startup_trials, neighbour_every)
        params = timed(lead_rules.study_next_point, study, candidates) if lead and model_turn else None
        if params is not None:  # the sweeper's Loop._model_turn: the calibrated model's fastest untried point
            study.enqueue_trial(params, user_attrs={"model_led": True})
        elif model_turn:
            allowed = (lambda params: _move_runs(land, params, prescreen_of)) if (calibrate and prescreen) else None
            if allowed is not None:  # the sweeper's Prescreen.learn: a new calibration re-judges the moves
                learned = len(calibration.observations(t.user_attrs for t in study.get_trials(deepcopy=False)))
                if learned != observed[0]:
                    verdicts.clear()
                    observed[0] = learned
            checked = enqueue_neighbour(study, land, seed, prescreen, conf.prescreen_margin, verdicts, allowed)
            clock += checked * land.get("move_check_s", compose_s)  # each candidate composed and estimated once
        trial = study.ask(space)
        counted += 1  # every told trial counts toward n_trials, as the sweeper's _progress counts them
        overrides = [f"{k}={v}" for k, v in sorted(trial.params.items())]  # the sweeper's `overrides` attr
        trial.set_user_attr(confirm.OVERRIDES_ATTR, overrides)
        confirm.mark_repeat(study, trial, overrides)  # the same point again: its runs pool with the first's
        point = land["by_key"].get(key(trial.params))
        if point is None:  # TRL rejects it before any model loads: FAIL, unrun
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return
        if prescreen:  # the sweeper composes and estimates the point before it launches (or prunes) it
            clock += compose_s
            pruned = for_sampler(prescreen_of(point), sampler, "maximize")
            if pruned is not None:
                false_prunes[0] += point["status"] == "ok"  # it would have fit: pruned wrongly
                trial.set_constraint(CONSTRAINT, pruned.constraint)
                study.tell(trial, pruned.value, state=optuna.trial.TrialState[pruned.state])
                return
        best = best_finalist(study) if constrained and stop_below else None
        run(trial, point, stop_threshold(best.median if best else None, stop_below, OBJECTIVE, "maximize"))

    ended: list = []  # (the line, the trials counted) once the model-led search stopped
    from hydra_plugins.grpo_optuna_sweeper import lead as lead_rules

    search_to(n_search)
    if pick_no_confirm is None:
        pick_no_confirm = _picked(best_trial(study), land)
    if top and not until_found:
        seconds_of = lambda t: trial_s.get(t.number)  # noqa: E731 - the landscape's seconds, not the replay's clock

        def run_to(target: int, search: bool) -> bool:
            """The sweeper's Loop._run_to: search trials to `target`, or the queued confirmation runs."""
            if search:
                search_to(target)
                return True
            ran = sum(t.user_attrs.get(confirm.CONFIRMS_ATTR) is not None and t.state.name != "WAITING" for t in study.trials)
            for _ in range(confirm.planned(study) - ran):
                trial = study.ask(space)
                run(trial, land["by_key"][key(trial.params)], None)  # a confirmation run never stops early
            return True

        confirm.phases(
            study,
            top=top,
            n_trials=n_trials,
            searched=ended[0][1] if ended else n_search,
            budget=confirm_budget,
            run_to=run_to,
            log=logging.getLogger("replay"),
            zone=zone,
            search_done=bool(ended),
            seconds_of=seconds_of,
        )
    confirm_s = sum(trial_s.get(t.number, 0.0) for t in study.trials if t.user_attrs.get(confirm.CONFIRMS_ATTR) is not None)
    # best.yaml's winner: the best median, a tie to the safer; a sweep that confirms is judged by it
    # whether or not its search told OOMs as constraints (random / TPE under the same confirmation)
    ruling = verdict(study) if constrained or top else None
    pick = _picked(ruling.ranked[0].item, land) if ruling and ruling.ranked else pick_no_confirm
    leader = _picked(ruling.leader.item, land) if ruling and ruling.leader else pick  # the best median alone
    # For comparison only, not the sweeper's rule: the most headroom over every tied config, shown
    # within 5 % of the leader or not (standings.verdict gives headroom only the ones within 5 %).
    leanest = leader
    if ruling and ruling.tie:
        share = lambda f: ruling.memory(f)[1]  # noqa: E731
        leanest = _picked(
            min(ruling.tie, key=lambda f: (math.inf if share(f) is None else share(f), ruling.tie.index(f))).item, land
        )
    plan = ConfirmationState.from_dict(study.user_attrs.get(Key.CONFIRMATION)) or ConfirmationState()
    return {
        "found_s": found_s,
        "seconds": clock,
        "search_s": clock - confirm_s,
        "confirm_s": confirm_s,
        "pick": pick,
        "pick_no_confirm": pick_no_confirm,
        "leader": leader,
        "leanest": leanest,
        "tie": bool(ruling and ruling.tie),
        # Whether a point within 5 % was among the finalists chosen after the search (confirmation
        # picks only among them, unless it gave its runs back to the search).
        "finalist_good": any(
            good(_picked(study.trials[n], land), land) for n in (plan.finalists if plan.chosen is None else plan.chosen)
        ),
        "given_back": confirm.given_back(study),
        "confirm_stopped": plan.stopped,
        "trials": counted,
        "search_stopped": ended[0][0] if ended else None,
        "stopped_good": len(stopped_good),
        "oom_trials": oom_trials[0],
        "false_prunes": false_prunes[0],
        "study": study,
    }


def disturbed(land: dict, seed: int, model_error: float) -> dict:
    """key -> the point's forecast with its tokens/s x exp(N(0, model_error)), drawn once per seed
    (model_error 0: the forecast as recorded): the model the sweeper would have if it were this wrong."""
    import dataclasses

    rng = random.Random(7_919 * seed + 101)
    out = {}
    for p in land["points"]:
        f = p.get("forecast")
        if f is None:
            continue
        factor = math.exp(rng.gauss(0.0, model_error)) if model_error else 1.0
        out[key(p["levers"])] = dataclasses.replace(f, tokens_per_s=f.tokens_per_s * factor) if f.tokens_per_s else f
    return out


def _move_runs(land: dict, params: dict, prescreen_of) -> bool:
    point = land["by_key"].get(key(params))
    return point is not None and (point.get("predicted_peak_bytes") is None or prescreen_of(point) is None)


def enqueue_neighbour(
    study, land: dict, seed: int, prescreen: bool, margin: float, verdicts: dict | None = None, allowed=None
) -> int:
    """The sweeper's start.enqueue_neighbour on a landscape (neighbours.enqueue); returns how many candidate
    points it checked that `verdicts` (the sweeper's Prescreen.move_verdicts: point -> may run) did not hold
    yet, each a composition and an estimate the sweeper pays for once."""
    from hydra_plugins.grpo_optuna_sweeper import neighbours

    verdicts = {} if verdicts is None else verdicts
    known = len(verdicts)
    allowed = allowed or move_allowed(land, prescreen, margin)

    def runs(params: dict) -> bool:
        point = neighbours.point_key(params)
        if point not in verdicts:
            verdicts[point] = allowed(params)
        return verdicts[point]

    neighbours.enqueue(study, land["grid"], runs, seed)
    return len(verdicts) - known


def move_allowed(land: dict, prescreen: bool, margin: float):
    """The sweeper's `runs` for a neighbour move on a landscape: a point of the landscape (else TRL
    would reject it) that the pre-screen lets run."""
    from hydra_plugins.grpo_optuna_sweeper.outcome import prescreen_verdict

    def runs(params: dict) -> bool:
        point = land["by_key"].get(key(params))
        if point is None:
            return False
        if not prescreen or point.get("predicted_peak_bytes") is None:
            return True
        return prescreen_verdict(point["predicted_peak_bytes"], point.get("limit_bytes", land["budget_bytes"]), margin) is None

    return runs


def _picked(trial, land: dict) -> dict | None:
    return land["by_key"][key(trial.params)] if trial is not None else None


def measure_compose_s(land: dict, base: list[str], count: int = 12, cuda: bool | None = None) -> float:
    """Seconds the sweeper spends on one point before it launches it (or refuses it): compose the config (Hydra),
    check it (validate_here; `cuda=True` for a GPU landscape replayed here) and estimate its peak;
    the median over `count` points of `land`."""
    import time

    from grpo_sweep.config.compose import compose_train_config
    from hydra_plugins.grpo_optuna_sweeper import space

    times = []
    for point in random.Random(0).sample(land["points"], count):
        started = time.perf_counter()
        try:
            _check_and_estimate(
                compose_train_config([*base, *(space.to_override(k, v) for k, v in point["levers"].items())]), cuda
            )
        except Exception:  # noqa: BLE001 - as the sweeper: a point the checks refuse costs its composition and check
            pass
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def random_seconds(land: dict, seed: int) -> float:
    points = list(land["points"])
    random.Random(seed).shuffle(points)
    clock = 0.0
    for p in points:
        clock += full_seconds(p)
        if good(p, land):
            return clock
    return clock


def scan(land: dict, seeds: int, stop_below: float | None) -> dict:
    """Seconds to a good point and the no-confirmation pick rate at one stop_below (no confirmation runs)."""
    runs = [sweep(land, seed, n_trials=N_TRIALS, stop_below=stop_below, confirm_top=0, until_found=True) for seed in range(seeds)]
    return {
        "search_median_seconds_no_confirm": median(_charge(f) for f in runs),
        "pick_within_5pct_rate_no_confirm": _rate((f["pick_no_confirm"] for f in runs), land),
        "good_trials_stopped_early": sum(f["stopped_good"] for f in runs),
        "trials_stopped_early": sum(sum(t.user_attrs.get("status") == "slow" for t in f["study"].trials) for f in runs),
    }


def picks(land: dict, seeds: int, stop_below: float | None, top: int, repeats: int, n_trials: int = N_TRIALS, **setting) -> dict:
    """The pick rate of an `n_trials` sweep confirming `top` finalists `repeats` more times each, and how
    often its search ran a truly-good point at all; `setting`: sweep's frontier / n_startup_trials /
    neighbour_every."""
    runs = [
        sweep(land, s, n_trials=n_trials, stop_below=stop_below, confirm_top=top, confirm_repeats=repeats, **setting)
        for s in range(seeds)
    ]
    return {
        "pick_within_5pct_rate": _rate((r["pick"] for r in runs), land),
        # top 0: the sweep without confirmation (all N_TRIALS search; the best single run wins)
        "pick_within_5pct_rate_no_confirm": _rate((r["pick_no_confirm"] for r in runs), land),
        "good_point_run_rate": sum(r["found_s"] is not None for r in runs) / len(runs),
        "median_confirm_seconds": median(r["confirm_s"] for r in runs),
        "median_seconds": median(r["seconds"] for r in runs),
    }


def evaluate(
    land: dict,
    seeds: int,
    stop_below: float | None,
    *,
    confirm_top: int = 3,
    confirm_repeats: int = 2,
    others: bool = True,
    frontier: int | None = None,
    n_startup_trials: int | None = None,
    neighbour_every: int | None = None,
    start: str | None = None,
) -> dict:
    """Every strategy over `seeds` seeds on `land`; the summary keys (without a landscape suffix).
    frontier / n_startup_trials / neighbour_every / start: None, the plugin's defaults (sweep resolves them)."""
    runs_found, runs_pick = [], []
    for seed in range(seeds):
        common = {
            "n_trials": N_TRIALS,
            "stop_below": stop_below,
            "frontier": frontier,
            "n_startup_trials": n_startup_trials,
            "neighbour_every": neighbour_every,
            "start": start,
        }
        runs_found.append(sweep(land, seed, confirm_top=0, until_found=True, **common))
        runs_pick.append(sweep(land, seed, confirm_top=confirm_top, confirm_repeats=confirm_repeats, **common))
    charged = [_charge(f) + p["confirm_s"] for f, p in zip(runs_found, runs_pick)]
    out = {
        "search_median_seconds": median(charged),
        "search_median_seconds_no_confirm": median(_charge(f) for f in runs_found),
        "search_p90_seconds": sorted(charged)[int(0.9 * len(charged))],
        "search_median_confirm_seconds": median(p["confirm_s"] for p in runs_pick),
        # Confirmation's seconds as a share of its sweep's (hydra.sweeper.confirm_budget caps it): median, worst.
        "confirm_share_median": median(p["confirm_s"] / p["seconds"] for p in runs_pick),
        "confirm_share_max": max(p["confirm_s"] / p["seconds"] for p in runs_pick),
        "pick_within_5pct_rate": _rate((p["pick"] for p in runs_pick), land),
        "pick_within_5pct_rate_no_confirm": _rate((f["pick_no_confirm"] for f in runs_found), land),
        # The tie rule's part in the pick: how often the leader was within noise of another finalist (a
        # tie, won by the most memory headroom), and the rate had the best median always won.
        "tie_rate": sum(p["tie"] for p in runs_pick) / len(runs_pick),
        "pick_within_5pct_rate_best_median": _rate((p["leader"] for p in runs_pick), land),
        # The tie rule had it given the most headroom among every tied config (not only those within 5 %).
        "pick_within_5pct_rate_headroom_any_tie": _rate((p["leanest"] for p in runs_pick), land),
        # The ceiling confirmation works under: seeds whose finalists held a point within 5 %.
        "finalist_within_5pct_rate": sum(p["finalist_good"] for p in runs_pick) / len(runs_pick),
        # Seeds whose confirmation, undecidable from the start, gave its reserved runs back to the search.
        "given_back_rate": sum(p["given_back"] for p in runs_pick) / len(runs_pick),
        # Why confirmation stopped, seeds per reason (confirm.next_round's `stopped`).
        "confirm_stopped": {
            why: sum(str(p["confirm_stopped"]) == why for p in runs_pick)
            for why in sorted({str(p["confirm_stopped"]) for p in runs_pick})
        },
        # How far off the pick is, not only whether it clears the 5 % line: its true value / the
        # optimum, the median and the worst tenth over the seeds.
        "pick_of_optimum_median": median(_of_optimum(p["pick"], land) for p in runs_pick),
        "pick_of_optimum_p10": sorted(_of_optimum(p["pick"], land) for p in runs_pick)[len(runs_pick) // 10],
        # The ceiling on the pick rate: sweeps whose search phase ran a truly-good point to its end at all.
        "good_point_run_rate": sum(p["found_s"] is not None for p in runs_pick) / len(runs_pick),
        "good_trials_stopped_early": sum(f["stopped_good"] for f in runs_found),
        "stop_below": stop_below,
    }
    if others:
        tpe = [
            sweep(land, s, n_trials=N_TRIALS, stop_below=None, confirm_top=0, until_found=True, **TPE_UNCONSTRAINED)
            for s in range(seeds)
        ]
        out["tpe_unconstrained_median_seconds"] = median(_charge(t) for t in tpe)
        out["tpe_unconstrained_pick_within_5pct_rate"] = _rate((t["pick_no_confirm"] for t in tpe), land)
        out["random_median_seconds"] = median(random_seconds(land, s) for s in range(seeds))
        out["random_pick_within_5pct_rate"] = _rate((random_pick(land, s) for s in range(seeds)), land)
        out["grid_seconds"] = sum(full_seconds(p) for p in land["points"])
    return out


# hydra-optuna-sweeper's TPE: no pre-screen, an OOM a failed trial, no start points, no neighbour moves
# (constrained=False), Optuna's own 10 random startup trials.
TPE_UNCONSTRAINED = {"prescreen": False, "constrained": False, "frontier": 0, "n_startup_trials": 10}


def declared(land: dict, seed: int, sampler: str, confirm_top: int = 3) -> dict:
    """Random search or TPE as hydra-optuna-sweeper runs it (no pre-screen, an OOM a failed trial, no
    start points or neighbour moves, no early stop), to the moment it declares its winner: it has no
    stop rule, so it runs its N_TRIALS budget, of which the confirmation rule ours uses (confirm.phases
    with `confirm_top` finalists) takes its share, and standings.verdict names the winner. sweep's
    result: `seconds` every trial's and confirmation's, `pick` the declared winner."""
    setting = {**TPE_UNCONSTRAINED, "sampler": sampler}
    return sweep(land, seed, n_trials=N_TRIALS, stop_below=None, confirm_top=confirm_top, **setting)


def random_pick(land: dict, seed: int, n_trials: int = N_TRIALS) -> dict | None:
    """Random search's pick after `n_trials` points (uniform, without replacement, as random_seconds
    draws them): the point whose one run showed the most, among those that fit."""
    points = list(land["points"])
    random.Random(seed).shuffle(points)
    rng = random.Random(1_000_003 * seed + 17)
    shown = [(draw_run(land, p, rng)["tokens_per_s"], i, p) for i, p in enumerate(points[:n_trials]) if p["status"] == "ok"]
    return max(shown)[2] if shown else None


def _charge(run: dict) -> float:
    """Seconds to a good point; a sweep that never found one is charged everything it ran."""
    return run["found_s"] if run["found_s"] is not None else run["seconds"]


def oracle_pick_rate(land: dict, n_trials: int = N_TRIALS, band: float = 0.10, draws: int = 4000) -> dict:
    """The best pick rate any sweep of `n_trials` trials could reach on `land`: an oracle that already
    knows which points lie within `band` of the optimum runs each of them n_trials // k times (at
    least once) and picks the best median. Where the points' runs overlap, even it misses."""
    contenders = [p for p in land["points"] if p["status"] == "ok" and p["tokens_per_s"] >= (1 - band) * land["optimum"]]
    runs_each = max(1, n_trials // len(contenders))
    rng = random.Random(0)
    hits = 0
    for _ in range(draws):
        hits += good(_best_median(contenders, runs_each, land, rng), land)
    return {"rate": hits / draws, "contenders": len(contenders), "runs_each": runs_each, "band": band}


def _best_median(points: list[dict], runs_each: int, land: dict, rng: random.Random) -> dict | None:
    """The point with the best median of `runs_each` drawn runs among `points` that fit (None: none fits)."""
    fits = [p for p in points if p["status"] == "ok"]
    if not fits:
        return None
    return max(fits, key=lambda p: statistics.median(draw_run(land, p, rng)["tokens_per_s"] for _ in range(runs_each)))


def model_oracle_pick_rate(land: dict, n_trials: int = N_TRIALS, top: int = 20, draws: int = 2000) -> dict:
    """The best pick rate a sweep of `n_trials` trials reaches when all it knows is the sweeper's
    forecast of every point: it spends its runs evenly on the k points the forecast ranks fastest among
    those it lets run (forecast ties at the k-th place broken at random each draw; a point that does
    not fit yields no value), picks the best median, for every k up to `top`; the best k is reported.
    Not a bound on every search (one that adapts its runs to what they show could do better), but what
    the forecast alone points to: where it stays far below the oracle's, the gap is what the oracle is told."""
    ranked = [p for p in land["points"] if (f := p.get("forecast")) is not None and f.runs and f.vllm_starts and f.tokens_per_s]
    if not ranked:
        return {"rate": None, "k": None, "by_k": {}}
    rng = random.Random(0)
    ks = range(1, min(top, len(ranked)) + 1)
    hits = dict.fromkeys(ks, 0)
    for _ in range(draws):
        order = sorted(ranked, key=lambda p: (-p["forecast"].tokens_per_s, rng.random()))
        for k in ks:
            best = _best_median(order[:k], max(1, n_trials // k), land, rng)
            hits[k] += best is not None and good(best, land)
    by_k = {k: hits[k] / draws for k in ks}
    k = max(by_k, key=by_k.__getitem__)
    return {"rate": by_k[k], "k": k, "runs_each": max(1, n_trials // k), "by_k": by_k}


def _of_optimum(pick: dict | None, land: dict) -> float:
    return pick["tokens_per_s"] / land["optimum"] if pick is not None and pick["status"] == "ok" else 0.0


def _rate(picks, land: dict) -> float:
    picks = list(picks)
    return sum(1 for p in picks if p is not None and good(p, land)) / len(picks)


def measure_frontier_s(land: dict, base: list[str], cuda: bool | None = None) -> float:
    """Seconds the sweeper's frontier start spends ranking the candidates of `land` (every point, or
    space.MAX_CANDIDATES drawn from a larger space) before its first trial: the config of each point from compose.ComposeCache (one Hydra composition per distinct
    group choice, each point a copy with its value overrides applied), checked (validate_here;
    `cuda=True` for a GPU landscape replayed here) and estimated, as the sweeper's `start.enqueue_frontier`
    does it, outside a Hydra app (compose_train_config). The whole time, not a per-point median."""
    import time

    from grpo_sweep.config.compose import compose_train_config, config_groups
    from hydra_plugins.grpo_optuna_sweeper import compose, space

    groups = config_groups(base)  # the sweeper reads them from its own config: not charged
    started = time.perf_counter()
    cache = compose.ComposeCache(compose_train_config, groups.__contains__)
    for params in space.candidates(land["grid"], 0):  # what the sweeper ranks: at most MAX_CANDIDATES
        try:
            _check_and_estimate(cache.config([*base, *(space.to_override(k, v) for k, v in params.items())]), cuda)
        except Exception:  # noqa: BLE001 - as the sweeper: a point that cannot be composed or estimated is not a pick
            continue
    return time.perf_counter() - started


def _check_and_estimate(cfg, cuda: bool | None) -> None:
    """What the sweeper does with a composed point before it launches or ranks it: check it
    (validate_here; `cuda=True` for a GPU landscape replayed here, whose packages such as
    bitsandbytes are on that machine, not necessarily here) and estimate its peak."""
    from grpo_sweep.config.local import validate_here
    from grpo_sweep.config.validate import validate
    from grpo_sweep.memory.estimator import estimate

    if cuda:
        validate(cfg, cuda=True)
    else:
        validate_here(cfg)
    estimate(cfg)
