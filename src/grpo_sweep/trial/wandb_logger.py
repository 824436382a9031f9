"""One Weights & Biases run per trial, written from the child worker (`logger=wandb`).

Why in the child: that is where the per-step rows are measured (StepMeter's `on_step` hook) and
where the final record is assembled, so the W&B run holds exactly what metrics.json holds. W&B is
a convenience, never a dependency of the result: every call here is guarded, an online failure
falls back to offline files under the run directory, and metrics.json is written before the
run is finished, so a slow or broken network can never cost a measured trial.

The Hydra run directory and the W&B run point to each other: the W&B config carries
`grpo_sweep.run_dir`, and metrics.json gets `wandb_run_id`, `wandb_dir`, `wandb_path`, `wandb_mode`,
`wandb_group` (and `wandb_url` when online).
"""

from __future__ import annotations

import contextlib
import math
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..config.split import split_of
from ..credentials import redact, wandb_mode
from ..study.attrs import Status
from ..units import GIB

FINISH_TIMEOUT_S = 60.0  # after this W&B stops uploading; the data stays on disk for `wandb sync`
HISTORY_SKIP = ("step",)  # the step is W&B's own x-axis


def _say(text: str) -> None:
    print(f"[wandb] {text}", flush=True)


def sweep_dir_of(run_dir: Path) -> Path | None:
    """The Hydra multirun directory holding this trial (Hydra writes multirun.yaml there)."""
    for parent in list(Path(run_dir).resolve().parents)[:3]:
        if (parent / "multirun.yaml").exists():
            return parent
    return None


def _short_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def run_group(cfg: Any, run_dir: Path) -> str | None:
    """logger.group, else the Optuna study, else the multirun directory; None for a lone run."""
    if cfg.logger.get("group"):
        return str(cfg.logger.group)
    if cfg.trial.get("study"):
        return str(cfg.trial.study)
    sweep = sweep_dir_of(run_dir)
    return _short_path(sweep)[-128:] if sweep is not None else None


def run_name(cfg: Any) -> str:
    """A name a person can read in the runs table: the levers, and the Optuna trial number."""
    batch, accum = split_of(cfg)
    parts = [
        f"seq{cfg.max_seq_length}",
        f"util{cfg.gpu_memory_utilization:g}",
        f"b{batch}x{accum}",
        f"g{cfg.num_generations}",
        f"r{cfg.lora_rank}",
    ]
    if cfg.load_in_4bit:
        parts.append("4bit")
    number = cfg.trial.get("number")
    return (f"t{number}-" if number is not None else "") + "-".join(parts)


def run_config(cfg: Any, run_dir: Path, record: dict) -> dict:
    """The resolved config (levers top-level, model/gpu/backend groups) plus where and how it ran.

    Args:
        cfg: The composed train config.
        run_dir: The trial's folder.
        record: The trial's record.

    Returns:
        The W&B run's config.
    """
    from omegaconf import DictConfig, OmegaConf

    config = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    versions = dict(record.get("versions") or {})
    versions["python"] = sys.version.split()[0]
    try:
        import wandb

        versions["wandb"] = wandb.__version__
    except ImportError:  # pragma: no cover - wandb is a dependency
        pass
    config["grpo_sweep"] = {
        "run_dir": str(Path(run_dir).resolve()),
        "backend": record.get("backend"),  # resolved (backend.name may say auto)
        "device": record.get("device"),
        "trial_number": cfg.trial.get("number"),
        "study": cfg.trial.get("study"),
        "versions": versions,
    }
    return config


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _gib(value) -> float | None:
    return value / GIB if _number(value) else None


def step_metrics(row: dict) -> dict:
    """A StepMeter row as W&B history: every number it has, plus GiB and CUDA allocator gauges."""
    flat = {}
    for key, value in row.items():  # one level of nesting (e.g. a memory breakdown) as "key/sub"
        if isinstance(value, dict):
            flat.update({f"{key}/{sub}": v for sub, v in value.items()})
        else:
            flat[key] = value
    data = {k: v for k, v in flat.items() if k not in HISTORY_SKIP and (_number(v) or isinstance(v, bool))}
    if _number(row.get("peak_memory_bytes")):
        data["peak_memory_gib"] = _gib(row["peak_memory_bytes"])
    with contextlib.suppress(Exception):  # gauges are extras; never fail a step for them
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            free, total = torch.cuda.mem_get_info()
            data.update(
                {
                    "memory/allocated_bytes": torch.cuda.memory_allocated(),
                    "memory/reserved_bytes": torch.cuda.memory_reserved(),
                    "memory/max_allocated_bytes": torch.cuda.max_memory_allocated(),
                    "memory/max_reserved_bytes": torch.cuda.max_memory_reserved(),
                    "memory/driver_used_bytes": total - free,  # includes vLLM and other processes' memory
                }
            )
    return data


def summary_metrics(record: dict, objective: str) -> dict:
    """The final record as W&B summary: status, objective, memory (measured, predicted, budget,
    OOM phase and deficit when the memory modules add them) and requested vs effective levers."""
    # A Status is a StrEnum; W&B writes an Enum by its name ("OK"), so each goes as its string ("ok").
    out = {
        k: str(v) if isinstance(v, StrEnum) else v for k, v in record.items() if k not in ("history", "levers") and v is not None
    }
    if isinstance(out.get("error"), str):
        out["error"] = out["error"][:2000]
    value = record.get(objective)
    out["objective_name"] = objective
    out["objective"] = value if record.get("status") == Status.OK and _number(value) else None
    for key in ("peak_memory_bytes", "predicted_peak_bytes", "budget_bytes", "deficit_bytes", "requested_bytes"):
        if _number(record.get(key)):
            out[key.replace("_bytes", "_gib")] = _gib(record[key])
    measured, predicted = record.get("peak_memory_bytes"), record.get("predicted_peak_bytes")
    if _number(measured) and _number(predicted) and measured > 0:
        out["predicted_error_pct"] = 100.0 * (predicted - measured) / measured
    requested, effective = record.get("levers") or {}, record.get("effective") or {}
    out["requested"], out["effective"] = requested, effective  # (lever_mismatch, when recorded, too)
    return {k: v for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}


class NullLogger:
    """logger=none, or W&B could not start at all: the trial runs exactly as without a logger."""

    def log_step(self, row: dict) -> None:
        pass

    def finish(self, record: dict) -> bool:
        return False


class WandbTrialLogger:
    """A live W&B run. Every method swallows W&B errors (reporting them once) and never raises."""

    def __init__(self, run, mode: str, objective: str):
        """A logger over an open W&B run.

        Args:
            run: The W&B run.
            mode: "online" or "offline".
            objective: The objective's metric name.
        """
        self.run, self.mode, self.objective = run, mode, objective
        self._broken = False

    def _failed(self, what: str, exc: BaseException) -> None:
        if not self._broken:
            _say(f"{what} failed ({type(exc).__name__}: {redact(str(exc))[:300]}); the trial goes on")
        self._broken = True

    def log_step(self, row: dict) -> None:
        if self._broken:
            return
        try:
            self.run.log(step_metrics(row), step=int(row["step"]))
        except Exception as exc:  # noqa: BLE001
            self._failed("logging a step to W&B", exc)

    def finish(self, record: dict) -> bool:
        """End the run (failed unless the trial is ok; the error in its summary). True when it was
        closed cleanly (metrics.json `wandb_finished`)."""
        import wandb

        sync_dir = None
        try:
            sync_dir = self.run.settings.sync_dir
            self.run.summary.update(summary_metrics(record, self.objective))
            status = str(record.get("status") or "unknown")
            self.run.tags = tuple(dict.fromkeys([*self.run.tags, status]))
            self.run.finish(exit_code=0 if status in (Status.OK, Status.SLOW) else 1)  # slow: stopped early, not a failure
        except Exception as exc:  # noqa: BLE001
            self._failed("finishing the W&B run", exc)
        with contextlib.suppress(Exception):
            wandb.teardown()  # the worker leaves through os._exit, which skips wandb's atexit hook
        if self.mode == "online" and not self._broken:
            with contextlib.suppress(Exception):
                _say(f"run: {self.run.url}")
        elif sync_dir is not None:
            _say(f"offline run saved in {sync_dir}\n[wandb] upload it with: wandb sync {sync_dir}")
        return not self._broken


def _init(cfg: Any, run_dir: Path, record: dict, mode: str, run_id: str | None = None):
    """`wandb.init` for this trial: its group, name, config and folder; resume `run_id` when given.

    Args:
        cfg: The composed train config.
        run_dir: The trial's folder.
        record: The trial's record.
        mode: "online" or "offline".
        run_id: A run to resume, or None.

    Returns:
        The W&B run.
    """
    import wandb

    settings = wandb.Settings(
        console="off",  # trial.log already has the console; wandb's stdout hooks would fight our tee
        silent=True,  # we print our own one-line status instead of wandb's banner
        init_timeout=float(cfg.logger.get("init_timeout_s", 30.0)),  # not wandb's 90 s
        finish_timeout=FINISH_TIMEOUT_S,
    )
    tags = [str(t) for t in cfg.logger.get("tags") or []]
    tags += [f"model:{cfg.model.name}", f"gpu:{cfg.gpu.name}", f"backend:{record.get('backend')}"]
    return wandb.init(
        project=cfg.logger.project,
        entity=cfg.logger.get("entity") or None,
        group=run_group(cfg, run_dir),
        job_type="trial",
        name=run_name(cfg),
        config=run_config(cfg, run_dir, record),
        tags=tags,
        dir=str(run_dir),
        mode=mode,
        settings=settings,
        id=run_id,
        resume="allow" if run_id else None,
    )


def open_logger(cfg: Any, run_dir: Path, record: dict):
    """Start this trial's logger. Records where the W&B run lives in `record` (metrics.json).

    Args:
        cfg: The composed train config.
        run_dir: The trial's folder.
        record: The trial's record, updated in place.

    Returns:
        The logger (a no-op one unless logger=wandb).
    """
    if cfg.logger.name != "wandb":
        return NullLogger()
    try:
        return _open(cfg, run_dir, record)
    except Exception as exc:  # noqa: BLE001 - whatever goes wrong in W&B, the trial runs on
        _say(f"could not start ({type(exc).__name__}: {redact(str(exc))[:300]}); no W&B run")
        record["wandb_error"] = redact(f"{type(exc).__name__}: {exc}")[:500]
        return NullLogger()


def _open(cfg: Any, run_dir: Path, record: dict):
    """The W&B logger in the mode logger.mode and the credentials allow; a failed online start logs offline.

    Args:
        cfg: The composed train config.
        run_dir: The trial's folder.
        record: The trial's record, updated in place.

    Returns:
        The logger.
    """
    run_dir = Path(run_dir)
    mode, why = wandb_mode(cfg.logger.get("mode", "auto"))
    if mode == "disabled":
        _say(f"disabled ({why})")
        return NullLogger()
    if mode == "online":
        try:
            return _attach(_init(cfg, run_dir, record, "online"), "online", why, cfg, record)
        except Exception as exc:  # noqa: BLE001 - network, auth, server: fall back to offline files
            _say(f"online logging failed ({type(exc).__name__}: {redact(str(exc))[:300]}); logging offline instead")
            record["wandb_error"] = redact(f"{type(exc).__name__}: {exc}")[:500]
            with contextlib.suppress(Exception):
                import wandb

                wandb.teardown()
            why = "fallback after an online failure"
    return _attach(_init(cfg, run_dir, record, "offline"), "offline", why, cfg, record)


def _attach(run, mode: str, why: str, cfg: Any, record: dict):
    """Record where the W&B run lives in `record` and wrap the run in a logger.

    Args:
        run: The W&B run.
        mode: "online" or "offline".
        why: Why that mode, for the record.
        cfg: The composed train config.
        record: The trial's record, updated in place.

    Returns:
        The logger.
    """
    record.update(
        wandb_run_id=run.id,
        wandb_dir=str(run.settings.sync_dir),
        wandb_path="/".join(p for p in (run.entity, run.project, run.id) if p),
        wandb_mode=mode,
        wandb_group=run.group or None,
    )
    if mode == "online":
        record["wandb_url"] = run.url
    _say(f"{mode} run {run.id} ({why}), group {run.group or '-'}")
    return WandbTrialLogger(run, mode, cfg.objective)


def close_unfinished(run_dir: str | Path) -> str | None:
    """Close the offline W&B run of a trial killed before it could (SIGKILL from outside).

    W&B 0.31's service process, when the trial dies under it, shuts down without flushing the run's
    transaction log (its .wandb file keeps only its header). So the run is closed from outside, in
    a fresh process (the parent calls this through `python -c`): the same run id, resumed offline in
    the trial's directory, its config and summary from config.yaml and metrics.json, finished as
    failed with the reason. Returns the closed run's directory, None when there is nothing to close."""
    from omegaconf import OmegaConf

    from ..metrics import read_metrics

    run_dir = Path(run_dir)
    record = dict(read_metrics(run_dir) or {})
    runs = sorted(p for p in (run_dir / "wandb").glob("offline-run-*") if p.is_dir() and not p.is_symlink())
    if not runs or record.get("wandb_finished") or not (run_dir / "config.yaml").exists():
        return None
    cfg = OmegaConf.load(run_dir / "config.yaml")
    run_id = runs[-1].name.rsplit("-", 1)[1]
    run = _init(cfg, run_dir, record, "offline", run_id=run_id)
    sync_dir = str(run.settings.sync_dir)
    return sync_dir if WandbTrialLogger(run, "offline", cfg.objective).finish(record) else None
