"""Run one real GRPO trial (or many with -m): `python train.py [overrides]`.

Thin on purpose: Hydra composes conf/, the schema validates it, a child process runs the trial,
and the objective (tokens/s by default; NaN when the trial did not finish) goes back to Hydra's
sweeper. Everything else lives in src/grpo_sweep/.
"""

import math

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from grpo_sweep.schema import ConfigError, register, validate
from grpo_sweep.trial import run_trial

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    try:
        validate(cfg)
    except ConfigError as err:
        raise SystemExit(f"Invalid configuration: {err}") from None
    record = run_trial(cfg, HydraConfig.get().runtime.output_dir)
    value = record.get(cfg.objective)
    return float(value) if record["status"] == "ok" and value is not None else math.nan


if __name__ == "__main__":
    main()
