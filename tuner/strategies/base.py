"""The Strategy contract: how a sweep moves through one problem's search space.

Call order, from the one driver thread that owns a strategy (strategies are not thread-safe):
  1. `observe(config, value)` for every result known before the sweep (earlier sweeps, a resumed one);
  2. then, repeatedly and interleaved as results come back in any order:
       `next_configs(n)` -> at most n configs, each never asked or observed before: `ask(n)`'s, after the
                    recombined config where one is due (below); [] means "nothing right now" (a
                    model-based strategy may wait for results), `exhausted` means "nothing ever again";
       `tell(config, value)` for every config it gave, and `note_kernels(config, kernels)` where the
                    trial's timer named each kernel's time.
`value` is the median seconds of a candidate that passed verification, or None for one that failed.
Budgets (trials, minutes) belong to the driver, which simply stops asking.

Recombination: where an op is kernels run one after another, each set by its own parameters
(SearchSpace.kernels), its time is the sum of theirs, so the best config takes each kernel's parameters
from the config that ran that kernel fastest. Once two configs' kernel times are known, every strategy
proposes that config first, whenever it is valid and new; the strategy's own search goes on around it.
"""

from __future__ import annotations

import abc
import functools
import itertools
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.problem import Problem
from moetune.kernels.space import Pruned, SearchSpace

# A space of more points than this is sampled, never enumerated: a point costs tens of microseconds to
# build and check, so the product of the fused decode block's two kernels (millions of points) would
# spend minutes of a sweep's budget before its first trial.
ENUMERATION_LIMIT = 250_000


class CandidateSpace:
    """One problem's search space on one device; the valid configs are enumerated once, on first use, where
    the space has at most ENUMERATION_LIMIT points (`enumerable`); a larger one is only sampled."""

    def __init__(self, space: SearchSpace, problem: Problem, device: DeviceFingerprint) -> None:
        self.space = space
        self.problem = problem
        self.device = device

    @property
    def domains(self) -> Mapping[str, tuple[Any, ...]]:
        return self.space.domains

    @property
    def kernels(self) -> Mapping[str, tuple[str, ...]]:
        """Each kernel's parameters, where the op is several kernels (SearchSpace.kernels)."""
        return self.space.kernels

    @functools.cached_property
    def _enumerated(self) -> tuple[list[KernelConfig], list[Pruned]]:
        return self.space.enumerate(self.problem, self.device)

    @property
    def enumerable(self) -> bool:
        return self.space.size <= ENUMERATION_LIMIT

    def valid(self) -> list[KernelConfig]:
        if not self.enumerable:
            raise ConfigInvalid(
                f"the space of {self.problem.op} has {self.space.size:,} points, more than the "
                f"{ENUMERATION_LIMIT:,} a sweep enumerates: walk or sample it"
            )
        return self._enumerated[0]

    def walk(self) -> Iterator[KernelConfig]:
        """The valid configs in domain order, generated as they are reached: `valid()` without building
        the whole list."""
        return self._valid_among(self.space.points())

    def sample(self, rng: random.Random, draws: int) -> Iterator[KernelConfig]:
        """The valid configs among `draws` points drawn uniformly at random (with repeats), in draw order."""
        names = list(self.space.domains)
        drawn = ({name: rng.choice(self.space.domains[name]) for name in names} for _ in range(draws))
        return self._valid_among(drawn)

    def _valid_among(self, points: Iterable[Mapping[str, Any]]) -> Iterator[KernelConfig]:
        for params in points:
            try:
                yield self.make(params)
            except ConfigInvalid:
                continue

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
        self._kernel_times: dict[KernelConfig, dict[str, float]] = {}  # each kernel's seconds (recombination)

    def observe(self, config: KernelConfig, value: float | None) -> None:
        """A result known before this sweep asked for it."""
        self._mark_seen(config)
        self.tell(config, value)

    def tell(self, config: KernelConfig, value: float | None) -> None:
        self.values[config] = value

    @abc.abstractmethod
    def ask(self, n: int) -> list[KernelConfig]: ...

    def note_kernels(self, config: KernelConfig, kernels: Mapping[str, float]) -> None:
        """Each kernel's seconds for `config`, as its trial's timer named them: kept where the space splits
        by kernel and every one of its kernels was timed."""
        if self.space.kernels and all(name in kernels for name in self.space.kernels):
            self._kernel_times[config] = {name: kernels[name] for name in self.space.kernels}

    def recombined(self) -> KernelConfig | None:
        """The config taking each kernel's parameters from the config that ran that kernel fastest (the
        rest from the fastest config overall of those timed by kernel); None until two configs' kernel
        times are known, or where that config was seen before or breaks a rule of the space."""
        timed = self._kernel_times
        if len(timed) < 2:
            return None
        params = min(timed, key=lambda c: sum(timed[c].values())).to_dict()
        for kernel, fields in self.space.kernels.items():
            fastest = min(timed, key=lambda c: timed[c][kernel]).to_dict()
            params.update({name: fastest[name] for name in fields})
        try:
            config = self.space.make(params)
        except ConfigInvalid:
            return None
        return None if config in self._seen else config

    def next_configs(self, n: int) -> list[KernelConfig]:
        """At most n configs to run next: the recombined config where one is due, then `ask`'s."""
        taken: list[KernelConfig] = []
        if n > 0 and (config := self.recombined()) is not None:
            self._mark_seen(config)
            taken.append(config)
        return taken + (self.ask(n - len(taken)) if n > len(taken) else [])

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
    """Proposes configs in a fixed order (warm starts first) until none is left. A space too large to
    enumerate is walked lazily (`walk`), as far as the budget goes."""

    def __init__(
        self, space: CandidateSpace, *, seed: int = 0, warm_start: Sequence[KernelConfig] = ()
    ) -> None:
        super().__init__(space, seed=seed, warm_start=warm_start)
        rest = self.order(space.valid()) if space.enumerable else self.walk()
        self._order: Iterator[KernelConfig] = itertools.chain(self._warm, rest)
        self._head: KernelConfig | None = None  # the next config not seen yet, once `exhausted` found it

    @abc.abstractmethod
    def order(self, configs: list[KernelConfig]) -> list[KernelConfig]: ...

    @abc.abstractmethod
    def walk(self) -> Iterator[KernelConfig]:
        """This strategy's order over a space too large to enumerate, generated as it goes."""

    def ask(self, n: int) -> list[KernelConfig]:
        taken = []
        while len(taken) < n and not self.exhausted:
            config, self._head = self._head, None
            self._mark_seen(config)
            taken.append(config)
        return taken

    @property
    def exhausted(self) -> bool:
        # Skips what was observed since: the order only moves forward, so this stays cheap.
        while self._head is None or self._head in self._seen:
            self._head = next(self._order, None)
            if self._head is None:
                return True
        return False
