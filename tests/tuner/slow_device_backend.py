"""A backend whose device phase is slow on purpose, registered only in tests as "slow_device".

Its kernels are real (jax.lax.ragged_dot, so they compile and verify like any other), but its timer holds
the "device" for `DEVICE_S` more per call: the device phase dominates a trial, as it does when timing
large shapes on a GPU, so the number of lanes sets the sweep's throughput.

When `LOG_ENV` names a folder, every timing call appends one JSON line to `<folder>/<pid>.jsonl`: the
worker's pid, the GPU Ray assigned it (CUDA_VISIBLE_DEVICES; HIP_VISIBLE_DEVICES where the executor
seated it on an `amd_gpu` unit) and the call's wall-clock interval. Ray
workers of a local cluster inherit the environment of the process that started it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from moetune.kernels.backend import Backend
from moetune.kernels.config import KernelConfig
from moetune.kernels.space import SearchSpace
from moetune.kernels.timing import Timer, WallTimer

VARIANTS = tuple(range(8))
DEVICE_S = 0.3
LOG_ENV = "MOETUNE_TEST_DEVICE_LOG"


@dataclasses.dataclass(frozen=True, slots=True)
class SlowConfig(KernelConfig):
    variant: int = 0


class SlowDeviceTimer(Timer):
    """Wall-clock timing, then the device stays busy for `DEVICE_S`."""

    name = "slow_device"

    def time(self, fn: Callable[..., Any], arg_sets: Sequence[tuple], *, runs: int = 10) -> list[float]:
        start = time.time()
        samples = WallTimer(warmup=1).time(fn, arg_sets, runs=runs)
        time.sleep(DEVICE_S)
        _log(start, time.time())
        return samples


def _log(start: float, end: float) -> None:
    folder = os.environ.get(LOG_ENV)
    if not folder:
        return
    line = {
        "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "hip_visible_devices": os.environ.get("HIP_VISIBLE_DEVICES", ""),
        "start": start,
        "end": end,
    }
    with (Path(folder) / f"{os.getpid()}.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")


class SlowDeviceBackend(Backend):
    name = "slow_device"
    config_cls = SlowConfig
    kernels = {"grouped_matmul": "build"}  # made in build()

    def available(self, device) -> str | None:
        return None

    def search_space(self, problem, device) -> SearchSpace:
        return SearchSpace(SlowConfig, {"variant": VARIANTS})

    def heuristic(self, problem, device) -> SlowConfig:
        return SlowConfig()

    def source_hash(self) -> str:
        return "slow-device-v1"

    def timer(self) -> Timer:
        return SlowDeviceTimer()

    def build(self, problem, config: SlowConfig):
        out_dtype = jnp.dtype(problem.out_dtype)
        # Variants differ only in a constant, so each compiles to its own executable.
        scale = 1.0 + config.variant

        def kernel(lhs, rhs, group_sizes):
            out = jax.lax.ragged_dot(lhs * scale, rhs, group_sizes, preferred_element_type=jnp.float32)
            return (out / scale).astype(out_dtype)

        return kernel


BACKEND = SlowDeviceBackend()
