"""Valid configs in a seeded random order (warm starts first): the same seed resumes the same order."""

from __future__ import annotations

import random

from moetune.kernels.config import KernelConfig
from moetune.tuner.strategies.base import OrderedStrategy


class RandomStrategy(OrderedStrategy):
    name = "random"

    def order(self, configs: list[KernelConfig]) -> list[KernelConfig]:
        shuffled = list(configs)
        random.Random(self.seed).shuffle(shuffled)
        return shuffled
