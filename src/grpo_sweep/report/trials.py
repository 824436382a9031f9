"""The report's trial records and the comparisons derived from them.

People decide from a picture: throughput against peak memory with the budget drawn in, what each lever measurably did,
and the config to copy. This module loads trials (metrics.json files under a directory, or an Optuna study whose user
attrs hold the metrics and run_dir), derives the comparisons, and hands drawing to figures.py, HTML to html.py and the
W&B Report to wandb_report.py. Keys added by other modules (predicted_peak_bytes, budget_bytes, oom_phase,
deficit_bytes, ...) are used when present and never required.
"""

from __future__ import annotations

import copy
import functools
import math
import statistics
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from ..levers import EXTRA_LEVER_NAMES, KINDS, LEVER_NAMES, LEVERS
from ..metrics import METRICS_FILE, MetricsError, read_metrics
from ..study import best as best_rule
from ..study.attrs import Key, Status
from ..units import GIB
from .learning import Departure, check_trials, is_flagged, key_of

# slow: stopped early by the sweeper's stop_below (measured, just too slow to win); never an OOM or a failure.
CATEGORIES = ("feasible", "over_headroom", Status.OOM, Status.SLOW, Status.PRUNED, Status.FAILED)
REPORT_FILE = "report.html"
# A trial's status when its storage has no metrics for it (e.g. pruned before it ran).
OPTUNA_STATUS = {
    "COMPLETE": Status.OK,
    "PRUNED": Status.PRUNED,
    "FAIL": Status.FAILED,
    "RUNNING": Status.RUNNING,
    "WAITING": Status.WAITING,
}


@dataclass
class Trial:
    """One trial as the report sees it, whichever source it came from."""

    name: str
    record: dict
    config: dict = field(default_factory=dict)
    number: int | None = None
    run_dir: str | None = None
    optuna_state: str | None = None
    preset: str | None = None  # the seed preset whose levers this trial runs, if any
    # Ran without OOM but the study marked it infeasible: its peak is over the sweep's headroom
    # (hydra.sweeper.headroom), so it is not a config the user asked for and never the best.
    over_headroom: bool = False
    # The study's direction for its objective (hydra.sweeper.direction); the best-trial rule follows it.
    direction: str = "maximize"
    # From a study: the value Optuna was told, and the objective's name the sweeper recorded.
    value: float | None = None
    objective_key: str | None = None
    # hydra.sweeper.learning_tolerance of the sweep that ran it (None: per precision, report/learning.py)
    learning_tolerance: float | None = None

    @property
    def status(self) -> str:
        if self.optuna_state == "PRUNED" and self.record.get("status") not in (Status.OK, Status.OOM, Status.SLOW):
            return Status.PRUNED
        return self.record.get("status") or (Status.RUNNING if self.optuna_state == "RUNNING" else "unknown")

    @property
    def category(self) -> str:
        if self.status == Status.OK and self.over_headroom:
            return "over_headroom"
        return {Status.OK: "feasible", Status.OOM: Status.OOM, Status.SLOW: Status.SLOW, Status.PRUNED: Status.PRUNED}.get(
            self.status, Status.FAILED
        )

    @property
    def levers(self) -> dict:
        return self.record.get("levers") or {}

    @property
    def objective_name(self) -> str:
        return self.objective_key or self.config.get("objective") or "tokens_per_s"

    @property
    def objective(self) -> float | None:
        value = self.value if self.value is not None else self.record.get(self.objective_name)
        return value if self.status == Status.OK and _finite(value) else None

    def gib(self, key: str) -> float | None:
        value = self.record.get(key)
        return value / GIB if _finite(value) else None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _natural_key(path: Path):
    return [int(p) if p.isdigit() else p for p in path.parts]


def _load_config(run_dir: Path) -> dict:
    """A trial's config.yaml as a dict of its own, parsed once per version of the file (the sweep's
    summary and its report both read every trial's)."""
    path = run_dir / "config.yaml"
    if not path.exists():
        return {}
    return copy.deepcopy(_parsed_config(str(path), ((stat := path.stat()).st_mtime_ns, stat.st_size)))


@functools.lru_cache(maxsize=1024)
def _parsed_config(path: str, _version: tuple[int, int]) -> dict:  # _version: the file's (mtime_ns, size)
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def sweep_settings(root: Path) -> dict:
    """The sweep's own objective and direction from the multirun.yaml Hydra wrote in `root`, if any."""
    path = Path(root) / "multirun.yaml"
    if not path.exists():
        return {}
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(path)
    sweeper = OmegaConf.select(cfg, "hydra.sweeper", default=None) or {}
    out = {"learning_tolerance": sweeper.get("learning_tolerance")}
    if sweeper.get("direction"):
        out["direction"] = best_rule.normalize_direction(sweeper.get("direction"))
    objective = sweeper.get("objective") or cfg.get("objective")
    if objective:
        out["objective"] = objective
    return out


def load_dir(root: Path) -> list[Trial]:
    """Every trial under a multirun (or sweep) directory: each directory holding a metrics.json."""
    settings = sweep_settings(root)
    direction, tolerance = settings.get("direction", "maximize"), settings.get("learning_tolerance")
    trials = []
    for path in sorted(Path(root).rglob(METRICS_FILE), key=_natural_key):
        run_dir = path.parent
        try:
            record = read_metrics(run_dir) or {}
        except MetricsError as err:  # one trial's broken file is that trial failed, not a dead report
            record = {"status": Status.FAILED, "error": str(err)}
        config = _load_config(run_dir)
        number = (config.get("trial") or {}).get("number")
        name = str(run_dir.relative_to(root)) if run_dir != Path(root) else run_dir.name
        trials.append(
            Trial(
                name=name,
                record=record,
                config=config,
                number=number,
                run_dir=str(run_dir),
                direction=direction,
                learning_tolerance=tolerance,
            )
        )
    return trials


def trials_from_study(study) -> list[Trial]:
    """Optuna trials, with the metrics.json of their run_dir when it still exists, else user attrs."""
    trials = []
    chosen = best_rule.competing(study.user_attrs) or []  # the confirmation phase's finalists
    confirmation = study.user_attrs.get(Key.CONFIRMATION) or {}
    agreed = confirmation.get("agreed") or []  # the finalists whose runs and model agreed within the zone
    for ft in study.get_trials(deepcopy=False):
        attrs = dict(ft.user_attrs)
        if ft.number in chosen:
            attrs["finalist"] = True
        if ft.number in agreed:
            attrs["agreed"] = True
        if confirmation.get("zone") is not None:
            attrs["indifference"] = confirmation["zone"]
        run_dir = attrs.get(Key.RUN_DIR)
        # The sweeper's flat attrs (status, predicted_peak_bytes, deficit_bytes, ...), then a nested
        # "metrics" dict if any, then the trial's own metrics.json, which wins where they overlap.
        record = {k: v for k, v in attrs.items() if k not in ("metrics", "run_dir")}
        record.update(attrs.get("metrics") if isinstance(attrs.get("metrics"), dict) else {})
        if run_dir and Path(run_dir).exists():
            try:
                record.update(read_metrics(Path(run_dir)) or {})
            except MetricsError as err:
                record.setdefault("error", str(err))
        record.setdefault("levers", {k: v for k, v in ft.params.items()})
        record.setdefault("status", OPTUNA_STATUS.get(ft.state.name, ft.state.name.lower()))
        if ft.state.name == "FAIL" and record["status"] in (Status.OK, Status.SLOW):
            record["status"] = Status.FAILED  # the study's state decides: a FAIL is never counted feasible
        config = _load_config(Path(run_dir)) if run_dir and Path(run_dir).exists() else {}
        trials.append(
            Trial(
                name=f"trial {ft.number}",
                record=record,
                config=config,
                number=ft.number,
                run_dir=run_dir,
                optuna_state=ft.state.name,
                preset=attrs.get(Key.PRESET),
                over_headroom=ft.state.name == "COMPLETE" and any(v > 0 for v in (ft.constraints or {}).values()),
                direction=best_rule.normalize_direction(study.direction),
                value=ft.value if ft.state.name == "COMPLETE" else None,
                objective_key=study.user_attrs.get(Key.OBJECTIVE),
                learning_tolerance=study.user_attrs.get(Key.LEARNING_TOLERANCE),  # the sweep's, recorded at its end
            )
        )
    return trials


def param_importances(study) -> tuple[dict, str | None]:
    """Optuna's importances of each parameter for the objective, or why they cannot be computed."""
    import optuna

    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) < 2:
        return {}, f"needs at least 2 completed trials (this study has {len(complete)})"
    try:
        return dict(optuna.importance.get_param_importances(study)), None
    except Exception as exc:  # noqa: BLE001 - e.g. a single distinct value, multi-objective studies
        return {}, f"{type(exc).__name__}: {exc}"


# --- derived comparisons ---------------------------------------------------------------------


def load_presets(conf_dir: Path | None = None) -> dict[str, dict]:
    """The seed presets' lever values (conf/preset/*.yaml), to mark trials that run them."""
    from omegaconf import OmegaConf

    from ..config.compose import CONF_DIR

    presets = {}
    for path in sorted((conf_dir or CONF_DIR).joinpath("preset").glob("*.yaml")):
        values = OmegaConf.to_container(OmegaConf.load(path))
        presets[path.stem] = {k: v for k, v in values.items() if k in LEVER_NAMES + EXTRA_LEVER_NAMES}
    return presets


def match_preset(levers: dict, presets: dict[str, dict]) -> str | None:
    for name, values in presets.items():
        if values and all(levers.get(k) == v for k, v in values.items()):
            return name
    return None


def best_trial(trials: list[Trial]) -> Trial | None:
    """The first run of the winning config (verdict): the best median of its runs, only the sweep's
    confirmed finalists competing once it chose them, and from a tie within noise the safer config;
    a config that changed the learning only when every competing config did (learning_check)."""
    winner = learning_check(trials)[0].winner
    return winner.item if winner is not None else None


def finalists(trials: list[Trial]) -> list:
    """Each config's runs (a repeat or a confirmation run, record keys `repeats` / `confirms`, joins
    the config's first trial), the winner first and then by median; once the sweep's confirmation
    phase chose its finalists (record key `finalist`), only they compete (grpo_sweep.study.best.decide:
    a tie within noise goes to the config with the most memory headroom), a trial that changed the
    learning winning only when every competing config did (learning_check)."""
    return learning_check(trials)[0].ranked


def verdict(trials: list[Trial], flagged: dict[object, Departure] | None = None) -> best_rule.Verdict:
    """grpo_sweep.study.best.decide over the trials: the noise measured, the leader, the tie, the winner;
    `flagged` (learning.check_trials): the runs that changed the learning, out of the running."""
    if not trials:
        return best_rule.Verdict([], None, 0, [], None, {})
    runs = [t for t in trials if t.category == "feasible" or best_rule.config_group(t.record, None) is not None]
    chosen = [t.number for t in trials if t.record.get("finalist")]
    zone = next((t.record["indifference"] for t in trials if t.record.get("indifference") is not None), best_rule.INDIFFERENCE)
    return best_rule.decide(
        runs,
        value=lambda t: t.objective if t.category == "feasible" else None,
        group=lambda t: best_rule.config_group(t.record, t.number if t.number is not None else t.name),
        direction=trials[0].direction,
        compete=chosen or None,
        peak_of=lambda t: t.record.get("peak_memory_bytes"),
        budget_of=lambda t: t.record.get("budget_bytes"),
        flagged=is_flagged(flagged, key_of) if flagged else None,
        zone=zone,
        agreed=[t.number for t in trials if t.record.get("agreed")] or None,
    )


def learning_check(trials: list[Trial]) -> tuple[best_rule.Verdict, dict[object, Departure]]:
    """(verdict, flagged): the trials that changed the learning (learning.check_trials, at the sweep's
    tolerance) and `verdict` with them out of the running: the one winner every output names."""
    if not trials:
        return verdict(trials), {}
    flagged = check_trials(trials, trials[0].learning_tolerance)
    return verdict(trials, flagged), flagged


def budget_gib(trials: list[Trial]) -> float | None:
    """The memory budget: budget_bytes from the memory modules, else the target GPU's memory_gib."""
    for t in trials:
        if _finite(t.record.get("budget_bytes")):
            return t.record["budget_bytes"] / GIB
    for t in trials:
        gib = (t.config.get("gpu") or {}).get("memory_gib")
        if _finite(gib):
            return float(gib)
    return None


def sort_key(value):
    """Order lever values: numbers and booleans by value, module lists by how many modules."""
    if isinstance(value, (list, tuple)):
        return (1, len(value), str(value))
    if isinstance(value, (int, float)):
        return (0, float(value), "")
    return (2, 0, str(value))


def lever_label(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _pct(new, old):
    return 100.0 * (new / old - 1.0) if old else math.nan


def setting_value(trial: Trial, key: str):
    """A setting's value in `trial`: its requested levers first, else its config.yaml (a dotted key;
    a section that names itself, such as `backend`, by its name)."""
    if key in trial.levers:
        return trial.levers[key]
    node = trial.config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node.get("name") if isinstance(node, dict) else node


def compared_settings(trials: list[Trial]) -> list[str]:
    """The settings the lever-effect table compares: the levers and every setting with a kind
    (levers.KINDS: the knobs a sweep searches, booleans and choices among them), less
    gradient_accumulation_steps where every trial held completions_per_step (then the accumulation is
    completions_per_step / micro-batch: the micro-batch's own row says it)."""
    names = list(dict.fromkeys([*LEVER_NAMES, *EXTRA_LEVER_NAMES, *(k for k in KINDS if k not in ("model", "task"))]))
    if trials and all(setting_value(t, "completions_per_step") is not None for t in trials):
        names.remove("gradient_accumulation_steps")
    return names


def lever_effects(trials: list[Trial]) -> list[dict]:
    """Each setting's measured effect on peak memory and the objective, from feasible trials, for
    every setting that took two values among them (compared_settings).

    Prefer pairs of trials that differ only in that setting (a controlled comparison); otherwise
    compare the median at its lowest and highest value, and say that other settings varied.
    """
    measured = [t for t in trials if t.objective is not None and t.gib("peak_memory_bytes")]
    names = compared_settings(measured)
    values_of = {t.name: {k: setting_value(t, k) for k in names} for t in measured}
    rows = []
    for lever in names:
        values = sorted(
            {lever_label(values_of[t.name][lever]): values_of[t.name][lever] for t in measured}.values(), key=sort_key
        )
        if len(values) < 2:
            continue
        pairs = []
        for a, b in combinations(measured, 2):
            va, vb = values_of[a.name], values_of[b.name]
            if va[lever] == vb[lever] or any(va[k] != vb[k] for k in names if k != lever):
                continue
            lo, hi = sorted((a, b), key=lambda t: sort_key(values_of[t.name][lever]))
            pairs.append((_pct(hi.record["peak_memory_bytes"], lo.record["peak_memory_bytes"]), _pct(hi.objective, lo.objective)))
        if pairs:
            d_peak = statistics.median(p[0] for p in pairs)
            d_obj = statistics.median(p[1] for p in pairs)
            basis = f"{len(pairs)} pair(s) differing only in {lever}"
        else:

            def at(value, lever=lever):
                group = [t for t in measured if values_of[t.name][lever] == value]
                return (
                    statistics.median(t.record["peak_memory_bytes"] for t in group),
                    statistics.median(t.objective for t in group),
                )

            (lo_peak, lo_obj), (hi_peak, hi_obj) = at(values[0]), at(values[-1])
            d_peak, d_obj = _pct(hi_peak, lo_peak), _pct(hi_obj, lo_obj)
            basis = f"medians over {len(measured)} trials; other settings varied too"
        guess = next((lv.memory for lv in LEVERS if lv.name == lever), None) or (KINDS[lever].why if lever in KINDS else "")
        rows.append(
            {
                "lever": lever,
                "low": lever_label(values[0]),
                "high": lever_label(values[-1]),
                "peak_change_pct": d_peak,
                "objective_change_pct": d_obj,
                "basis": basis,
                "expected": guess,
            }
        )
    return rows


# Hydra settings a single rerun of a point does without: the sweep's own (sweeper, sweep folder,
# launcher, mode) and the first run's folder (the rerun writes its own).
NOT_FOR_A_RERUN = ("hydra.sweeper", "hydra/sweeper", "hydra.sweep", "hydra.launcher", "hydra/launcher", "hydra.mode", "hydra.run")


def rerun_hydra_settings(lines: list) -> list[str]:
    """The command line's Hydra settings (hydra.overrides.hydra) a rerun of the point needs
    (hydra.searchpath, the job's logging, ...): all but NOT_FOR_A_RERUN."""
    out = []
    for line in lines:
        key = str(line).split("=", 1)[0].lstrip("+~")
        if not any(key == prefix or key.startswith(prefix + ".") for prefix in NOT_FOR_A_RERUN):
            out.append(str(line))
    return out


def _run_hydra_settings(run_dir: str | None) -> list[str]:
    """rerun_hydra_settings of the run Hydra recorded in `run_dir` (.hydra/hydra.yaml), or []."""
    path = Path(run_dir) / ".hydra" / "hydra.yaml" if run_dir else None
    if path is None or not path.exists():
        return []
    import yaml

    try:
        written = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return []
    return rerun_hydra_settings(((written.get("hydra") or {}).get("overrides") or {}).get("hydra") or [])


def rerun_command(overrides: list) -> str:
    """`python train.py` with each override shell-quoted: one argument each, whatever it holds."""
    import shlex

    return " ".join(["python train.py", *(shlex.quote(str(o)) for o in overrides)])


def overrides(trial: Trial) -> str:
    """The trial's config as the command line that reruns it (the sweeper's own overrides, after the
    Hydra settings the run needs, if stored)."""
    if isinstance(trial.record.get("overrides"), list) and trial.record["overrides"]:
        return rerun_command([*(trial.record.get("hydra_overrides") or []), *trial.record["overrides"]])
    parts = []
    for group in ("model", "gpu"):
        name = (trial.config.get(group) or {}).get("name")
        if name:
            parts.append(f"{group}={name}")
    for lever in LEVER_NAMES + EXTRA_LEVER_NAMES:
        if lever in trial.levers:
            value = trial.levers[lever]
            text = "[" + ",".join(map(str, value)) + "]" if isinstance(value, (list, tuple)) else value
            parts.append(f"{lever}={str(text).lower() if isinstance(value, bool) else text}")
    for key in ("max_prompt_length", "gradient_checkpointing"):
        if key in trial.config:
            value = trial.config[key]
            parts.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return rerun_command([*_run_hydra_settings(trial.run_dir), *parts])


def wandb_group(trials: list[Trial], study_name: str | None, root: Path | None) -> str | None:
    """The W&B group the trials were logged under (as wandb_logger chose it), for the W&B Report.

    Args:
        trials: The study's trials.
        study_name: The study's name, the group when no trial names one.
        root: The sweep's folder, the group when there is no name.

    Returns:
        The group, or None.
    """
    for t in trials:
        if t.record.get("wandb_group"):
            return t.record["wandb_group"]
    if study_name:
        return study_name
    return str(root) if root is not None else None


# --- how far to trust the model --------------------------------------------------------------
MIN_RANKED = 3  # configs needed before a rank correlation says anything


def average_ranks(values: list[float], best_first: bool = True) -> list[float]:
    """1-based ranks of `values` (the largest first when best_first), ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: -values[i] if best_first else values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation of two equally long rank lists (Pearson's r of the ranks, so ties
    are handled); None with fewer than two items or when either list is all ties."""
    n = len(a)
    if n != len(b) or n < 2:
        return None
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    return None if va == 0 or vb == 0 else cov / math.sqrt(va * vb)


def model_vs_measured(trials: list[Trial]) -> dict:
    """The throughput model's predicted order against the measured one, over the feasible configs
    that ran (each config once: its runs' median, grpo_sweep.study.best.finalists) and carry the
    model's `predicted_tokens_per_s`. Both orders are best first: the model's by predicted tokens/s,
    the measured by the objective in the study's direction. Returns {configs, rho (None with fewer
    than MIN_RANKED configs: `why` says so), rho_calibrated, rows: [{trial, predicted_rank, measured_rank,
    predicted_tokens_per_s, measured, and once calibrated calibrated_tokens_per_s and calibrated_rank}] in
    measured order}."""
    feasible = [t for t in trials if t.category == "feasible"]
    direction = trials[0].direction if trials else "maximize"
    groups = best_rule.finalists(
        feasible,
        value=lambda t: t.objective,
        group=lambda t: best_rule.config_group(t.record, t.number if t.number is not None else t.name),
        direction=direction,
    )
    priced = [g for g in groups if _finite(g.item.record.get("predicted_tokens_per_s"))]
    if not priced:
        return {"configs": 0, "rho": None, "rows": [], "why": "no feasible trial carries the model's predicted tokens/s"}
    predicted = average_ranks([float(g.item.record["predicted_tokens_per_s"]) for g in priced])
    measured = average_ranks([float(g.median) for g in priced], best_first=direction == "maximize")
    rows = [
        {
            "trial": g.item.number if g.item.number is not None else g.item.name,
            "predicted_rank": p,
            "measured_rank": m,
            "predicted_tokens_per_s": float(g.item.record["predicted_tokens_per_s"]),
            "measured": g.median,
        }
        for g, p, m in zip(priced, predicted, measured)
    ]
    out: dict = {"configs": len(priced), "rho": None, "rho_calibrated": None, "rows": rows}
    if len(priced) < MIN_RANKED:
        out["why"] = f"needs {MIN_RANKED} feasible configs with a prediction (this study has {len(priced)})"
    else:
        out["rho"] = spearman(predicted, measured)
        calibrated = _calibrated(priced, feasible)
        if calibrated is not None:
            ranks = average_ranks(calibrated)
            out["rho_calibrated"] = spearman(ranks, measured)
            for row, value, rank in zip(rows, calibrated, ranks):
                row.update(calibrated_tokens_per_s=value, calibrated_rank=rank)
    return out


def _calibrated(priced: list, feasible: list[Trial]) -> list[float] | None:
    """Each config's predicted tokens/s calibrated on the other configs' trials (speed_fit.phase_fit: per
    phase a scale and a per-step overhead; leave one config out: never on its own runs); None when a
    config has no phases or no other config measured them."""
    from ..memory.speed_fit import calibrated as calibrated_prediction
    from ..memory.speed_fit import phase_fit

    out = []
    for g in priced:
        own = best_rule.config_group(g.item.record, g.item.number if g.item.number is not None else g.item.name)
        others = [
            t.record for t in feasible if best_rule.config_group(t.record, t.number if t.number is not None else t.name) != own
        ]
        fit = phase_fit(others)
        value = calibrated_prediction(g.item.record, fit) if fit else None
        if value is None:
            return None
        out.append(value["tokens_per_s"])
    return out


def model_trust_line(result: dict) -> str:
    """The one line the sweep's summary prints (and the report's section opens with)."""
    if result["rho"] is None:
        return f"Model vs measured rank: not computed ({result.get('why') or 'every prediction is equal'})"
    rho, n = result["rho"], result["configs"]
    # Under no relation rho has variance 1/(n - 1) (normal approximation): a |rho| below 1.96 of its
    # sd is what chance alone gives in 95 % of studies of n configs, so it says nothing either way.
    # Below 5 configs that bound exceeds 1, the largest |rho| there is: no order can clear it.
    chance = 1.96 / math.sqrt(n - 1)
    if chance >= 1:
        said = f"over {n} configs any rho, even 1, is what chance can give: too few to tell"
    elif abs(rho) < chance:
        said = f"over {n} configs a rho within +-{chance:.2f} is what chance gives: too few to tell"
    else:
        said = (
            "here the measured order " + ("follows" if rho >= 0.7 else "roughly follows" if rho > 0 else "runs against") + " it"
        )
    line = (
        f"Model vs measured rank over {n} feasible configs: Spearman rho {rho:.2f} "
        f"(1: the throughput model ordered them as measured; {said})"
    )
    if result.get("rho_calibrated") is not None:
        line += f"; calibrated on the other configs' measured phase times: rho {result['rho_calibrated']:.2f}"
    return line
