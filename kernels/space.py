"""A backend's search space: parameter domains plus named constraints, pure and CPU-testable.

A constraint is a plain function (problem, config, device) -> None or a short reason. The pruner, the
kernel's own entry-point check and the tests all call the same functions, so they cannot disagree.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.problem import Problem

Constraint = Callable[[Problem, Any, DeviceFingerprint], str | None]


@dataclasses.dataclass(frozen=True)
class Pruned:
    params: dict[str, Any]
    reason: str


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """`seeds`: configs known to be good for this problem (a backend's preferred configs beyond the one its
    heuristic picks), which a search tries early; the driver drops those a narrowed space excludes. They
    come from `seeding`, called when `seeds` is first read: a backend ranks its whole space with its cost
    model to find them (seconds for a large space), which checking a config against the space
    (`invalid`, for every entry of a pack a process loads) does not need.

    `validity`: the constraints among `constraints` that say the kernel cannot run a config at all; the
    others only prune correct but wasteful points. An imported config pack is refused for breaking a
    validity constraint, never for a pruning one (`invalid`).

    `baseline`: the config that runs what the op replaces, where an op is a faster path to something
    moetune runs anyway (the fused MoE decode block: the unfused path). Every search of the problem times
    it first, whatever the budget or a narrowed space (the sweep driver), so a tuned winner other than it
    was measured faster than it; dispatch takes the op only for such a winner (kernels/moe/layer.py).

    `kernels`: where an op is several kernels run one after another, each set by its own parameters, the
    kernels' names (as a timer names their launches) and each one's parameters. A call's time is then the
    sum of its kernels', and a search can take each kernel's parameters from the config whose time of that
    kernel was best (tuner/strategies/base.py `recombined`)."""

    config_cls: type[KernelConfig]
    domains: Mapping[str, tuple[Any, ...]]
    constraints: tuple[Constraint, ...] = ()
    seeding: Callable[[], Iterable[KernelConfig]] = tuple
    validity: tuple[Constraint, ...] = ()
    baseline: KernelConfig | None = None
    kernels: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        fields = [name for names in self.kernels.values() for name in names]
        unknown = sorted(set(fields) - set(self.domains))
        if unknown or len(fields) != len(set(fields)):
            raise ValueError(
                f"kernels: each parameter of at most one kernel, every one a parameter (unknown: {unknown})"
            )

    @functools.cached_property
    def seeds(self) -> tuple[KernelConfig, ...]:
        return tuple(self.seeding())

    @property
    def size(self) -> int:
        total = 1
        for values in self.domains.values():
            total *= len(values)
        return total

    def points(self) -> Iterator[dict[str, Any]]:
        names = list(self.domains)
        for values in itertools.product(*(self.domains[n] for n in names)):
            yield dict(zip(names, values, strict=True))

    def restricted(self, subset: Mapping[str, Any] | None) -> SearchSpace:
        """This space with some domains narrowed to the given values (a sweep's `space:`); every name
        must be a parameter and every value one of its domain's."""
        if not subset:
            return self
        domains = dict(self.domains)
        for name, wanted in subset.items():
            if name not in domains:
                raise ConfigInvalid(f"space: {name!r} is not a parameter; parameters: {', '.join(domains)}")
            values = tuple(wanted) if isinstance(wanted, (list, tuple)) else (wanted,)
            outside = [v for v in values if v not in domains[name]]
            if outside or not values:
                raise ConfigInvalid(
                    f"space: {name}={list(values)} is not a non-empty subset of {list(domains[name])}"
                )
            domains[name] = tuple(dict.fromkeys(values))
        return dataclasses.replace(self, domains=domains)

    def contains(self, config: KernelConfig) -> bool:
        """Whether every parameter of `config` lies in its domain (constraints aside)."""
        params = config.to_dict()
        return all(params.get(name) in values for name, values in self.domains.items())

    def make(self, params: Mapping[str, Any], problem: Problem, device: DeviceFingerprint) -> KernelConfig:
        """Build the config for `params` and check it; raises ConfigInvalid with the reason."""
        config = self.config_cls.from_dict(dict(params))
        reason = self.violation(problem, config, device)
        if reason is not None:
            raise ConfigInvalid(reason)
        return config

    def violation(self, problem: Problem, config: KernelConfig, device: DeviceFingerprint) -> str | None:
        for constraint in self.constraints:
            reason = constraint(problem, config, device)
            if reason is not None:
                return reason
        return None

    def invalid(self, problem: Problem, config: KernelConfig, device: DeviceFingerprint) -> str | None:
        """The first validity constraint `config` breaks, as "name: reason", else None."""
        for constraint in self.validity:
            reason = constraint(problem, config, device)
            if reason is not None:
                return f"{constraint.__name__}: {reason}"
        return None

    def enumerate(
        self, problem: Problem, device: DeviceFingerprint
    ) -> tuple[list[KernelConfig], list[Pruned]]:
        """Every valid config, deduplicated and in domain order, and every pruned point with its reason."""
        valid: dict[KernelConfig, None] = {}
        pruned: list[Pruned] = []
        for params in self.points():
            try:
                valid.setdefault(self.make(params, problem, device))
            except ConfigInvalid as e:
                pruned.append(Pruned(params, str(e)))
        return list(valid), pruned
