"""What Hydra's config gives the launcher and writes beside every job, set before the first launch:
SLURM's resources for the largest trial, and the storage URL with its password masked; and the
command line's Hydra settings a single run of a trial's point needs (rerun_overrides)."""

from __future__ import annotations

import logging
from typing import cast

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from grpo_sweep.credentials import mask_url as mask
from grpo_sweep.report.trials import rerun_hydra_settings
from grpo_sweep.study.attrs import Key

from . import space

log = logging.getLogger(__name__)


def slurm_resources(config: DictConfig) -> int | None:
    """hydra/launcher=submitit_slurm asks SLURM for what a trial of N processes needs: one task per trial
    (torchrun inside the job starts the ranks) and, unless the user set hydra.launcher.gpus_per_node, as
    many GPUs as the largest trial.num_processes the sweep can run (the fixed value or its choices), plus
    backend.vllm_mode=server's own devices. submitit reads its resources once per sweep, hence the largest.
    Returns the GPUs asked for (None: not a SLURM launcher, or the user's own value stands)."""
    launcher = OmegaConf.select(config, "hydra.launcher")
    if launcher is None or not str(launcher.get("_target_", "")).endswith("SlurmLauncher"):
        return None
    if launcher.get("gpus_per_node") is not None:
        return None
    key = "trial.num_processes"
    counts = [int(OmegaConf.select(config, key, default=1) or 1)]
    entries = [f"{k}={v}" for k, v in (OmegaConf.select(config, "hydra.sweeper.params") or {}).items() if k == key]
    entries += [o for o in (OmegaConf.select(config, "hydra.overrides.task") or []) if o.split("=", 1)[0] == key]
    for entry in entries:
        dists, fixed = space.parse_space([entry])
        counts += [int(v) for d in dists.values() for v in space.grid_choices({key: d})[key]]
        counts += [int(f.split("=", 1)[1]) for f in fixed.values()]
    gpus = max(counts)
    if OmegaConf.select(config, "backend.vllm_mode", default="colocate") == "server":
        gpus += len(OmegaConf.select(config, "trial.vllm_devices", default=None) or [])
    with read_write(config), open_dict(config):
        config.hydra.launcher.gpus_per_node = gpus
        config.hydra.launcher.tasks_per_node = 1
    log.info(
        "SLURM: %d GPU(s) per trial job (the largest trial.num_processes%s)",
        gpus,
        " + the vLLM server's" if gpus > max(counts) else "",
    )
    return gpus


# Trial user attr: rerun_overrides, recorded so the command that reruns the trial carries them.
HYDRA_OVERRIDES_ATTR = Key.HYDRA_OVERRIDES


def rerun_overrides(config: DictConfig) -> list[str]:
    """The command line's Hydra settings a single run of a trial's point needs (hydra.searchpath, the
    job's logging, ...): report.trials.rerun_hydra_settings of hydra.overrides.hydra."""
    return rerun_hydra_settings(list(OmegaConf.select(config, "hydra.overrides.hydra") or []))


def mask_storage_in(config: DictConfig, url: str) -> None:
    """Keep a storage password out of every config Hydra writes (job .hydra/hydra.yaml, multirun.yaml).

    Jobs never open the storage (only this sweeper does), so they can carry the masked URL.
    """
    masked = mask(url)
    if masked == url:
        return
    with read_write(config), open_dict(config):
        # to_container of a DictConfig is a dict (OmegaConf types it as any container)
        raw = cast(dict, OmegaConf.to_container(config.hydra.sweeper, resolve=False)).get("storage")
        if raw is not None and "${" not in str(raw):
            config.hydra.sweeper.storage = masked
        config.hydra.overrides.hydra = [
            mask(o) if o.split("=", 1)[0].lstrip("+~") == "hydra.sweeper.storage" else o for o in config.hydra.overrides.hydra
        ]
