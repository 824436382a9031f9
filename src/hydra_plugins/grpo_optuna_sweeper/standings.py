"""Who is winning: the one reading of the study that the search, confirmation, the soak and the
summary share.

A run counts when it completed `ok` and feasible (`is_ok`); runs of one config pool into a
Finalist (study.best); `verdict` decides the winner by the median of runs, the noise the study
measured and, with `flagged`, the learning check; `best_finalist` is the best so far, which the
progress line, early stop and neighbour moves race against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_sweep.report.learning import check_trials, is_flagged
from grpo_sweep.report.trials import trials_from_study
from grpo_sweep.study import best as best_rule
from grpo_sweep.study.attrs import ConfirmationState, Key, Status

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial


def feasible(trial: FrozenTrial) -> bool:
    return all(v <= 0 for v in trial.constraints.values())


def is_ok(trial: FrozenTrial) -> bool:
    from optuna.trial import TrialState

    return trial.state == TrialState.COMPLETE and trial.user_attrs.get(Key.STATUS) == Status.OK and feasible(trial)


def best_trial(study: Study, tolerance: float | None = None) -> FrozenTrial | None:
    """The first run of the winning config (learning_verdict): the best median of its runs, once
    confirmation chose its finalists only they compete, from a tie within noise the safer config, and
    a config that changed the learning only when every competing config did. tolerance:
    hydra.sweeper.learning_tolerance (None: per precision)."""
    winner = learning_verdict(study, tolerance)[0].winner
    return winner.item if winner is not None else None


def runs(study: Study) -> list[FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if is_ok(t) or best_rule.config_group(t.user_attrs, None) is not None]


def by_config(study: Study) -> dict[str, Any]:
    """How study.best's rules read a study: each run's value, the config it belongs to (repeats and
    confirmation runs join the config's first trial), the direction, the finalists confirmation chose."""
    return {
        "value": lambda t: t.value if is_ok(t) else None,
        "group": lambda t: best_rule.config_group(t.user_attrs, t.number),
        "direction": study.direction,
        "compete": best_rule.competing(study.user_attrs),
    }


def finalists(study: Study) -> list[best_rule.Finalist[FrozenTrial]]:
    """Each config's runs, best median first (the search's view: no noise, no tie)."""
    return best_rule.finalists(runs(study), **by_config(study))


def verdict(study: Study, flagged: dict | None = None) -> best_rule.Verdict:
    """grpo_sweep.study.best.decide over the study: the noise it measured, the leader, the tie, the
    winner; `flagged` (learning_verdict): the trials that changed the learning, out of the running.
    The indifference zone and the configs whose runs and forecast agreed within it are confirmation's
    (the study's `confirmation` attr; the zone best.INDIFFERENCE before it judged)."""
    state = ConfirmationState.from_dict(study.user_attrs.get(Key.CONFIRMATION))
    zone = state.zone if state is not None and state.zone is not None else best_rule.INDIFFERENCE
    return best_rule.decide(
        runs(study),
        **by_config(study),
        peak_of=lambda t: t.user_attrs.get(Key.PEAK_MEMORY_BYTES),
        budget_of=lambda t: t.user_attrs.get(Key.BUDGET_BYTES),
        flagged=is_flagged(flagged, lambda t: t.number) if flagged else None,
        zone=zone,
        agreed=state.agreed if state is not None else None,
    )


def best_finalist(study: Study) -> best_rule.Finalist[FrozenTrial] | None:
    """The config with the best median so far (the stop threshold and the progress line race against it)."""
    ranked = finalists(study)
    return ranked[0] if ranked else None


def learning_verdict(study: Any, tolerance: float | None) -> tuple[best_rule.Verdict, dict]:
    """(verdict, flagged): the trials that changed the learning (grpo_sweep.report.learning, read from
    their metrics.json as the report reads them) and `verdict` with them out of the running (a
    flagged config wins only when every competing config is flagged): the one winner best.yaml, the
    printout, the tie, the soak and the exports name. tolerance: hydra.sweeper.learning_tolerance."""
    flagged = check_trials(trials_from_study(study), tolerance)
    return verdict(study, flagged), flagged
