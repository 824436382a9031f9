"""Hydra's Sweeper interface over the sweep's parts, like Hydra's own Optuna plugin: a thin shell.

`setup` takes what Hydra hands over (its context, the master config, the launcher); `sweep` builds
the frozen plan (plan.py) before the storage opens (with hydra.sweeper.plan_only it prints the
plan's forecast, preview.py, and stops there), opens the study (opening.py), teaches the
pre-screen what a resumed study measured (prescreen.py), queues the start points (start.py) and
runs the loop (loop.py), which writes the report at its end.
"""

from __future__ import annotations

import datetime
import errno
import logging
import warnings
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from grpo_sweep.credentials import mask_url as mask
from grpo_sweep.study.storage import StorageError, StorageUnavailable

from . import identity, preview
from .config import SweepError
from .launch_config import mask_storage_in, slurm_resources
from .loop import Loop
from .opening import open_study
from .plan import Composer, build_plan, storage_url
from .prescreen import Prescreen
from .progress import Progress, counts
from .start import enqueue_start

log = logging.getLogger(__name__)

# Where writing is refused (a read-only file system, permissions) or room is gone: said in one line.
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


class GrpoOptunaSweeper(Sweeper):
    def __init__(self, **conf: Any) -> None:
        self.conf = OmegaConf.create(conf)  # hydra.sweeper (config.GrpoOptunaSweeperConf)
        self.hydra_context: HydraContext | None = None  # the rest: Hydra's, handed over in setup
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None
        self.sweep_dir: Path | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep Hydra's context and config, and build the launcher.

        Args:
            hydra_context: Hydra's context.
            task_function: The job's function.
            config: The sweep's master config.
        """
        self.hydra_context, self.config = hydra_context, config
        self.sweep_dir = Path(config.hydra.sweep.dir).absolute()
        mask_storage_in(config, storage_url(self.conf, self.sweep_dir))
        slurm_resources(config)
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> dict:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # Optuna's study.ask warns on every trial of an RDB storage with a heartbeat that the heartbeat is
        # meant for Study.optimize. We ask/tell ourselves and beat ourselves (workers.Heartbeat): silenced
        # here, once, for that one message.
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        # Hydra calls setup before sweep (as its own Optuna sweeper asserts).
        assert self.hydra_context is not None and self.config is not None and self.launcher is not None
        compose = Composer(self.hydra_context, self.config)
        try:
            plan = build_plan(self.conf, self.config, arguments, compose)  # bad input stops here: one line
            if plan.settings.plan_only:  # `grpo-sweep plan`: the forecast, before the storage opens; no trial
                return preview.run(plan, compose)
            plan.sweep_dir.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(self.config, plan.sweep_dir / "multirun.yaml")
            try:
                study = open_study(plan, self.config.task)
            except StorageUnavailable:
                raise
            except (StorageError, identity.StudyMismatch) as err:  # cannot connect, a missing folder, another search
                raise SweepError(str(err)) from None
            progress = Progress(plan.n_trials, datetime.datetime.now())
            progress.start(counts(study)[0])
            log.info(
                "Study %r in %s: %s %s, %d trials, sampler %s, search space %s",
                study.study_name,
                mask(plan.storage_url),
                plan.settings.direction,
                plan.objective,
                plan.n_trials,
                plan.settings.sampler,
                ", ".join(plan.distributions) or "(empty)",
            )
            prescreen = Prescreen(plan.settings)
            prescreen.learn(study)  # a resumed study's measured trials calibrate the pre-screen from the start
            forecasts = enqueue_start(study, plan, prescreen, compose)
            return Loop(study, plan, prescreen, self.launcher, compose, progress, forecasts).run()
        except StorageUnavailable as err:  # retried for storage_retry_s already: one line, no traceback
            raise SweepError(f"Sweep stopped: {err}") from None
        except OSError as err:  # the sweep directory or its journal cannot be written: one line
            if err.errno not in UNWRITABLE:
                raise
            raise SweepError(
                f"Sweep stopped: {err.filename or self.sweep_dir} cannot be written ({err.strerror}); give hydra.sweep.dir "
                "(and a journal storage's file) a place this user can write. What the study holds is kept; the same "
                "command resumes it"
            ) from None
