"""`python -m grpo_sweep [overrides]` (and the repository's `train.py`): one real GRPO trial, or
many with `-m`. Thin on purpose: Hydra composes the packaged conf/ (plus any directory on
`hydra.searchpath`), the config is checked here before anything loads, a child process runs the
trial, and the objective goes back to Hydra's sweeper (NaN when the trial did not finish). A single
run whose trial failed or timed out exits 1.
"""

from __future__ import annotations

import math
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from ..config.local import validate_here
from ..config.schema import ConfigError, register
from ..config.trl_config import expand
from ..memory.vllm import check_kv_cache_bytes
from ..study.attrs import Status
from ..trial.parent import run_trial

register()
# A single run that ends so exits 1; an OOM is a measurement (the trial's answer: it does not fit), and
# exits 0 like a trial that finished.
FAILED = (Status.FAILED, Status.TIMEOUT)


def main() -> None:
    """train.py's entry point: a `trl_config=my.yaml` argument read as its overrides, then the Hydra app."""
    try:
        sys.argv = [sys.argv[0], *expand(sys.argv[1:])]
    except ConfigError as err:
        raise SystemExit(f"Invalid configuration: {err}") from None
    app()


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def app(cfg: DictConfig) -> float:
    try:
        validate_here(cfg)
        check_kv_cache_bytes(cfg)  # the model's numbers against the KV bytes: known before loading
    except ConfigError as err:
        raise SystemExit(f"Invalid configuration: {err}") from None
    single = HydraConfig.get().mode == RunMode.RUN
    try:
        record = run_trial(cfg, HydraConfig.get().runtime.output_dir)
    except KeyboardInterrupt:
        if not single:
            raise  # a multirun's own handling (the sweeper records and re-enqueues)
        # run_trial stopped the trial and its record says so: one line, no traceback
        print(f"Interrupted: the trial was stopped; {HydraConfig.get().runtime.output_dir}/metrics.json says so", file=sys.stderr)
        raise SystemExit(130) from None  # 128 + SIGINT, as a shell reports an interrupted command
    if single and record["status"] in FAILED:
        raise SystemExit(1)  # one run: its failure is the command's (a multirun's sweeper judges each trial)
    value = record.get(cfg.objective)
    return float(value) if record["status"] == Status.OK and value is not None else math.nan
