"""A search space's parameters as Optuna distributions: the one encoding behind the TPE strategy, the
report's parameter importance and the export of a sweep to an Optuna storage.

Each domain (kernels/backends/<backend>/space.py) becomes one distribution:
- strings, flags and mixed values: categorical over the domain's values;
- an ordered numeric domain, for a sampler (`ranked=True`): the integer position in the domain, so
  that TPE's kernels see that 128 lies between 64 and 256;
- the same domain, for people (`ranked=False`: the report, optuna-dashboard): its own values, as a
  stepped integer range when evenly spaced (2, 3, 4, 5, 6 -> IntDistribution(2, 6); 64, 128 ->
  IntDistribution(64, 128, step=64)), else categorical (64, 128, 256 shown as such, never as 0, 1, 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna


def is_numeric(values: tuple[Any, ...]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def is_ordered_numeric(values: tuple[Any, ...]) -> bool:
    return is_numeric(values) and list(values) == sorted(values) and len(set(values)) == len(values)


def _step(values: tuple[Any, ...]) -> int | None:
    """The common difference of evenly spaced integers (1 for a single value); None otherwise."""
    if not all(isinstance(v, int) for v in values):
        return None
    steps = {b - a for a, b in zip(values, values[1:], strict=False)}
    if not steps:
        return 1
    return steps.pop() if len(steps) == 1 else None


class OptunaSpace:
    """Distributions for `domains` (parameter -> ordered tuple of values) and the map between a config's
    parameters and Optuna's. `encode` raises KeyError for a missing parameter (unless `partial`: a
    config recorded before the parameter existed) and ValueError for a value outside its domain."""

    def __init__(self, domains: Mapping[str, tuple[Any, ...]], *, ranked: bool) -> None:
        self.domains = {name: tuple(values) for name, values in domains.items()}
        self._by_rank: set[str] = set()
        self.distributions: dict[str, optuna.distributions.BaseDistribution] = {}
        for name, values in self.domains.items():
            step = _step(values) if is_ordered_numeric(values) else None
            if ranked and is_ordered_numeric(values):
                self._by_rank.add(name)
                dist = optuna.distributions.IntDistribution(0, len(values) - 1)
            elif not ranked and step is not None:
                dist = optuna.distributions.IntDistribution(values[0], values[-1], step=step)
            else:
                dist = optuna.distributions.CategoricalDistribution(list(values))
            self.distributions[name] = dist

    def encode(self, params: Mapping[str, Any], *, partial: bool = False) -> dict[str, Any]:
        encoded = {}
        for name, values in self.domains.items():
            if partial and name not in params:
                continue
            value = params[name]
            if value not in values:
                raise ValueError(f"{name}={value!r} is not one of {list(values)}")
            encoded[name] = values.index(value) if name in self._by_rank else value
        return encoded

    def decode(self, encoded: Mapping[str, Any]) -> dict[str, Any]:
        return {
            name: values[encoded[name]] if name in self._by_rank else encoded[name]
            for name, values in self.domains.items()
        }
