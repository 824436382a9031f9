"""The sweeper's settings (`hydra.sweeper.*`), registered as `hydra/sweeper=grpo_optuna`.

Every field is a Hydra override: `python train.py -m +sweeps=tiny_cpu hydra.sweeper.n_trials=20`.
No `from __future__ import annotations` in plugin modules with dataclasses: Hydra loads them
without registering them in sys.modules, where dataclasses would look the string annotations up.
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class GrpoOptunaSweeperConf:
    _target_: str = "hydra_plugins.grpo_optuna_sweeper.sweeper.GrpoOptunaSweeper"
    # Search space in Hydra's override grammar: {lever_or_group: "choice(...)" | "range(...)" | ...}.
    params: dict[str, Any] | None = None
    study_name: str = "grpo-sweep"
    # None: a JournalStorage file `study.journal` in hydra.sweep.dir (no server needed).
    # Else: `journal:<path>` / `<path>.journal`, `sqlite:///<path>`, `postgresql://user:pw@host/db`.
    storage: str | None = None
    n_trials: int = 20  # finished trials the study must hold; a resumed sweep runs only the rest
    n_jobs: int = 1  # trials asked and launched together (use with a parallel launcher, e.g. joblib)
    objective: str | None = None  # a numeric metrics.json key; None: the config's `objective`
    direction: str = "maximize"
    sampler: str = "tpe"  # tpe | gp | random | grid
    # TPE only: random trials before it models the study (Optuna's n_startup_trials). Enqueued trials
    # (frontier_start, warm_start, enqueue) count among them: after the 5 frontier points, 5 is enough
    # (bench/search_seconds.py: fewer seconds on both landscapes, README "Performance").
    n_startup_trials: int = 5
    seed: int | None = 0  # sampler seed; each worker process adds its pid when several share a study
    # Pre-screen with grpo_sweep.memory.estimator: PRUNE points predicted over budget by more than margin.
    prescreen: bool = True
    prescreen_margin: float = 0.10  # fraction of the budget
    # Require headroom: feasible only if peak <= headroom x budget (e.g. 0.9); None: the full budget.
    headroom: float | None = None
    # Warm start: enqueue these presets (conf/preset/) as the first trials, to compare against.
    warm_start: bool = False
    presets: list[str] = field(default_factory=lambda: ["seed_baseline", "seed_optimized"])
    # Points to try first (e.g. the config you run today, or both ends of the range to bracket the
    # memory wall): [{lever: value, ...}, ...]; unnamed parameters are sampled. Once per study, and
    # (like the presets) only while the search phase has room: the rest are named in a warning.
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    # Frontier start: first run the N points the estimator predicts fill the allowed memory best,
    # spread over the space (frontier.py); 0: off. Needs discrete parameters (choice / range);
    # without them it is skipped with a log line.
    frontier_start: int = 5
    # Neighbour moves: once n_startup_trials are counted, every N-th search trial is the best config so
    # far with one lever moved one step, a step that would not fit first, with a second lever moved to
    # make room (neighbours.py); 0: off. Needs discrete parameters.
    neighbour_every: int = 2
    # Dead workers: heartbeat every N s; a RUNNING trial silent for grace_period s is failed and retried.
    heartbeat_interval: int = 30
    grace_period: int | None = None  # None: 4 x heartbeat_interval
    max_retry: int = 2
    # A systematic failure stops the sweep: after this many trials in a row fail for the same reason
    # that is not memory (a model that cannot be loaded, a missing package, a bad reward), with that
    # reason and what to do (failures.py). 0: never stop.
    max_failures_in_a_row: int = 3
    top_k: int = 5  # rows of the final table
    # Early stop (tokens_per_s, maximize): a trial whose first timed step (after its peak is measured)
    # runs below stop_below x the best feasible tokens/s so far stops: PRUNED, status `slow`, its peak
    # and partial throughput kept. null or 0: off. 0.5 from bench/search_efficiency.py (README).
    stop_below: float | None = 0.5
    # Confirmation: the top confirm_top feasible configs run confirm_repeats more times, interleaved,
    # and the winner is the best median. Counted in n_trials: the search gets
    # n_trials - confirm_top x confirm_repeats trials. 0: off.
    confirm_top: int = 3
    confirm_repeats: int = 2


ConfigStore.instance().store(
    group="hydra/sweeper", name="grpo_optuna", node=GrpoOptunaSweeperConf, provider="grpo_optuna_sweeper"
)
