"""The Strategy contract: how a sweep moves through one problem's search space.

Call order, from the one driver thread that owns a strategy (strategies are not thread-safe):
  1. `observe(config, value)` for every result known before the sweep (earlier sweeps, a resumed one);
  2. then, repeatedly and interleaved as results come back in any order:
       `ask(n)`  -> at most n configs, each never asked or observed before; [] means "nothing right now"
                    (a model-based strategy may wait for results), `exhausted` means "nothing ever again";
       `tell(config, value)` for every asked config.
`value` is the median seconds of a candidate that passed verification, or None for one that failed.
Budgets (trials, minutes) belong to the driver, which simply stops asking.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem
from moetune.kernels.space import Pruned, SearchSpace


class CandidateSpace:
    """One problem's search space on one device; the valid configs are enumerated once, on first use."""

    def __init__(self, space: SearchSpace, problem: Problem, device: DeviceFingerprint) -> None:
        self.space = space
        self.problem = problem
        self.device = device

    @property
    def domains(self) -> Mapping[str, tuple[Any, ...]]:
        return self.space.domains

    @functools.cached_property
    def _enumerated(self) -> tuple[list[KernelConfig], list[Pruned]]:
        return self.space.enumerate(self.problem, self.device)

    def valid(self) -> list[KernelConfig]:
        return self._enumerated[0]

    def pruned(self) -> list[Pruned]:
        return self._enumerated[1]

    def make(self, params: Mapping[str, Any]) -> KernelConfig:
        """The config for `params`; raises ConfigInvalid (with the reason) when a rule forbids it."""
        return self.space.make(params, self.problem, self.device)

    def is_valid(self, config: KernelConfig) -> bool:
        return self.space.violation(self.problem, config, self.device) is None


class Strategy(abc.ABC):
    name: ClassVar[str]

    def __init__(
        self, space: CandidateSpace, *, seed: int = 0, warm_start: Sequence[KernelConfig] = ()
    ) -> None:
        self.space = space
        self.seed = seed
        # Warm starts go first, valid ones only, each once.
        self._warm = [c for c in dict.fromkeys(warm_start) if space.is_valid(c)]
        self._seen: set[KernelConfig] = set()
        self.values: dict[KernelConfig, float | None] = {}

    def observe(self, config: KernelConfig, value: float | None) -> None:
        """A result known before this sweep asked for it."""
        self._mark_seen(config)
        self.tell(config, value)

    def tell(self, config: KernelConfig, value: float | None) -> None:
        self.values[config] = value

    @abc.abstractmethod
    def ask(self, n: int) -> list[KernelConfig]: ...

    @property
    @abc.abstractmethod
    def exhausted(self) -> bool: ...

    @property
    def best(self) -> tuple[KernelConfig, float] | None:
        told = [(value, config) for config, value in self.values.items() if value is not None]
        if not told:
            return None
        value, config = min(told, key=lambda item: item[0])
        return config, value

    def _take_unseen(self, ordered: Iterable[KernelConfig], n: int) -> list[KernelConfig]:
        """Up to n configs from `ordered` not seen before, marking them seen."""
        taken = []
        for config in ordered:
            if len(taken) == n:
                break
            if config not in self._seen:
                self._mark_seen(config)
                taken.append(config)
        return taken

    def _mark_seen(self, config: KernelConfig) -> None:
        self._seen.add(config)


class OrderedStrategy(Strategy):
    """Proposes configs in a fixed order (warm starts first) until none is left."""

    def __init__(
        self, space: CandidateSpace, *, seed: int = 0, warm_start: Sequence[KernelConfig] = ()
    ) -> None:
        super().__init__(space, seed=seed, warm_start=warm_start)
        self._order = self._warm + self.order(space.valid())
        self._next = 0

    @abc.abstractmethod
    def order(self, configs: list[KernelConfig]) -> list[KernelConfig]: ...

    def ask(self, n: int) -> list[KernelConfig]:
        taken = []
        while len(taken) < n and not self.exhausted:
            config = self._order[self._next]
            self._mark_seen(config)
            taken.append(config)
        return taken

    @property
    def exhausted(self) -> bool:
        # Skips what was observed since: the pointer only moves forward, so this stays cheap.
        while self._next < len(self._order) and self._order[self._next] in self._seen:
            self._next += 1
        return self._next >= len(self._order)
