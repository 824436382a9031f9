"""ComposeCache: the configs of many points of one space at one Hydra composition per distinct
set of config-group choices.

The sweep's plan, forecast, start, neighbour moves, pre-screen and each trial's check (prepare)
compose a config for every point they judge; Hydra re-reads and re-parses conf/ on each compose,
so one composition per group choice makes ranking a few hundred candidates cost about a second,
and a sweep whose points share their group choices composes once (plan.Composer.configs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from . import handles

if TYPE_CHECKING:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Override
    from omegaconf import DictConfig


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
