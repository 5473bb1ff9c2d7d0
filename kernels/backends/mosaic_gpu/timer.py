"""CUPTI kernel time over rotating input buffers.

`fn` may be a compiled executable (the tuner compiles each candidate once, in parallel, and hands the
timer the `jax.stages.Compiled`), so the timer never traces it: it calls `fn` on every argument set of
the rotation in turn, with CUPTI recording each launch's device time. Host gaps between calls do not
enter the samples: CUPTI times kernels, not the host. When the argument sets together are smaller than
twice the L2, they are replicated into fresh device buffers until they are not, so that no run finds its
inputs in cache. Those copies are made by `CuptiTimer.rotation`; the tuner makes them once per problem
and passes the `Rotation`s to every candidate's `time_each`, which times all of them in one CUPTI
session (starting and stopping one costs more than the passes). A sample is one pass over a rotation:
the summed kernel time of its launches divided by the number of sets.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from moetune.kernels.timing import Rotation, Timed, Timer

# DESIGN.md: every timing is the median of at least this many runs.
MIN_RUNS = 10
# Replicas are real copies in device memory; past this many the sets are large enough anyway.
MAX_REPLICAS = 64


def _nbytes(arg_sets: Sequence[tuple]) -> int:
    import jax

    return sum(int(getattr(leaf, "nbytes", 0)) for s in arg_sets for leaf in jax.tree.leaves(s))


def rotation(arg_sets: Sequence[tuple], min_bytes: int) -> list[tuple]:
    """`arg_sets` plus device copies of them until they hold at least `min_bytes`."""
    import jax
    import jax.numpy as jnp

    if not arg_sets:
        raise ValueError("the timer needs at least one argument set")
    sets = list(arg_sets)
    size = _nbytes(sets)
    replicas = min(MAX_REPLICAS, math.ceil(min_bytes / size) if size else 1)
    for _ in range(1, replicas):
        for s in arg_sets:
            sets.append(jax.tree.map(lambda x: jnp.array(x, copy=True), s))
    return sets


def device_l2_bytes() -> int:
    """L2 size of jax's default GPU, from the driver or the architecture table."""
    import jax

    from moetune.kernels.backends.mosaic_gpu import hardware

    device = jax.devices()[0]
    capability = str(getattr(device, "compute_capability", "9.0"))
    return hardware.l2_cache_bytes(int(getattr(device, "local_hardware_id", 0) or 0), capability)


class CuptiSession:
    """Start and stop CUPTI activity recording; `stop` returns [(kernel name, milliseconds), ...].

    jax 0.11.2's public `profiler.measure` jits whatever it is given unless it is already a jit stage,
    which a list of calls over rotating buffers is not, so this drives the same Mosaic GPU extension
    calls that `measure` makes. Pinned with jax (pyproject.toml); re-check on a jax upgrade.
    """

    def __init__(self) -> None:
        from jax._src.lib import mosaic_gpu as mosaic_gpu_lib

        if mosaic_gpu_lib is None:
            raise RuntimeError("CUPTI profiling needs jaxlib's Mosaic GPU extension (CUDA jaxlib)")
        self._ext = mosaic_gpu_lib._mosaic_gpu_ext

    def start(self) -> None:
        self._ext._cupti_init()

    def stop(self) -> list[tuple[str, float]]:
        return list(self._ext._cupti_get_timings(True))

    def record(self, fn: Callable[[], Any]) -> list[tuple[str, float]]:
        """The kernels one call of `fn()` launches, its results waited for: [(kernel name, ms), ...]."""
        import jax

        self.start()
        jax.block_until_ready(fn())
        return self.stop()


class CuptiTimer(Timer):
    """Device time of the kernels `fn` launches, as CUPTI records it; seconds per call."""

    name = "cupti"

    def __init__(
        self,
        *,
        min_rotation_bytes: int | None = None,
        session: Callable[[], CuptiSession] = CuptiSession,
    ) -> None:
        # None: twice the device's L2, read when the first rotation is made.
        self.min_rotation_bytes = min_rotation_bytes
        self._session = session

    def rotation(self, arg_sets: Sequence[tuple]) -> Rotation:
        if self.min_rotation_bytes is None:
            self.min_rotation_bytes = 2 * device_l2_bytes()
        return Rotation(tuple(rotation(arg_sets, self.min_rotation_bytes)))

    def time(
        self, fn: Callable[..., Any], arg_sets: Sequence[tuple] | Rotation, *, runs: int = MIN_RUNS
    ) -> list[float]:
        return self.time_each(fn, [arg_sets], runs=runs)[0]

    def time_each(
        self,
        fn: Callable[..., Any],
        rotations: Sequence[Sequence[tuple] | Rotation],
        *,
        runs: int = MIN_RUNS,
        warmed: bool = False,
    ) -> list[list[float]]:
        return self.time_kernels(fn, rotations, runs=runs, warmed=warmed).samples

    def time_kernels(
        self,
        fn: Callable[..., Any],
        rotations: Sequence[Sequence[tuple] | Rotation],
        *,
        runs: int = MIN_RUNS,
        warmed: bool = False,
    ) -> Timed:
        """All rotations in one CUPTI session: starting and stopping one costs more than the passes.
        Without `warmed`, one untimed pass over every rotation first, so first-launch costs stay out."""
        import jax

        runs = max(runs, MIN_RUNS)
        each = [self.rotated(r) for r in rotations]
        for sets in [] if warmed else each:
            jax.block_until_ready([fn(*s) for s in sets])
        session = self._session()
        session.start()
        try:
            for sets in each:
                for _ in range(runs):
                    # Outputs are dropped after each pass: a pass over large problems holds gigabytes.
                    jax.block_until_ready([fn(*s) for s in sets])
        finally:
            timings = session.stop()
        calls = runs * sum(len(sets) for sets in each)
        if not timings:
            raise RuntimeError("CUPTI recorded no kernel launch: does fn run on the GPU?")
        if len(timings) % calls:
            raise RuntimeError(
                f"CUPTI recorded {len(timings)} launches for {calls} calls: not a whole number each"
            )
        # One fn, so every call launches as many kernels; the launches come in call order.
        per_call = len(timings) // calls
        samples, start = [], 0
        for sets in each:
            per_pass = per_call * len(sets)
            passes = [timings[start + i * per_pass : start + (i + 1) * per_pass] for i in range(runs)]
            samples.append([sum(ms for _, ms in launches) * 1e-3 / len(sets) for launches in passes])
            start += runs * per_pass
        return Timed(samples, _per_kernel(timings, calls))


def _per_kernel(timings: list[tuple[str, float]], calls: int) -> tuple[tuple[str, float], ...]:
    """Each kernel name's seconds per call (the median over `calls`; a name launched twice a call counts
    both), in the order of first launch. By name, not position: CUPTI's record order within a call can
    differ from call to call."""
    by_name: dict[str, list[float]] = {}
    for name, ms in timings:
        by_name.setdefault(name, []).append(ms)
    kernels = []
    for name, launches in by_name.items():
        each = len(launches) // calls  # launches of this name per call
        per_call = [sum(launches[i * each : (i + 1) * each]) for i in range(calls)] if each else launches
        kernels.append((name, statistics.median(per_call) * 1e-3))
    return tuple(kernels)
