"""The space's candidates (every point, or a seeded sample), ComposeCache (their configs at one
composition per group choice), and the memory-first start (hydra.sweeper.start=memory): the first
trials are the points the estimator predicts fill the card best. (The default start, `model`,
ranks the same candidates by predicted speed: forecast.py, start.py.)

Why the memory-first start: the objective is throughput under a memory wall, and work per step (batch x sequence,
LoRA size) buys throughput with memory, so the fastest config usually sits just below the wall.
People search that way by hand (accelerate's `find_executable_batch_size` starts at the largest
batch and halves on OOM). A sampler that starts from random points spends its first trials on
small configs that cannot win; starting on the predicted frontier gives it fast, feasible
trials to learn from at once. The estimator is arithmetic (milliseconds a point), and the configs
come from ComposeCache (one Hydra composition per distinct group choice, not one per point), so
ranking a few hundred candidates costs about a second.

The picks are spread out: each differs from every earlier pick in at least half of the
parameters, so the start covers several regions of the frontier instead of one corner of it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from . import handles, space

if TYPE_CHECKING:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Override
    from omegaconf import DictConfig

    from .space import Distribution

MAX_CANDIDATES = 256  # a larger space is sampled at random down to this many points


def candidates(grid: dict[str, list], seed: int | None, cap: int = MAX_CANDIDATES) -> Iterator[dict[str, Any]]:
    """Every point of a discrete space, or `cap` of them drawn at random when it is larger."""
    names = list(grid)
    size = 1
    for choices in grid.values():
        size *= len(choices)
    if size <= cap:
        for point in itertools.product(*grid.values()):
            yield dict(zip(names, point))
        return
    rng = random.Random(seed)
    seen: set[tuple] = set()
    while len(seen) < cap:
        drawn = tuple(rng.choice(grid[n]) for n in names)
        if drawn not in seen:
            seen.add(drawn)
            yield dict(zip(names, drawn))


def space_candidates(
    distributions: dict[str, Distribution], seed: int | None, cap: int = MAX_CANDIDATES
) -> Iterator[dict[str, Any]]:
    """The points of a search space to judge: every point of a discrete space of at most `cap`,
    else `cap` distinct points drawn at random (seeded). A continuous interval is drawn from
    (space.draw) as a large discrete space is sampled; a discrete space draws as `candidates` does."""
    listed = {key: space.values(dist) for key, dist in distributions.items()}
    grid = {key: choices for key, choices in listed.items() if choices is not None}
    if len(grid) == len(listed):
        yield from candidates(grid, seed, cap)
        return
    rng = random.Random(seed)
    names = list(listed)
    seen: set[tuple] = set()
    for _ in range(cap * 20):  # bounded: a narrow interval rounds to few distinct values
        if len(seen) == cap:
            break
        point = tuple(rng.choice(grid[n]) if n in grid else space.draw(distributions[n], rng) for n in names)
        if point not in seen:
            seen.add(point)
            yield dict(zip(names, point))


def pick(fullness: list[tuple[dict[str, Any], float]], k: int, seed: int | None) -> list[dict[str, Any]]:
    """Up to k points from (params, predicted peak / allowed bytes): those predicted to fit (<= 1),
    fullest first, each differing from every earlier pick in at least half of the parameters.

    A fraction, not bytes: when the card itself is a parameter (`gpu: choice(l4_24g, a100_40g)`),
    each point is measured against its own card."""
    fitting = [(params, share) for params, share in fullness if share <= 1.0]
    random.Random(seed).shuffle(fitting)  # equal predictions: the order is the seed's, not the grid's
    fitting.sort(key=lambda item: -item[1])
    chosen: list[dict[str, Any]] = []
    for params, _ in fitting:
        if len(chosen) == k:
            break
        if all(_differences(params, other) * 2 >= len(params) for other in chosen):
            chosen.append(params)
    return chosen


def _differences(a: dict[str, Any], b: dict[str, Any]) -> int:
    return sum(a[name] != b.get(name) for name in a)


class ComposeCache:
    """Configs for many points of one space at the cost of one Hydra composition per distinct set of
    config-group choices (`lora=qv`, `gpu=l4_24g`), not one per point.

    Why it is the same config: Hydra composes in two stages (hydra/_internal/config_loader_impl.py):
    the defaults list is built from the group overrides alone (wherever they stand on the command
    line), then every other override is applied in command-line order to the composed config by
    `ConfigLoaderImpl._apply_overrides_to_config` (struct mode on: a key that does not exist raises
    ConfigCompositionException, `+key` adds, `~key` deletes). So the trailing value overrides of a
    command line can be applied later, to a deep copy of the composition of the rest, by that very
    function: same code, same order, same config, same errors. The copy is unpickled from the
    composition pickled once (OmegaConf pickles a config whole: values, flags, structured type,
    parents): a few times cheaper than copy.deepcopy, which is most of a point's cost to rank.

    `compose(overrides) -> cfg` is the real composition (plan.Composer, or
    `compose_train_config` outside a Hydra app); `is_group(key)` says whether Hydra would read `key`
    as a config group (`repo.group_exists` in Hydra). Kept on the composed side (exact by
    construction): group overrides, sweeps, `hydra.*` keys, and every override before the last of
    those that is not a group override (the order of value overrides is kept).
    """

    def __init__(self, compose: Callable[[list[str]], DictConfig], is_group: Callable[[str], bool]) -> None:
        self._compose = compose
        self._is_group = is_group
        self._bases: dict[tuple[str, ...], bytes | Exception] = {}  # composed overrides -> the config pickled, or its error
        self._parsed: dict[str, Override] = {}  # override string -> Hydra's Override (value() gives fresh values)
        self._parser: OverridesParser | None = None
        self.compositions = 0  # real compositions so far

    def split(self, overrides: list[str]) -> tuple[list[str], list[Override]]:
        """(the overrides to compose, the parsed value overrides to apply to a copy of that, in order)."""
        parsed = [(o, self._parse(o)) for o in overrides]  # each with its own line (Hydra's `input_line`)
        groups: list[str] = []
        applied: list[Override] = []
        end = len(parsed)
        while end:
            line, override = parsed[end - 1]
            kind = self._kind(override)
            if kind == "compose":
                break
            if kind == "group":
                groups.append(line)
            else:
                applied.append(override)
            end -= 1
        composed = [line for line, _ in parsed[:end]] + groups[::-1]
        return composed, applied[::-1]

    def config(self, overrides: list[str]) -> DictConfig:
        """The config `compose(overrides)` gives, or the exception it raises."""
        import pickle

        try:
            composed, applied = self.split(overrides)
        except Exception:  # noqa: BLE001 - not an override Hydra can parse: Hydra's own error, from a full composition
            composed, applied = list(overrides), []
        key = tuple(composed)
        if key not in self._bases:
            self.compositions += 1
            try:
                base_cfg = self._compose(composed)
            except Exception as err:  # noqa: BLE001 - every point with these choices fails the same way
                self._bases[key] = err
            else:
                self._bases[key] = pickle.dumps(base_cfg, protocol=pickle.HIGHEST_PROTOCOL)
        base = self._bases[key]
        if isinstance(base, Exception):
            raise base
        cfg = pickle.loads(base)
        handles.apply_overrides(applied, cfg)
        return cfg

    def _parse(self, override: str) -> Override:
        if override not in self._parsed:
            if self._parser is None:
                from hydra.core.override_parser.overrides_parser import OverridesParser

                self._parser = OverridesParser.create()
            self._parsed[override] = self._parser.parse_overrides([override])[0]
        return self._parsed[override]

    def _kind(self, override: Override) -> str:
        """ "group" (only the defaults list reads it: its place on the line does not matter), "value"
        (applied after composition: may be applied to a copy) or "compose"."""
        key = override.key_or_group
        if override.is_sweep_override() or key == "hydra" or key.startswith(("hydra.", "hydra/")):
            return "compose"
        if self._is_group(key):  # Hydra: a dict value for a group key is a value override
            return "value" if isinstance(override.value(), dict) else "group"
        return "value"
