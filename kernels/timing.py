"""How a compiled kernel is timed; backends may provide a device-accurate Timer (CUPTI on NVIDIA)."""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True, eq=False)
class Rotation:
    """The argument sets a timer cycles through, already made as that timer needs them
    (`Timer.rotation`): callers that time many kernels on the same inputs make it once."""

    sets: tuple[tuple, ...]


@dataclasses.dataclass(frozen=True)
class Timed:
    """What `Timer.time_kernels` measured: each rotation's samples (seconds per call, as `time_each`), and
    where the timer sees each launch, the kernels one call launches in launch order, each with its median
    seconds over every call (a trial's details keep them: which of an op's kernels the time went to)."""

    samples: list[list[float]]
    kernels: tuple[tuple[str, float], ...] = ()


class Timer(abc.ABC):
    """Times `fn` over rotating argument sets and returns one duration (seconds) per run.

    Implementations warm up first (compilation and first-launch costs stay out of the samples) and
    rotate through the argument sets so that repeated runs do not just measure a warm cache. `time`
    accepts plain argument sets (it makes their rotation itself) or a `Rotation` from `rotation`.
    """

    name: str = "timer"
    # Whether `time` takes any jitted JAX program, not only this backend's own kernels: then a sweep
    # times its XLA baseline with this timer too, so both sides of a speedup are measured alike.
    times_any_jax_program: bool = True

    def rotation(self, arg_sets: Sequence[tuple]) -> Rotation:
        """The sets `time` cycles through for `arg_sets`; timers that must defeat caches add copies."""
        if not arg_sets:
            raise ValueError("the timer needs at least one argument set")
        return Rotation(tuple(arg_sets))

    def rotated(self, arg_sets: Sequence[tuple] | Rotation) -> tuple[tuple, ...]:
        return (arg_sets if isinstance(arg_sets, Rotation) else self.rotation(arg_sets)).sets

    @abc.abstractmethod
    def time(
        self, fn: Callable[..., Any], arg_sets: Sequence[tuple] | Rotation, *, runs: int = 10
    ) -> list[float]: ...

    def time_each(
        self,
        fn: Callable[..., Any],
        rotations: Sequence[Sequence[tuple] | Rotation],
        *,
        runs: int = 10,
        warmed: bool = False,
    ) -> list[list[float]]:
        """The samples `time` would return for each of `rotations`, in order.

        Implementations whose set-up costs more than the timing (a profiler session) may time all the
        rotations in one session; each rotation's samples must still be its own. `warmed`: the caller ran
        `fn` on this device since it was compiled (the tuner verifies before it times), so a timer may
        skip its warm-up pass.
        """
        return [self.time(fn, rotation, runs=runs) for rotation in rotations]

    def time_kernels(
        self,
        fn: Callable[..., Any],
        rotations: Sequence[Sequence[tuple] | Rotation],
        *,
        runs: int = 10,
        warmed: bool = False,
    ) -> Timed:
        """`time_each`'s samples, with each kernel's time where the timer records launches (no kernels
        here: a host clock sees calls, not launches)."""
        return Timed(self.time_each(fn, rotations, runs=runs, warmed=warmed))


class WallTimer(Timer):
    """Host clock around each call with `block_until_ready`: right for CPU; coarse on GPUs."""

    name = "wall"

    def __init__(self, warmup: int = 2) -> None:
        self.warmup = warmup

    def time(
        self, fn: Callable[..., Any], arg_sets: Sequence[tuple] | Rotation, *, runs: int = 10
    ) -> list[float]:
        import jax

        sets = self.rotated(arg_sets)
        for i in range(self.warmup):
            jax.block_until_ready(fn(*sets[i % len(sets)]))
        samples = []
        for i in range(runs):
            args = sets[i % len(sets)]
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            samples.append(time.perf_counter() - start)
        return samples
