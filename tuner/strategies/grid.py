"""Every valid config of the pruned grid, in the search space's domain order (warm starts first)."""

from __future__ import annotations

from collections.abc import Iterator

from moetune.kernels.config import KernelConfig
from moetune.tuner.strategies.base import OrderedStrategy


class GridStrategy(OrderedStrategy):
    name = "grid"

    def order(self, configs: list[KernelConfig]) -> list[KernelConfig]:
        return list(configs)

    def walk(self) -> Iterator[KernelConfig]:
        return self.space.walk()
