"""Reward functions: the user's, imported as `trl grpo --reward_funcs` imports them, and a clock
around every one (the task's own too).

Each function keeps its `__name__` (TRL logs `rewards/<name>/mean` by it). One that raises fails the
trial with `RewardFunctionError` naming the function and its exception: not an OOM (the worker's
`is_oom` never matches it), so the sweeper's systematic-failure stop ends a sweep whose reward
always raises with that reason. The clock sums the seconds spent in reward functions per optimiser
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


class RewardClock(TrainerCallback):
    """Times every reward call; per optimiser step, the seconds summed over all reward functions."""

    def __init__(self):
        self.current = 0.0
        self.per_step: list[float] = []

    def wrap(self, func: Callable, label: str) -> Callable:
        clock = self

        def failed(err: Exception) -> RewardFunctionError:
            return RewardFunctionError(f"reward function {label} raised {type(err).__name__}: {err}")

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def timed_async(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return await func(*args, **kwargs)
                except Exception as err:  # noqa: BLE001
                    raise failed(err) from err
                finally:
                    clock.current += time.perf_counter() - started

            return timed_async

        @functools.wraps(func)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return func(*args, **kwargs)
            except Exception as err:  # noqa: BLE001
                raise failed(err) from err
            finally:
                clock.current += time.perf_counter() - started

        return timed

    def on_step_end(self, args, state, control, **kwargs):
        self.per_step.append(self.current)
        self.current = 0.0

    def seconds_per_step(self) -> float | None:
        """Median over the steps after the first (warm-up), as the throughput is taken."""
        steady = self.per_step[1:] or self.per_step
        return statistics.median(steady) if steady else None


def reward_functions(names: list[str], defaults: tuple, clock: RewardClock) -> list[Callable]:
    """The functions a trial passes to GRPOTrainer: the user's when `names`, else the task's own."""
    if names:
        return [clock.wrap(import_reward(n), reward_path(n)) for n in names]
    return [clock.wrap(f, f"{f.__module__}.{f.__name__}") for f in defaults]
