"""Reward functions: the user's, imported as `trl grpo --reward_funcs` imports them, and a clock
around every one (the task's own too).

Each function keeps its `__name__` (TRL logs `rewards/<name>/mean` by it). One that raises, or
whose first return value is not one finite number per completion (`bad_return`), fails the trial
with `RewardFunctionError` naming the function and what it raised or returned: not an OOM (the
worker's `is_oom` never matches it), so the sweeper's systematic-failure stop ends a sweep whose
reward always fails with that reason. The clock sums the seconds spent in reward functions per optimiser
step (`reward_seconds_per_step` in metrics.json).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import statistics
import sys
import time
from collections.abc import Callable

from transformers import TrainerCallback

from ...config.schema import ConfigError
from ...config.user_task import reward_path


class RewardFunctionError(Exception):
    """A reward function raised during a trial (deliberately not a RuntimeError: never an OOM)."""


def import_reward(name: str) -> Callable:
    """One `task.reward_funcs` entry -> the function (TRL's built-in names, or module.function
    with the current directory on sys.path first, as trl/scripts/grpo.py does)."""
    path = reward_path(name)
    module_name, _, attr = path.rpartition(".")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - whatever the import raised, named
        raise ConfigError(f"task.reward_funcs: {name!r}: importing {module_name} failed: {type(err).__name__}: {err}") from None
    func = getattr(module, attr, None)
    if not callable(func):
        raise ConfigError(f"task.reward_funcs: {name!r}: {module_name} has no function {attr!r}")
    return func


def bad_return(value, completions) -> str | None:
    """What is wrong with a reward function's return value for `completions`, or None when it is what
    TRL takes: a list with one finite number per completion (None for a completion the function does
    not score, as TRL allows, but not for every one)."""
    import math
    import numbers

    if not isinstance(value, (list, tuple)):
        return f"{type(value).__name__} {_short(value)} (a list with one number per completion is needed)"
    n = len(completions) if completions is not None else len(value)
    if len(value) != n:
        return f"{len(value)} values for {n} completions"
    for i, v in enumerate(value):
        if v is None:
            continue
        if not isinstance(v, numbers.Real):  # bool is one (TRL reads True as 1.0)
            return f"{type(v).__name__} {_short(v)} at index {i} (each value must be a number)"
        if not math.isfinite(float(v)):
            return f"{v} at index {i} (each value must be finite)"
    if n and all(v is None for v in value):
        return f"None for all {n} completions"
    return None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class RewardClock(TrainerCallback):
    """Times every reward call; per optimiser step, the seconds summed over all reward functions."""

    def __init__(self):
        self.current = 0.0
        self.per_step: list[float] = []

    def wrap(self, func: Callable, label: str) -> Callable:
        clock = self

        def failed(err: Exception) -> RewardFunctionError:
            return RewardFunctionError(f"reward function {label} raised {type(err).__name__}: {err}")

        checked = [False]  # the return value is checked on the first call: a bad one fails the trial by name

        def check(value, kwargs):
            if not checked[0]:
                wrong = bad_return(value, kwargs.get("completions"))
                if wrong is not None:
                    raise RewardFunctionError(f"reward function {label} returned {wrong}")
                checked[0] = True
            return value

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def timed_async(*args, **kwargs):
                started = time.perf_counter()
                try:
                    value = await func(*args, **kwargs)
                except Exception as err:  # noqa: BLE001
                    raise failed(err) from err
                finally:
                    clock.current += time.perf_counter() - started
                return check(value, kwargs)

            return timed_async

        @functools.wraps(func)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                value = func(*args, **kwargs)
            except Exception as err:  # noqa: BLE001
                raise failed(err) from err
            finally:
                clock.current += time.perf_counter() - started
            return check(value, kwargs)

        return timed

    def on_step_end(self, args, state, control, **kwargs):
        self.per_step.append(self.current)
        self.current = 0.0

    def seconds_per_step(self) -> float | None:
        """Median over the steps after the first (warm-up), as the throughput is taken."""
        steady = self.per_step[1:] or self.per_step
        return statistics.median(steady) if steady else None


def reward_functions(names: list[str], defaults: tuple, clock: RewardClock) -> list[Callable]:
    """The functions a trial passes to GRPOTrainer: the user's when `names`, else the task's own.

    Args:
        names: The user's task.reward_funcs entries (TRL's built-in names, or module.function).
        defaults: The task's own reward functions.
        clock: Times each call per step.

    Returns:
        The functions, each timed.
    """
    if names:
        return [clock.wrap(import_reward(n), reward_path(n)) for n in names]
    return [clock.wrap(f, f"{f.__module__}.{f.__name__}") for f in defaults]
