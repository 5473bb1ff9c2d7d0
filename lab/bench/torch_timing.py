"""Kernel time of PyTorch calls through the same CUPTI subscriber JAX's profiler uses.

CUPTI records every kernel the process launches, PyTorch's included, so torch baselines are measured
exactly like the JAX ones (device time of the kernels, no host gaps). If CUPTI cannot be attached, CUDA
events around each call are the fallback, and the result says which was used.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable


def time_torch(fn: Callable[[], object], runs: int = 10) -> tuple[list[float], str]:
    """Seconds per call of `fn` (after one warm-up call) and the method used ('cupti' or 'events')."""
    import torch

    fn()
    torch.cuda.synchronize()
    try:
        from jax._src.lib import mosaic_gpu as mosaic_gpu_lib

        ext = mosaic_gpu_lib._mosaic_gpu_ext
        ext._cupti_init()
        try:
            for _ in range(runs):
                fn()
            torch.cuda.synchronize()
        finally:
            timings = ext._cupti_get_timings(True)
        if timings and len(timings) % runs == 0:
            per_call = len(timings) // runs
            return [
                sum(ms for _, ms in timings[i * per_call : (i + 1) * per_call]) * 1e-3 for i in range(runs)
            ], "cupti"
    except (ImportError, AttributeError, RuntimeError):
        pass
    samples = []
    for _ in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(stop) * 1e-3)
    return samples, "events"


def summary(samples: list[float]) -> dict:
    return {
        "median_ms": statistics.median(samples) * 1e3,
        "min_ms": min(samples) * 1e3,
        "max_ms": max(samples) * 1e3,
        "samples_ms": [s * 1e3 for s in samples],
    }
