"""The config train.py would see for a list of overrides, composed once per test process."""

from __future__ import annotations

import copy

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
