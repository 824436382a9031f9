"""Equal learning, checked from the trials' own numbers: a knob trial that trained something else.

A knob changes speed and memory, never what is learned (levers.KINDS). Trials of one recipe and one
seed therefore start from the same weights, sample the same completions and take the same first
optimiser steps, so the numbers TRL logs for those steps agree up to floating-point reordering. A
trial whose numbers depart further changed the learning, whatever its settings claim: a knob that is
not neutral for this recipe, or an upstream bug (TRL's sleep mode generated from stale weights until
TRL PR #5313).

The fingerprint is read from metrics.json's `history` (TRL's logged metrics per optimiser step):
- `grad_norm` of steps 1 and 2: the first step's gradient, and the second's after one update, so the
  update itself (learning rate, optimiser) is covered too;
- `entropy` of step 1: the mean token entropy of the completions under the policy (TRL 1.16
  `_compute_loss`), a function of the model's distribution on the completions it sampled;
- `reward` of step 1: what the reward functions gave the completions sampled;
- where vLLM generated: step 1's `sampling_logp_diff` and `is_ratio` (TRL's
  `sampling/sampling_logp_difference/mean` and `sampling/importance_sampling_ratio/mean`), the
  trainer/vLLM disagreement the importance-sampling correction reweights by.

The tolerance is relative. Measured on CPU in float32, knob trials of `+sweeps=tiny_cpu` (every
split, checkpointing on and off, eager and sdpa attention) agreed to 1e-6 relative in every key;
FP32_TOLERANCE leaves two orders of magnitude above that. bf16 rounds at 2^-8 (3.9e-3) per
operation, and a different micro-batch reorders the sums: BF16_TOLERANCE is 5 roundings. A sweep
sets its own with hydra.sweeper.learning_tolerance (null: these, per trial precision); the study keeps
it (user attr `learning_tolerance`) for `grpo-sweep report`.

Which trials are compared: those that finished `ok` (the ones that can win), by their metrics.json
`recipe` and their config's `seed`. A trial with no other config of its recipe and seed is `unchecked`:
nothing was compared with it (`Checked.unchecked`). Within a group, configs whose numbers agree form a
cluster; the largest cluster, when one outnumbers every other, is the reference and the configs outside
it changed the learning. When none does (two pairs that disagree), every config is flagged and the text
says which agree ("trials 0 and 2 agree; trials 1 and 3 agree; ..."). The flag is shown wherever
results are: the sweep's table, best.yaml (`changed_the_learning:`, `learning_unchecked:`), report.html
and `grpo-sweep report`.

The winner rule (study.best.decide with `flagged`, the one place it is applied): a flagged trial
never wins silently, and it wins only when nothing else can. A user sweeps to find the fastest way
to train *their* recipe; a trial that trained something else answers another question, however fast
it ran. So the winner is the best config none of whose runs changed the learning, and each flagged
config that ranked above it is named with what differed. Only when every config that competes is
flagged (two trials that disagree, with no third to say which departs) does the best one win, and it
is then named as flagged. A tie within noise is settled among the unflagged configs, so the tie,
best.yaml and the report name one winner. The rule applies where the sweep's results are read (its
summary, the soak, the report); during the search, the best so far (progress, early stop, neighbour
moves) is by value, as the flags need the finished trials' records.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..study import best as best_rule
from ..study.attrs import Status

# (history row, key): the numbers compared, each from the step TRL logged it at (1-based)
FINGERPRINT: tuple[tuple[int, str], ...] = (
    (1, "grad_norm"),
    (2, "grad_norm"),
    (1, "entropy"),
    (1, "reward"),
    (1, "sampling_logp_diff"),
    (1, "is_ratio"),
)
FP32_TOLERANCE = 1e-4
BF16_TOLERANCE = 2e-2
# Below this magnitude a value is compared absolutely (a loss or a logp difference near 0).
FLOOR = 1e-6


def fingerprint(record: Mapping) -> dict[str, float]:
    """The fingerprint keys a trial's record has (`<key>@<step>`), finite values only."""
    rows = record.get("history") or []
    out = {}
    for step, key in FINGERPRINT:
        if len(rows) >= step and rows[step - 1].get(key) is not None:
            value = float(rows[step - 1][key])
            if math.isfinite(value):
                out[f"{key}@{step}"] = value
    return out


def tolerance_for(record: Mapping) -> float:
    """The default relative tolerance for a trial's precision: float32 on CPU, bf16 on a card."""
    dtype = str((record.get("trainer_settings") or {}).get("dtype") or record.get("dtype") or "")
    device = str(record.get("device") or "")
    return BF16_TOLERANCE if ("bf16" in dtype or "bfloat16" in dtype or device == "cuda") else FP32_TOLERANCE


def _group_key(record: Mapping, seed) -> str:
    recipe = record.get("recipe") or {}
    return repr((sorted((k, repr(v)) for k, v in recipe.items()), seed))


@dataclass(frozen=True)
class Departure:
    """What one trial's fingerprint changed: each key beyond the tolerance, against its group's reference
    (the median of the configs that agree, or of all when no cluster of agreeing configs outnumbers the others)."""

    keys: list[dict]  # {key, value, reference, relative (None when compared absolutely)}
    group_size: int  # configs of this recipe and seed compared (each config one vote, however many runs)
    tolerance: float  # relative
    agreement: str = ""  # which trials agree, when no cluster of agreeing configs outnumbers the others

    @property
    def text(self) -> str:
        differed = "; ".join(
            f"{k['key']} {k['value']:.6g} vs {k['reference']:.6g} ({_rel(k['value'], k['reference'])})" for k in self.keys
        )
        agree = f"; {self.agreement}" if self.agreement else ""
        return (
            f"changed the learning: {differed} (the median of {self.group_size} configs of this recipe "
            f"and seed; tolerance {self.tolerance:g} relative{agree})"
        )

    def as_dict(self) -> dict:
        out = {"differed": self.keys, "compared_with": self.group_size, "tolerance": self.tolerance, "text": self.text}
        return out | ({"agreement": self.agreement} if self.agreement else {})


class Checked(dict):
    """`check_trials`' answer: the trials that changed the learning, by key, each with its Departure;
    `unchecked`: the ok trials with no other config of their recipe and seed, so nothing was compared with them."""

    def __init__(self, flagged: Mapping[Hashable, Departure] | None = None, unchecked: Iterable[Hashable] = ()):
        super().__init__(flagged or {})
        self.unchecked: frozenset = frozenset(unchecked)


def verdict_of(key: Hashable, checked: Mapping[Hashable, Departure]) -> str:
    """One trial's word in a table: "changed", "unchecked" (no peer to compare with) or "same"."""
    if key in checked:
        return "changed"
    return "unchecked" if key in getattr(checked, "unchecked", ()) else "same"


def compare(
    trials: Iterable[tuple[Hashable, Mapping, object]],
    tolerance: float | None = None,
    config: Callable[[Hashable, Mapping], Hashable] | None = None,
) -> Checked:
    """The trials whose fingerprint departs from the others of their recipe and seed, each with what differed.

    Only trials that trained (a `history`) are compared. The reference is each key's median over the
    group's configs, each config one vote (the median of its runs): a config run again
    (confirmation) repeats its own numbers, so its runs must not outvote the other configs. Of three
    configs or more, those outside the largest cluster of agreeing configs are named when it
    outnumbers every other cluster; of two that disagree, or of clusters of equal size, all are, each
    with which trials agree.

    Args:
        trials: (key, metrics record, seed) of each trial.
        tolerance: The relative tolerance; None: tolerance_for each trial.
        config: The config a run belongs to, from (key, record); None: each trial its own.

    Returns:
        The departures; `Checked.unchecked` holds the trials whose group holds one config.
    """
    out = Checked()
    alone: set[Hashable] = set()
    for members in _groups(trials).values():
        votes: dict[Hashable, list[dict]] = {}
        runs_of: dict[Hashable, list[Hashable]] = {}
        for number, record, fp in members:
            group = config(number, record) if config else number
            votes.setdefault(group, []).append(fp)
            runs_of.setdefault(group, []).append(number)
        if len(votes) < 2:
            alone.update(number for number, _, _ in members)
            continue
        keys = set.intersection(*(set(fp) for _, _, fp in members))
        tol0 = tolerance if tolerance is not None else tolerance_for(members[0][1])
        medians = {g: {k: statistics.median(fp[k] for fp in runs) for k in keys} for g, runs in votes.items()}
        clusters = _clusters(medians, tol0)
        sizes = sorted((len(c) for c in clusters), reverse=True)
        leading = clusters[0] if len(sizes) > 1 and sizes[0] > sizes[1] else list(medians)
        tied = len(sizes) > 1 and sizes[0] == sizes[1] > 1  # clusters of agreeing configs, none the largest
        agreement = _agreement(clusters, runs_of) if tied else ""
        reference = {k: statistics.median(medians[g][k] for g in leading) for k in keys}
        for number, record, fp in members:
            tol = tolerance if tolerance is not None else tolerance_for(record)
            differed = []
            for k in sorted(keys):
                ref, value = reference[k], fp[k]
                if not _agree(value, ref, tol):
                    relative = (value - ref) / abs(ref) if abs(ref) >= FLOOR else None
                    differed.append({"key": k, "value": value, "reference": ref, "relative": relative})
            if differed:
                out[number] = Departure(differed, len(votes), tol, agreement)
    out.unchecked = frozenset(alone)
    return out


def _groups(trials: Iterable[tuple[Hashable, Mapping, object]]) -> dict[str, list[tuple[Hashable, Mapping, dict]]]:
    """The trials that trained (a fingerprint), by recipe and seed."""
    groups: dict[str, list[tuple[Hashable, Mapping, dict]]] = {}
    for number, record, seed in trials:
        fp = fingerprint(record)
        if fp:
            groups.setdefault(_group_key(record, seed), []).append((number, record, fp))
    return groups


def _agree(value: float, ref: float, tol: float) -> bool:
    """Whether `value` lies within `tol` of `ref`, relative to |ref| (at least FLOOR).

    Args:
        value: The trial's number.
        ref: The reference.
        tol: The relative tolerance.

    Returns:
        Whether they agree.
    """
    return abs(value - ref) <= tol * max(abs(ref), FLOOR)


def _clusters(medians: Mapping[Hashable, Mapping[str, float]], tol: float) -> list[list[Hashable]]:
    """The configs, each joined to the first cluster whose first config it agrees with on every key;
    the largest cluster first (ties in the order the configs came)."""
    clusters: list[list[Hashable]] = []
    for g, fp in medians.items():
        home = next((c for c in clusters if all(_agree(fp[k], medians[c[0]][k], tol) for k in fp)), None)
        if home is None:
            clusters.append([g])
        else:
            home.append(g)
    return sorted(clusters, key=len, reverse=True)


def _agreement(clusters: list[list[Hashable]], runs_of: Mapping[Hashable, list[Hashable]]) -> str:
    """Which trials agree, cluster by cluster: "trials 0 and 2 agree; trials 1 and 3 agree; the groups differ"."""
    parts = []
    for cluster in clusters:
        runs = [r for g in cluster for r in runs_of[g]]
        parts.append(f"{_names(runs)} agree" if len(runs) > 1 else f"{_names(runs)} agrees with no other")
    return "; ".join(parts) + "; the groups differ and none outnumbers the others"


def _names(keys: list[Hashable]) -> str:
    """ "trials 0 and 2" for trial numbers; the names themselves otherwise."""
    words = [str(k) for k in sorted(keys, key=lambda k: (not isinstance(k, int), k if isinstance(k, int) else str(k)))]
    joined = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    if all(isinstance(k, int) for k in keys):
        return ("trials " if len(words) > 1 else "trial ") + joined
    return joined


def check_trials(trials: Iterable[Any], tolerance: float | None = None) -> Checked:
    """`compare` over the report's trials (report.trials.Trial: `record`, `config`, `number`, `name`, `status`):
    the ok ones, keyed by trial number (a plain multirun's: its name), grouped by their config's `seed`
    and `task` section (the recipe names the task only; a `task.*` concession is another task), a config's
    runs (study.best.config_group: repeats and confirmation runs) one vote.
    The one place the sweep's summary and the report read the flags from."""
    return compare(
        ((key_of(t), t.record, _seed_and_task(t.config or {})) for t in trials if t.status == Status.OK),
        tolerance,
        config=lambda key, record: best_rule.config_group(record, key),
    )


def _seed_and_task(config: Mapping) -> object:
    """A trial's seed, with its task's settings when its config holds them."""
    task = config.get("task")
    return (
        (config.get("seed"), sorted((str(k), repr(v)) for k, v in task.items()))
        if isinstance(task, Mapping)
        else config.get("seed")
    )


def key_of(trial: Any) -> Hashable:
    """A report trial's key in `check_trials`: its Optuna number, else its name."""
    return trial.number if trial.number is not None else trial.name


def is_flagged(flagged: Mapping[Hashable, Departure], key: Callable[[Any], Hashable]) -> Callable[[Any], bool]:
    """study.best.decide's `flagged`: whether a run (by `key`) changed the learning."""
    return lambda run: key(run) in flagged


def flagged_runs(finalist: Any, flagged: Mapping[Hashable, Departure], key: Callable[[Any], Hashable]) -> list:
    """(key, Departure) of each run of a config that changed the learning.

    Args:
        finalist: A config and its runs.
        flagged: Each flagged run's Departure, by key.
        key: A run's key.

    Returns:
        The pairs, in run order.
    """
    return [(key(m), flagged[key(m)]) for m in finalist.members if key(m) in flagged]


def verdict_lines(
    verdict: best_rule.Verdict,
    flagged: Mapping[Hashable, Departure],
    key: Callable[[Any], Hashable],
    label: Callable[[Hashable], str],
    rest: bool = True,
) -> list[str]:
    """What the summary and the report say about the learning check, one line each with its numbers:
    every flagged config that ranked above the winner, the winner itself when it is flagged, and
    every other flagged trial.

    Args:
        verdict: The best-config rule's Verdict.
        flagged: Each flagged run's Departure, by key.
        key: A run's key.
        label: A key's name in the text ("trial 7").
        rest: Also name every other flagged trial.

    Returns:
        The lines.
    """
    if not flagged:
        return []
    said: set[Hashable] = set()

    def runs(finalist: Any) -> str:
        found = flagged_runs(finalist, flagged, key)
        said.update(k for k, _ in found)
        return "; ".join(f"{label(k)} {d.text}" for k, d in found)

    lines = []
    if verdict.ranked:
        clean = label(key(verdict.ranked[0].item))
        for i, f in enumerate(verdict.passed_over):
            lead = "best" if i == 0 else "also above the winner:"
            lines.append(f"{lead} {runs(f)}; the best that did not: {clean} (the winner)")
        if verdict.winner_flagged:
            found = flagged_runs(verdict.ranked[0], flagged, key)
            agreement = next((d.agreement for _, d in found if d.agreement), "")
            lines.append(
                f"the winner {runs(verdict.ranked[0])}. It wins only because every config that competed is flagged: "
                + (agreement or "no trial of its recipe and seed agrees with it")
                + ", so none is known to have trained the recipe"
            )
    if rest:
        lines += [f"{label(k)} {d.text}" for k, d in flagged.items() if k not in said]
    return lines


def _rel(value: float, ref: float) -> str:
    if abs(ref) < FLOOR:
        return f"{value - ref:+.2g} absolute"
    return f"{(value - ref) / abs(ref):+.2%}"
