"""How a compiled kernel is timed; backends may provide a device-accurate Timer (CUPTI on NVIDIA)."""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from typing import Any


class Timer(abc.ABC):
    """Times `fn` over rotating argument sets and returns one duration (seconds) per run.

    Implementations warm up first (compilation and first-launch costs stay out of the samples) and
    rotate through `arg_sets` so that repeated runs do not just measure a warm cache.
    """

    name: str = "timer"

    @abc.abstractmethod
    def time(self, fn: Callable[..., Any], arg_sets: Sequence[tuple], *, runs: int = 10) -> list[float]: ...


class WallTimer(Timer):
    """Host clock around each call with `block_until_ready`: right for CPU; coarse on GPUs."""

    name = "wall"

    def __init__(self, warmup: int = 2) -> None:
        self.warmup = warmup

    def time(self, fn: Callable[..., Any], arg_sets: Sequence[tuple], *, runs: int = 10) -> list[float]:
        import jax

        for i in range(self.warmup):
            jax.block_until_ready(fn(*arg_sets[i % len(arg_sets)]))
        samples = []
        for i in range(runs):
            args = arg_sets[i % len(arg_sets)]
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            samples.append(time.perf_counter() - start)
        return samples
