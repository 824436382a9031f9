"""`grpo-sweep report <multirun dir | optuna storage>`: compare every trial in one HTML page.

People decide from a picture: throughput against peak memory with the budget drawn in, what each
lever measurably did, and the config to copy. This module loads trials (metrics.json files under
a directory, or an Optuna study whose user attrs hold the metrics and run_dir), derives the
comparisons, and hands drawing to report_figures.py, HTML to report_html.py and the W&B Report to
wandb_report.py. Keys added by other modules (predicted_peak_bytes, budget_bytes, oom_phase,
deficit_bytes, ...) are used when present and never required.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from .levers import EXTRA_LEVER_NAMES, LEVER_NAMES, LEVERS
from .metrics import METRICS_FILE, read_metrics

CATEGORIES = ("feasible", "over_headroom", "oom", "pruned", "failed")
REPORT_FILE = "report.html"
# A trial's status when its storage has no metrics for it (e.g. pruned before it ran).
OPTUNA_STATUS = {"COMPLETE": "ok", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running", "WAITING": "waiting"}


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

    @property
    def status(self) -> str:
        if self.optuna_state == "PRUNED" and self.record.get("status") not in ("ok", "oom"):
            return "pruned"
        return self.record.get("status") or ("running" if self.optuna_state == "RUNNING" else "unknown")

    @property
    def category(self) -> str:
        if self.status == "ok" and self.over_headroom:
            return "over_headroom"
        return {"ok": "feasible", "oom": "oom", "pruned": "pruned"}.get(self.status, "failed")

    @property
    def levers(self) -> dict:
        return self.record.get("levers") or {}

    @property
    def objective_name(self) -> str:
        return self.config.get("objective") or "tokens_per_s"

    @property
    def objective(self) -> float | None:
        value = self.record.get(self.objective_name)
        return value if self.status == "ok" and _finite(value) else None

    def gib(self, key: str) -> float | None:
        value = self.record.get(key)
        return value / 2**30 if _finite(value) else None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _natural_key(path: Path):
    return [int(p) if p.isdigit() else p for p in path.parts]


def _load_config(run_dir: Path) -> dict:
    path = run_dir / "config.yaml"
    if not path.exists():
        return {}
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def load_dir(root: Path) -> list[Trial]:
    """Every trial under a multirun (or sweep) directory: each directory holding a metrics.json."""
    trials = []
    for path in sorted(Path(root).rglob(METRICS_FILE), key=_natural_key):
        run_dir = path.parent
        record = read_metrics(run_dir) or {}
        config = _load_config(run_dir)
        number = (config.get("trial") or {}).get("number")
        name = str(run_dir.relative_to(root)) if run_dir != Path(root) else run_dir.name
        trials.append(Trial(name=name, record=record, config=config, number=number, run_dir=str(run_dir)))
    return trials


def open_storage(source: str):
    """An Optuna storage from a URL (sqlite:///..., postgresql://...), a .db file, or a journal file
    (`journal:PATH`, as the sweeper's `storage` setting spells it, or a plain path)."""
    import optuna

    if "://" in source and not source.startswith("journal:"):
        return source
    path = Path(source.removeprefix("journal:"))
    if not path.exists():
        raise SystemExit(f"grpo-sweep report: {source!r} is neither a directory, a storage URL nor a file")
    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        return f"sqlite:///{path.resolve()}"
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


def load_study(source: str, study_name: str | None):
    import optuna

    storage = open_storage(source)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if study_name is None:
        if len(names) != 1:
            raise SystemExit(f"grpo-sweep report: --study is required; studies in {source}: {names or 'none'}")
        study_name = names[0]
    if study_name not in names:
        raise SystemExit(f"grpo-sweep report: --study={study_name!r} not found; studies in {source}: {names}")
    return optuna.load_study(study_name=study_name, storage=storage)


def trials_from_study(study) -> list[Trial]:
    """Optuna trials, with the metrics.json of their run_dir when it still exists, else user attrs."""
    trials = []
    for ft in study.get_trials(deepcopy=False):
        attrs = dict(ft.user_attrs)
        run_dir = attrs.get("run_dir")
        # The sweeper's flat attrs (status, predicted_peak_bytes, deficit_bytes, ...), then a nested
        # "metrics" dict if any, then the trial's own metrics.json, which wins where they overlap.
        record = {k: v for k, v in attrs.items() if k not in ("metrics", "run_dir")}
        record.update(attrs.get("metrics") if isinstance(attrs.get("metrics"), dict) else {})
        if run_dir and Path(run_dir).exists():
            record.update(read_metrics(Path(run_dir)) or {})
        record.setdefault("levers", {k: v for k, v in ft.params.items()})
        record.setdefault("status", OPTUNA_STATUS.get(ft.state.name, ft.state.name.lower()))
        config = _load_config(Path(run_dir)) if run_dir and Path(run_dir).exists() else {}
        trials.append(Trial(
            name=f"trial {ft.number}", record=record, config=config, number=ft.number,
            run_dir=run_dir, optuna_state=ft.state.name, preset=attrs.get("preset"),
            over_headroom=ft.state.name == "COMPLETE" and any(v > 0 for v in (ft.constraints or {}).values()),
        ))
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

    from .compose import CONF_DIR

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
    feasible = [t for t in trials if t.objective is not None and t.category == "feasible"]
    return max(feasible, key=lambda t: t.objective) if feasible else None


def budget_gib(trials: list[Trial]) -> float | None:
    """The memory budget: budget_bytes from the memory modules, else the target GPU's memory_gib."""
    for t in trials:
        if _finite(t.record.get("budget_bytes")):
            return t.record["budget_bytes"] / 2**30
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


def lever_effects(trials: list[Trial]) -> list[dict]:
    """Each lever's measured effect on peak memory and the objective, from feasible trials.

    Prefer pairs of trials that differ only in that lever (a controlled comparison); otherwise
    compare the median at the lever's lowest and highest value, and say that other levers varied.
    """
    measured = [t for t in trials if t.objective is not None and t.gib("peak_memory_bytes")]
    names = LEVER_NAMES + EXTRA_LEVER_NAMES
    rows = []
    for lever in names:
        values = sorted({lever_label(t.levers.get(lever)): t.levers.get(lever) for t in measured}.values(),
                        key=sort_key)
        if len(values) < 2:
            continue
        pairs = []
        for a, b in combinations(measured, 2):
            if a.levers.get(lever) == b.levers.get(lever):
                continue
            if any(a.levers.get(k) != b.levers.get(k) for k in names if k != lever):
                continue
            lo, hi = sorted((a, b), key=lambda t: sort_key(t.levers.get(lever)))
            pairs.append((_pct(hi.record["peak_memory_bytes"], lo.record["peak_memory_bytes"]),
                          _pct(hi.objective, lo.objective)))
        if pairs:
            d_peak = statistics.median(p[0] for p in pairs)
            d_obj = statistics.median(p[1] for p in pairs)
            basis = f"{len(pairs)} pair(s) differing only in {lever}"
        else:
            def at(value, lever=lever):
                group = [t for t in measured if t.levers.get(lever) == value]
                return (statistics.median(t.record["peak_memory_bytes"] for t in group),
                        statistics.median(t.objective for t in group))

            (lo_peak, lo_obj), (hi_peak, hi_obj) = at(values[0]), at(values[-1])
            d_peak, d_obj = _pct(hi_peak, lo_peak), _pct(hi_obj, lo_obj)
            basis = f"medians over {len(measured)} trials; other levers varied too"
        guess = next((lv.memory for lv in LEVERS if lv.name == lever), "")
        rows.append({
            "lever": lever, "low": lever_label(values[0]), "high": lever_label(values[-1]),
            "peak_change_pct": d_peak, "objective_change_pct": d_obj, "basis": basis, "expected": guess,
        })
    return rows


def overrides(trial: Trial) -> str:
    """The trial's config as the command line that reruns it (the sweeper's own overrides if stored)."""
    if isinstance(trial.record.get("overrides"), list) and trial.record["overrides"]:
        import shlex

        return "python train.py " + " ".join(shlex.quote(str(o)) for o in trial.record["overrides"])
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
    return "python train.py " + " ".join(parts)


def wandb_group(trials: list[Trial], study_name: str | None, root: Path | None) -> str | None:
    """The W&B group the trials were logged under (as wandb_logger chose it), for the W&B Report."""
    for t in trials:
        if t.record.get("wandb_group"):
            return t.record["wandb_group"]
    if study_name:
        return study_name
    return str(root) if root is not None else None


# --- command line ---------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grpo-sweep report",
        description="Compare the trials of a Hydra multirun directory or an Optuna study: writes "
        "report.html with PNG figures (and, with --wandb, a W&B Report).",
    )
    p.add_argument("source", nargs="?", help="multirun/sweep directory, or Optuna storage "
                   "(sqlite:///x.db, postgresql://..., a .db file or a journal file)")
    p.add_argument("--study", help="study name in the storage (needed when it holds several)")
    p.add_argument("--out", help="output directory (default: the multirun directory, or "
                   "outputs/reports/<study> for a storage)")
    p.add_argument("--wandb", action="store_true", help="also build a W&B Report of the same comparison")
    p.add_argument("--project", help="W&B project (default: logger.project of the trials)")
    p.add_argument("--entity", help="W&B entity (default: logger.entity, else your default entity)")
    p.add_argument("--publish", metavar="SPEC_JSON", help="publish a W&B Report spec written offline")
    return p


def cli(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.publish:
        from .wandb_report import publish

        return publish(Path(args.publish), entity=args.entity)
    if not args.source:
        _parser().error("give a multirun directory or an Optuna storage (or --publish SPEC_JSON)")
    study, importances, importance_note = None, {}, None
    root = Path(args.source)
    if root.is_dir():
        trials = load_dir(root)
        title = f"grpo-sweep report: {root}"
        out = Path(args.out) if args.out else root
    else:
        study = load_study(args.source, args.study)
        trials = trials_from_study(study)
        importances, importance_note = param_importances(study)
        title = f"grpo-sweep report: study {study.study_name}"
        out = Path(args.out) if args.out else Path("outputs/reports") / study.study_name
        root = None
    if not trials:
        print(f"grpo-sweep report: no trials found in {args.source} (no {METRICS_FILE} files)", file=sys.stderr)
        return 1
    presets = load_presets()
    for t in trials:
        t.preset = t.preset or match_preset(t.levers, presets)
    out.mkdir(parents=True, exist_ok=True)

    from .report_html import write_report

    path = write_report(trials, out, title=title, importances=importances, importance_note=importance_note)
    counts = {c: sum(t.category == c for t in trials) for c in CATEGORIES}
    print(f"report: {path}  ({len(trials)} trials: " + ", ".join(f"{n} {c}" for c, n in counts.items() if n) + ")")
    best = best_trial(trials)
    if best is not None:
        print(f"best: {best.name}  {best.objective_name} {best.objective:.1f}\n  {overrides(best)}")
    if args.wandb:
        from .wandb_report import build_and_save

        group = wandb_group(trials, study.study_name if study else None, root)
        build_and_save(trials, out, group=group, title=title, project=args.project, entity=args.entity)
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
