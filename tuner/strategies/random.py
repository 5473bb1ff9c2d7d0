"""Valid configs in a seeded random order (warm starts first): the same seed resumes the same order. A
space too large to enumerate gets points drawn at random, as many draws as it has points."""

from __future__ import annotations

import random
from collections.abc import Iterator

from moetune.kernels.config import KernelConfig
from moetune.tuner.strategies.base import OrderedStrategy


class RandomStrategy(OrderedStrategy):
    name = "random"

    def order(self, configs: list[KernelConfig]) -> list[KernelConfig]:
        shuffled = list(configs)
        random.Random(self.seed).shuffle(shuffled)
        return shuffled

    def walk(self) -> Iterator[KernelConfig]:
        return self.space.sample(random.Random(self.seed), self.space.space.size)
