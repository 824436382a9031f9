"""Compose the train config from Hydra overrides outside train.py (for `estimate`, `doctor`, ...)."""

from __future__ import annotations

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def compose_train_config(overrides: list[str] | None = None, conf_dir: Path | None = None):
    """The same config `python train.py OVERRIDES` would run, without starting a job."""
    from hydra import compose, initialize_config_dir

    from .schema import register

    register()
    with initialize_config_dir(config_dir=str(conf_dir or CONF_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides or []))
