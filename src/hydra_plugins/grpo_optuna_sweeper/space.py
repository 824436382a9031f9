"""Hydra override grammar <-> Optuna distributions, and trial parameters back to override strings.

The search space is written the way Hydra users already write sweeps (`choice`, `range`,
`interval`, `int(interval(...))`, `tag(log, interval(...))`), over levers (`lora_rank`) and config
groups alike (`lora: choice(qv, all_linear)`): a group choice is just a categorical whose value
becomes `lora=qv` on the job's command line.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

from . import handles

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    # The distributions a space holds: parse_space builds only these three.
    Distribution: TypeAlias = CategoricalDistribution | IntDistribution | FloatDistribution


def parse_space(
    arguments: list[str], is_integer: Callable[[str], bool] | None = None
) -> tuple[dict[str, Distribution], dict[str, str]]:
    """Split overrides into Optuna distributions (sweeps) and fixed overrides ({key: "key=value"}).

    is_integer(key): whether the lever at `key` is an integer; Hydra parses `interval(64, 256)` as
    floats, so an interval over an integer lever with whole ends becomes an integer distribution.
    A range Optuna refuses (low > high, a log range from 0) is a ValueError naming the parameter."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    distributions: dict[str, Distribution] = {}
    fixed: dict[str, str] = {}
    # Each override with its own line (what Hydra keeps as `input_line`).
    for line, override in zip(arguments, OverridesParser.create().parse_overrides(arguments)):
        key = override.get_key_element()
        if not override.is_sweep_override():
            fixed[key] = line  # the whole `key=value` (keeps `+`, `~`)
            continue
        try:
            distributions[key] = _distribution(override, key, is_integer)
        except ValueError as err:
            raise ValueError(f"hydra.sweeper.params {line}: {err}") from None
    overlap = set(distributions) & set(fixed)
    for key in overlap:  # a fixed value on the command line wins over the sweep file's range
        del distributions[key]
    return distributions, fixed


def _distribution(override: Override, key: str, is_integer: Callable[[str], bool] | None) -> Distribution:
    """The Optuna distribution of one sweep override.

    Args:
        override: The parsed override.
        key: Its key.
        is_integer: is_integer(key) -> whether the lever at `key` is an integer (a whole-number interval is then
            an IntDistribution); None: no lever is.

    Returns:
        The distribution.
    """
    from hydra.core.override_parser.types import Transformer
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    # A ChoiceSweep, RangeSweep or IntervalSweep: the is_*_sweep checks below say which, and Hydra's
    # value() is typed as any parsed element (its optional fields are set by the grammar on a sweep).
    value: Any = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        # `null` stays None (Hydra's encode would spell it as the string "null", which a string value
        # must not be read as); every other element as Hydra encodes it.
        raw = override.sweep_iterator(transformer=Transformer.identity)
        choices = [x if x is None else Transformer.encode(x) for x in raw]
        return CategoricalDistribution(choices)  # type: ignore[arg-type]  # encoded: str/int/float/bool/None
    if override.is_range_sweep():
        if any(isinstance(x, float) for x in (value.start, value.stop, value.step)):
            # Hydra's range excludes `stop`; Optuna's step grid includes `high`.
            high = value.stop - value.step
            return FloatDistribution(value.start, high, step=value.step)
        high = int(value.stop) - int(value.step)
        return IntDistribution(int(value.start), high, step=int(value.step))
    if override.is_interval_sweep():
        log = "log" in value.tags
        whole = all(float(x).is_integer() for x in (value.start, value.end))
        if (isinstance(value.start, int) and isinstance(value.end, int)) or (whole and is_integer and is_integer(key)):
            return IntDistribution(int(value.start), int(value.end), log=log)
        return FloatDistribution(float(value.start), float(value.end), log=log)
    raise ValueError("unsupported sweep type")


def grid_choices(distributions: dict[str, Distribution], purpose: str = "sampler=grid") -> dict[str, list]:
    """Every value of each (discrete) distribution, for Optuna's GridSampler (or `purpose`, named in
    the error: the frontier start and neighbour moves need the lists too)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    grid: dict[str, list] = {}
    for key, dist in distributions.items():
        if isinstance(dist, CategoricalDistribution):
            grid[key] = list(dist.choices)
        elif isinstance(dist, IntDistribution) and not dist.log:
            grid[key] = list(range(dist.low, dist.high + 1, dist.step))
        elif isinstance(dist, FloatDistribution) and dist.step is not None:
            n = round((dist.high - dist.low) / dist.step) + 1
            grid[key] = [dist.low + i * dist.step for i in range(n)]
        else:
            raise ValueError(
                f"hydra.sweeper.params.{key}: {purpose} needs discrete values (choice or range), not a continuous interval"
            )
    return grid


def values(dist: Distribution) -> list | None:
    """Every value of a discrete distribution (a choice, a range, an integer interval, log-scaled or
    not), or None for a continuous interval (floats with no step): it is drawn from (draw)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution):
        return list(range(dist.low, dist.high + 1, dist.step))
    if dist.step is not None:
        return grid_choices({"_": dist})["_"]
    return None


def draw(dist: Distribution, rng: random.Random) -> float:
    """One value of a continuous interval, uniform (log-uniform under tag(log)), to 3 significant
    digits within its ends: a value a user could have typed."""
    low, high = float(dist.low), float(dist.high)  # type: ignore[union-attr]  # a FloatDistribution (values() is None)
    x = math.exp(rng.uniform(math.log(low), math.log(high))) if dist.log else rng.uniform(low, high)  # type: ignore[union-attr]
    return min(high, max(low, float(f"{x:.3g}")))


def size(distributions: dict[str, Distribution]) -> int | None:
    """How many points the space holds; None when a continuous interval makes it unbounded."""
    n = 1
    for dist in distributions.values():
        choices = values(dist)
        if choices is None:
            return None
        n *= len(choices)
    return n


def to_override(key: str, value: Any) -> str:
    """`key=value` in Hydra's grammar (None -> null, True -> true, strings quoted when needed)."""
    if isinstance(value, bool) or value is None:
        return f"{key}={'null' if value is None else str(value).lower()}"
    return f"{key}={override_text(value)}"


def override_text(value: Any) -> str:
    """A value as Hydra writes it back, or, for a string Hydra's plain form would not read back as the
    same string (quotes, `;|&<`, a backtick, a newline, `${`, a number's look), a quoted string that does."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_text(v) for v in value) + "]"
    plain = handles.override_value(value)
    if not isinstance(value, str) or _reads_back(plain, value):
        return plain
    return quoted(value)


def quoted(text: str) -> str:
    """`text` as a single-quoted Hydra string that composes to exactly `text`: `${` escaped for
    OmegaConf (a literal backslash run before it doubled), then each quote escaped and each backslash
    run before a quote or the closing quote doubled (Hydra's quoted-string rules)."""
    import re

    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return f"'{text}'"


@functools.lru_cache(maxsize=4096)
def _reads_back(text: str, value: str) -> bool:
    """Whether Hydra parses `k=<text>` to the string `value`, with no interpolation for OmegaConf to resolve.
    Kept per pair: Hydra's grammar does not change, and the forecast writes each value of the space
    once per point."""
    if "${" in value:
        return False
    try:
        parsed = _parser().parse_override(f"k={text}").value()
    except Exception:  # noqa: BLE001 - Hydra's grammar refuses it: not a plain value
        return False
    return isinstance(parsed, str) and parsed == value


@functools.cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def representable(dist: Distribution, value: Any) -> bool:
    """Whether `value` lies in `dist` (a preset's lever may be outside the sweep's range)."""
    try:
        return handles.contains(dist, value)
    except (ValueError, TypeError):
        return False


def describe(dist: Distribution) -> str:
    """A distribution as the space writes it: choice(1, 2) or interval(1, 8)."""
    from optuna.distributions import CategoricalDistribution

    if isinstance(dist, CategoricalDistribution):
        return f"choice({', '.join(map(str, dist.choices))})"
    return f"interval({dist.low}, {dist.high})"


# ----------------------------------------------------------------------------- candidates

MAX_CANDIDATES = 256  # a larger space is sampled at random down to this many points


def candidates(grid: dict[str, list], seed: int | None, cap: int = MAX_CANDIDATES) -> Iterator[dict[str, Any]]:
    """Every point of a discrete space, or `cap` of them drawn at random when it is larger.

    Args:
        grid: Each parameter's values.
        seed: The draw's seed, or None.
        cap: The most points drawn.

    Yields:
        One point, parameter to value.
    """
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
    (draw) as a large discrete space is sampled; a discrete space draws as `candidates` does.

    Args:
        distributions: The search space.
        seed: The draw's seed, or None.
        cap: The most points judged.

    Yields:
        One point, parameter to value.
    """
    listed = {key: values(dist) for key, dist in distributions.items()}
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
        point = tuple(rng.choice(grid[n]) if n in grid else draw(distributions[n], rng) for n in names)
        if point not in seen:
            seen.add(point)
            yield dict(zip(names, point))
