"""The sweeper's settings (`hydra.sweeper.*`), registered as `hydra/sweeper=grpo_optuna`.

Every field is a Hydra override: `python train.py -m +sweeps=tiny_cpu hydra.sweeper.n_trials=20`.
No `from __future__ import annotations` in plugin modules with dataclasses: Hydra loads them
without registering them in sys.modules, where dataclasses would look the string annotations up.
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.errors import CompactHydraException

from grpo_sweep.memory.throughput import SWEEP_N_TRIALS
from grpo_sweep.study.best import INDIFFERENCE

SAMPLERS = ("tpe", "gp", "random", "grid")
STARTS = ("model", "memory", "none")  # hydra.sweeper.start


@dataclass
class GrpoOptunaSweeperConf:
    _target_: str = "hydra_plugins.grpo_optuna_sweeper.sweeper.GrpoOptunaSweeper"
    # Search space in Hydra's override grammar: {lever_or_group: "choice(...)" | "range(...)" | ...}.
    params: dict[str, Any] | None = None
    # Equal learning: the sweep holds the recipe the config states (completions per step, generations,
    # lengths, LoRA rank and targets, 4-bit, ...: grpo_sweep.levers.KINDS) and searches knobs. A recipe
    # setting listed here may be changed by the search; best.yaml and the report then say what each
    # change the winner took bought (concessions.py). Empty: knobs only.
    concessions: list[str] = field(default_factory=list)
    study_name: str = "grpo-sweep"
    # None: a JournalStorage file `study.journal` in hydra.sweep.dir (no server needed).
    # Else: `journal:<path>` / `<path>.journal`, `sqlite:///<path>`, `postgresql://user:pw@host/db`.
    storage: str | None = None
    n_trials: int = SWEEP_N_TRIALS  # finished trials the study must hold; a resumed sweep runs only the rest
    n_jobs: int = 1  # trials asked and launched together (use with a parallel launcher, e.g. joblib)
    objective: str | None = None  # a numeric metrics.json key; None: the config's `objective`
    direction: str = "maximize"
    sampler: str = "tpe"  # tpe | gp | random | grid
    # TPE only: random trials before it models the study (Optuna's n_startup_trials). Enqueued trials
    # (start_points, warm_start, enqueue) count among them: after the 5 frontier points, 5 is enough
    # (bench/search_seconds.py: fewer seconds on both landscapes, docs/performance.md).
    n_startup_trials: int = 5
    seed: int | None = 0  # sampler seed; each worker process adds its pid when several share a study
    # Pre-screen with grpo_sweep.memory.estimator: PRUNE points predicted over budget by more than margin.
    prescreen: bool = True
    prescreen_margin: float = 0.10  # fraction of the budget
    # Calibration (calibration.py): after this many measured trials of a backend, its correction
    # (measured / predicted peaks) and their spread replace the fixed margin; 0: never (margin only).
    prescreen_calibrate: int = 3
    # Require headroom: feasible only if peak <= headroom x budget (e.g. 0.9); None: the full budget.
    headroom: float | None = None
    # Warm start: enqueue these presets (conf/preset/) as the first trials, to compare against.
    warm_start: bool = False
    presets: list[str] = field(default_factory=lambda: ["seed_baseline", "seed_optimized"])
    # Points to try first (e.g. the config you run today, or both ends of the range to bracket the
    # memory wall): [{lever: value, ...}, ...]; unnamed parameters are sampled. Once per study, and
    # (like the presets) only while the search phase has room: the rest are named in a warning.
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    # Start points: first run start_points points chosen from the models' forecast of every point
    # (forecast.py; start.enqueue_frontier): `model`, the points the estimator and the throughput
    # model predict fastest among those predicted to fit; `memory`, the points predicted to fill the
    # allowed memory best, spread over the space (start.pick); `none` (or start_points=0): off.
    start: str = "model"
    start_points: int = 5
    frontier_start: int | None = None  # the old name of start_points, still read (start_points_of)
    # `grpo-sweep plan`: print the space's forecast (its size, the points predicted to fit, the
    # fastest, the cheapest concession; preview.py) and stop before the study opens: no trial runs.
    plan_only: bool = False
    plan_json: str | None = None  # with plan_only: also write the forecast as JSON to this file
    # Neighbour moves: once n_startup_trials are counted, every N-th search trial is the best config so
    # far with one lever moved one step, a step that would not fit first, with a second lever moved to
    # make room (neighbours.py); 0: off. Needs discrete parameters.
    neighbour_every: int = 2
    # Dead workers: heartbeat every N s; a RUNNING trial silent for grace_period s is failed and retried.
    heartbeat_interval: int = 30
    grace_period: int | None = None  # None: 4 x heartbeat_interval
    max_retry: int = 2
    # Storage blips: a call to the study's storage that fails for a passing reason (the database
    # restarting or away, a full disk, a locked SQLite file) is retried with backoff for up to this
    # many seconds, then the sweep ends with one line saying what to do (docs/crash-safety.md). 0: never retry.
    storage_retry_s: float = 60.0
    # A systematic failure stops the sweep: after this many trials in a row fail for the same reason
    # that is not memory (a model that cannot be loaded, a missing package, a bad reward), with that
    # reason and what to do (failures.py). 0: never stop.
    max_failures_in_a_row: int = 3
    top_k: int = 5  # rows of the final table
    # Early stop (tokens_per_s, maximize): a trial whose first timed step (after its peak is measured)
    # runs below stop_below x the best feasible tokens/s so far stops: PRUNED, status `slow`, its peak
    # and partial throughput kept. A fraction in [0, 1]; null or 0: off. 0.5 from
    # bench/search_efficiency.py (docs/performance.md).
    stop_below: float | None = 0.5
    # Confirmation: the top confirm_top feasible configs run again, in rounds, within confirm_budget of
    # the sweep's seconds. Its rule (when a round runs, when it stops, when its runs go back to the
    # search) is confirm.py's module docstring; the winner rule is grpo_sweep/study/best.py's.
    # confirm_repeats: the runs per finalist reserved in n_trials (the search gets
    # n_trials - confirm_top x confirm_repeats trials); not a cap: the budget is. 0 (either): off.
    confirm_top: int = 3
    confirm_repeats: int = 2
    # Equal learning checked (grpo_sweep.report.learning): ok trials of one recipe and seed must take the
    # same first optimiser steps (grad norms, entropy, reward, vLLM's sampling numbers); one that departs by
    # more than this relative tolerance "changed the learning", is flagged in the table, best.yaml and
    # report.html, and wins only when no other config can. null: per precision (float32 1e-4, bf16 2e-2).
    learning_tolerance: float | None = None
    confirm_budget: float = 0.25  # a share of the sweep's seconds (every trial's, confirmation's included)
    # The indifference zone: configs within this fraction of each other are as good a pick, so the one
    # with the most memory headroom wins (confirmation stops once the finalists' runs and the model agree
    # they lie within it), the search stops once the model predicts no untried point beats the best
    # measured by more than the noise plus this, and a space predicted mostly within it is flat.
    indifference: float = INDIFFERENCE
    # The model-led search (lead.py) ends the search phase once the calibrated model predicts no untried
    # point beats the best measured by more than the noise plus `indifference` (or a flat space's safest
    # point has run): fewer trials than n_trials. false: the search runs its n_trials (the model still
    # picks the next point on its turns).
    search_stop: bool = True
    # Soak (soak.py): after the sweep, the winner runs this many steps with every step's own peak
    # measured; best.yaml (`soak:`) and the report say whether memory grew. Not a trial: it counts
    # nowhere and cannot change the winner. 0: off.
    soak_steps: int = 0


ConfigStore.instance().store(
    group="hydra/sweeper", name="grpo_optuna", node=GrpoOptunaSweeperConf, provider="grpo_optuna_sweeper"
)


# --- what each setting allows ----------------------------------------------------------------------
# Hydra checks the types against the dataclass above when it composes the config; the ranges are
# checked here, once, before the study's storage opens (check), and by the pieces that take a
# setting directly (build_sampler): one rule per key.
def _integer(low: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _optional(rule: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or rule(v)


ALLOWED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n_trials": (_integer(1), "an integer >= 1"),
    "n_jobs": (_integer(1), "an integer >= 1"),
    "direction": (lambda v: v in ("maximize", "minimize"), "maximize or minimize"),  # Optuna's own spelling
    "sampler": (lambda v: v in SAMPLERS, "one of " + ", ".join(SAMPLERS)),
    "n_startup_trials": (_integer(0), "an integer >= 0"),
    "seed": (_optional(_integer(0)), "an integer >= 0, or null"),
    "prescreen_margin": (lambda v: _number(v) and v >= 0, "a number >= 0 (a fraction of the budget: 0.1 = 10 %)"),
    "prescreen_calibrate": (_integer(0), "an integer >= 0 (measured trials before calibration replaces the margin; 0: off)"),
    "headroom": (
        _optional(lambda v: _number(v) and 0 < v <= 1),
        "a number in (0, 1] (a fraction of the budget), or null: all of it",
    ),
    "start": (lambda v: v in STARTS, "one of " + ", ".join(STARTS)),
    "start_points": (_integer(0), "an integer >= 0 (0: off)"),
    "frontier_start": (_optional(_integer(0)), "an integer >= 0 (0: off), or null; the old name of start_points"),
    "neighbour_every": (_integer(0), "an integer >= 0 (0: off)"),
    "heartbeat_interval": (_integer(1), "an integer >= 1 (seconds)"),
    "grace_period": (_optional(_integer(1)), "an integer >= 1 (seconds), or null: 4 x heartbeat_interval"),
    "max_retry": (_integer(0), "an integer >= 0"),
    "storage_retry_s": (lambda v: _number(v) and v >= 0, "a number of seconds >= 0 (0: never retry)"),
    "max_failures_in_a_row": (_integer(0), "an integer >= 0 (0: never stop)"),
    "top_k": (_integer(1), "an integer >= 1"),
    "stop_below": (
        _optional(lambda v: _number(v) and 0 <= v <= 1),
        "a number in [0, 1] (a fraction of the best tokens/s so far: 0.5 = half), or null or 0: off",
    ),
    "confirm_top": (
        lambda v: _integer(0)(v) and v != 1,
        "0 (off) or an integer >= 2 (one finalist confirmed cannot change the winner)",
    ),
    "confirm_repeats": (_integer(0), "an integer >= 0"),
    "learning_tolerance": (
        _optional(lambda v: _number(v) and 0 < v < 1),
        "a number in (0, 1) (relative: 1e-4 = 0.01 %), or null: per precision (float32 1e-4, bf16 2e-2)",
    ),
    "soak_steps": (_integer(0), "an integer >= 0 (steps the winner runs after the sweep; 0: off)"),
    "confirm_budget": (
        lambda v: _number(v) and 0 < v <= 1,
        "a number in (0, 1] (a share of the sweep's seconds: 0.25 = a quarter; 1: no limit)",
    ),
    "search_stop": (lambda v: isinstance(v, bool), "true or false"),
    "indifference": (
        lambda v: _number(v) and 0 <= v < 0.5,
        "a number in [0, 0.5) (a fraction of the best: 0.05 = configs within 5 % of each other are as good a pick)",
    ),
}


class SweeperSettingError(CompactHydraException, ValueError):
    """A hydra.sweeper setting out of its range: Hydra prints the message alone, without a traceback."""


class SweepError(CompactHydraException, RuntimeError):
    """The sweep cannot go on (its storage cannot be opened or stayed away, the study is another
    search's): Hydra prints the one-line message alone, without a traceback."""


def check_setting(key: str, value: Any) -> Any:
    """`value` when hydra.sweeper.<key> allows it, else a ValueError naming the key, the value and what
    is allowed."""
    rule, allowed = ALLOWED[key]
    if not rule(value):
        raise SweeperSettingError(f"hydra.sweeper.{key}={value!r}: must be {allowed}")
    return value


def check(conf: Mapping[str, Any]) -> None:
    """Every setting of `conf` (the sweeper's hydra.sweeper node) that has a rule, and the one rule
    between two of them; a missing key is the default."""
    defaults = GrpoOptunaSweeperConf()
    value = {key: check_setting(key, conf.get(key, getattr(defaults, key))) for key in ALLOWED}
    old, new = value["frontier_start"], value["start_points"]
    if old is not None and new != defaults.start_points and old != new:
        raise SweeperSettingError(
            f"hydra.sweeper.frontier_start={old!r} and hydra.sweeper.start_points={new!r}: frontier_start is the old "
            "name of start_points; set start_points only"
        )
    grace, beat = value["grace_period"], value["heartbeat_interval"]
    if grace is not None and grace <= beat:
        raise SweeperSettingError(
            f"hydra.sweeper.grace_period={grace!r}: must be greater than hydra.sweeper.heartbeat_interval={beat!r} "
            "(a live trial beats once per interval; a shorter grace fails and retries it), or null: 4 x heartbeat_interval"
        )


def start_points_of(settings: Mapping[str, Any]) -> int:
    """How many start points the sweep queues: hydra.sweeper.start_points, or its old name
    frontier_start where a sweep file still sets it."""
    old = settings.get("frontier_start")
    return int(old) if old is not None else int(settings.get("start_points", GrpoOptunaSweeperConf.start_points))


def indifference_of(settings: Mapping[str, Any]) -> float:
    """The indifference zone: hydra.sweeper.indifference, or its default where a settings node lacks it."""
    return float(settings.get("indifference", INDIFFERENCE))


def check_study_name(written: Any) -> None:
    """hydra.sweeper.study_name as written in the sweep's config (unresolved): an escaped `\\${` is
    refused. Hydra resolves the sweeper's node twice, so the name would reach the study with the
    interpolation resolved; any other character works (space.quoted quotes it for each trial)."""
    if isinstance(written, str) and "\\${" in written:
        raise SweeperSettingError(
            f"hydra.sweeper.study_name={written!r}: must not hold a literal '${{' (Hydra resolves it as an interpolation "
            "before the study opens); any other character works"
        )
