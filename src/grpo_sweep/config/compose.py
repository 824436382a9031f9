"""Compose the train config from Hydra overrides outside a Hydra app (for `estimate`, `doctor`, ...).

The configs ship inside the package (`grpo_sweep/conf/`), so a plain `pip install grpo-sweep`
finds them from any directory. A user adds their own groups without editing the package through
Hydra's search path, exactly as with `python -m grpo_sweep`:
`grpo-sweep estimate hydra.searchpath=[file:///my/conf] model=my_model`.
"""

from __future__ import annotations

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
CONFIG_NAME = "train"


def compose_train_config(overrides: list[str] | None = None, conf_dir: Path | None = None):
    """The same config `python -m grpo_sweep OVERRIDES` would run, without starting a job."""
    from hydra import compose, initialize_config_dir

    from .schema import register

    register()
    with initialize_config_dir(config_dir=str(conf_dir or CONF_DIR), version_base="1.3"):
        return compose(CONFIG_NAME, overrides=list(overrides or []))


def config_groups(overrides: list[str] | None = None, conf_dir: Path | None = None) -> set[str]:
    """The config groups composing OVERRIDES chose from (`hydra.runtime.choices`: model, gpu, lora, ...,
    hydra/launcher), for splitting a point's overrides into groups and values (the sweeper's frontier)."""
    from hydra import compose, initialize_config_dir

    from .schema import register

    register()
    with initialize_config_dir(config_dir=str(conf_dir or CONF_DIR), version_base="1.3"):
        cfg = compose(CONFIG_NAME, overrides=list(overrides or []), return_hydra_config=True)
    return set(cfg.hydra.runtime.choices)
