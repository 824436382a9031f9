"""`grpo-sweep report --wandb`: the same comparison as a W&B Report (wandb-workspaces).

The report is built entirely offline (a runset filtered to the trials' W&B group, a scatter of
throughput vs peak memory, parallel coordinates over the levers, a run comparer and reward line
plots). Saving needs the network and an API key; without them the spec is written as JSON next
to report.html and `grpo-sweep report --publish FILE` saves it later, so a sweep on an offline
GPU box still produces a report that can be published from a laptop.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..credentials import redact, wandb_mode
from ..levers import LEVER_NAMES
from .trials import Trial, finalists, overrides

SPEC_FILE = "wandb_report.json"


def _history_keys(trials: list[Trial], prefix: str) -> list[str]:
    keys = {k for t in trials for row in t.record.get("history") or [] for k in row if k.startswith(prefix)}
    return sorted(keys)


def _workspaces():
    try:
        import wandb_workspaces.reports.v2 as wr
    except ImportError:
        raise SystemExit("grpo-sweep report --wandb needs wandb-workspaces: pip install 'grpo-sweep[report]'") from None
    return wr


def build_report(trials: list[Trial], *, group: str | None, title: str, project: str, entity: str = ""):
    """The W&B Report object (nothing is sent anywhere).

    Args:
        trials: The study's trials.
        group: The W&B group the trials were logged under.
        title: The report's title.
        project: The W&B project.
        entity: The W&B entity; "": the default.

    Returns:
        The wandb_workspaces Report.
    """
    wr = _workspaces()
    from wandb_workspaces import expr

    objective = trials[0].objective_name
    filters = [expr.Metric("Group") == group] if group else []
    runset = wr.Runset(entity=entity, project=project, name="trials", filters=filters)
    per_fn = _history_keys(trials, "reward/")
    panels = [
        wr.ScatterPlot(
            title=f"{objective} vs peak memory (GiB)", x=wr.SummaryMetric("peak_memory_gib"), y=wr.SummaryMetric(objective)
        ),
        wr.ParallelCoordinatesPlot(
            title="levers -> peak memory and throughput",
            columns=[wr.ParallelCoordinatesPlotColumn(metric=wr.Config(lv)) for lv in LEVER_NAMES]
            + [
                wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric("peak_memory_gib")),
                wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(objective)),
            ],
        ),
        wr.RunComparer(diff_only="split"),
        wr.LinePlot(title="mean reward per step", x="Step", y=["reward"]),
        wr.LinePlot(title="reward per reward function", x="Step", y=per_fn or ["reward"]),
        wr.LinePlot(title="tokens/s per step", x="Step", y=["tokens_per_s"]),
        wr.LinePlot(title="peak memory per step (GiB)", x="Step", y=["peak_memory_gib"]),
        wr.ParameterImportancePlot(with_respect_to=objective),
    ]
    ranked = finalists(trials)
    best = ranked[0].item if ranked else None
    intro = f"{len(trials)} trials of grpo-sweep, W&B group `{group}`. " if group else f"{len(trials)} trials. "
    intro += f"Best feasible: {best.name} ({objective} {ranked[0].median:.1f})." if best else "No feasible trial."
    blocks = [wr.P(intro)]
    if best is not None:
        blocks.append(wr.CodeBlock(code=[overrides(best)], language="markdown"))
    blocks.append(wr.PanelGrid(runsets=[runset], panels=panels))
    return wr.Report(project=project, entity=entity, title=title[:128], description=intro, blocks=blocks)


def report_spec(report) -> dict:
    """The report's view spec as W&B stores it (what `publish` sends)."""
    return json.loads(report._to_model().model_dump_json(by_alias=True, exclude_none=True))


def _project_entity(trials: list[Trial], project: str | None, entity: str | None) -> tuple[str, str]:
    """The W&B project and entity: as given, else the trials' `logger` config, else the defaults.

    Args:
        trials: The study's trials.
        project: The project given, or None.
        entity: The entity given, or None.

    Returns:
        (project, entity).
    """
    logger = next((t.config.get("logger") for t in trials if t.config.get("logger")), {}) or {}
    return project or logger.get("project") or "grpo-sweep", entity or logger.get("entity") or ""


def build_and_save(
    trials: list[Trial], out: Path, *, group: str | None, title: str, project: str | None = None, entity: str | None = None
) -> Path | str:
    """Save online when W&B credentials are configured; otherwise (or on failure) write the spec.

    Args:
        trials: The study's trials.
        out: The folder the spec is written into when nothing is saved online.
        group: The W&B group the trials were logged under.
        title: The report's title.
        project: The W&B project; None: the trials' logger config.
        entity: The W&B entity; None: the trials' logger config.

    Returns:
        The report's URL, or the spec file's path.
    """
    project, entity = _project_entity(trials, project, entity)
    mode, why = wandb_mode("auto")
    report = build_report(trials, group=group, title=title, project=project, entity=entity)
    if mode == "online":
        try:
            if not report.entity:
                import wandb

                report.entity = wandb.Api().default_entity
            report.save()
            print(f"W&B report: {report.url}")
            return report.url
        except Exception as exc:  # noqa: BLE001 - the HTML report is already written; keep the spec
            print(f"W&B report: saving failed ({type(exc).__name__}: {redact(str(exc))[:200]}); writing the spec instead")
            why = "saving failed"
    path = Path(out) / SPEC_FILE
    path.write_text(
        json.dumps({"group": group, "project": project, "entity": entity, "viewspec": report_spec(report)}, indent=1) + "\n"
    )
    print(
        f"W&B report spec: {path} (not published: {why})\n"
        f"  publish it where W&B is reachable: wandb login && grpo-sweep report --publish {path}\n"
        f"  (first upload the trials' offline runs: wandb sync <run_dir>/wandb/offline-run-*)"
    )
    return path


def load_spec(path: Path):
    """A Report object from a spec file written by build_and_save (offline; nothing is sent)."""
    wr = _workspaces()
    from wandb_workspaces.reports.v2 import internal

    data = json.loads(Path(path).read_text())
    return wr.Report._from_model(internal.ReportViewspec.model_validate(data["viewspec"]))


def publish(path: Path, entity: str | None = None) -> int:
    report = load_spec(path)
    if entity:
        report.entity = entity
    if not report.entity:
        import wandb

        report.entity = wandb.Api().default_entity
    report.save()
    print(f"W&B report: {report.url}")
    return 0
