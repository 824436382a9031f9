"""The config train.py would see for a list of overrides, composed once per test process."""

from __future__ import annotations

import copy
from pathlib import Path

_COMPOSED: dict[tuple[str, ...], object] = {}


def compose(overrides: list[str] | None = None):
    """The config train.py would see for these overrides (Hydra's compose API, same conf/).

    Composed once per test process and overrides, then copied: Hydra re-reads and re-parses every
    YAML file on each compose (~0.1-0.3 s on 2 cores), and the suite asks for the same few configs
    hundreds of times. A user search path (`hydra.searchpath=...`: files a test may write) is always
    composed afresh; tests that compare against a fresh compose call compose_train_config itself."""
    from grpo_sweep.config.compose import compose_train_config

    key = tuple(overrides or ())
    if any("searchpath" in o for o in key):
        return compose_train_config(list(key))
    if key not in _COMPOSED:
        _COMPOSED[key] = compose_train_config(list(key))
    return copy.deepcopy(_COMPOSED[key])


def default_warm_model() -> Path:
    """The default trial's warm tiny model (model.init=warm, the default task): its checkpoint directory
    in the model cache ($GRPO_SWEEP_CACHE), built here if the cache lacks it (one builder: trial/warmup.py)."""
    from grpo_sweep.trial.models import load_tokenizer, model_path
    from grpo_sweep.trial.tasks import get_task

    from .runners import FAST

    cfg = compose(FAST)
    return Path(model_path(cfg, load_tokenizer(cfg, get_task(cfg).corpus()), on_cuda=False))
