"""How the tuner times a FlyDSL candidate: its code object, with HIP events, in a process of its own.

The tuner verifies a candidate through JAX (`CodeObjectKernel.__call__`) and times it with
`HipEventTimer`, which runs hip_runtime.py in a child process: a code object that fails to load, or a
kernel that faults, aborts HIP's whole process and must take only its own trial down. Failures keep
their types, which the tuner maps to trial statuses: WrongResult (the child's spot check) is
`wrong_result`; CandidateCrashed (the child died) and HipError are `crashed`.

The worker's process sees only its own GPU (the tuner sets HIP_VISIBLE_DEVICES when it seats a worker
on an `amd_gpu` unit), so the child times on device 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from moetune.kernels.backends.flydsl.hip_runtime import time_in_subprocess, timing_request
from moetune.kernels.backends.flydsl.plan import KernelPlan
from moetune.kernels.errors import Unsupported
from moetune.kernels.timing import Rotation, Timer


@dataclasses.dataclass(frozen=True, eq=False)
class CodeObjectKernel:
    """A compiled candidate as the tuner holds it: the JAX executable and the code object it launches."""

    executable: Callable[..., Any]
    plan: KernelPlan
    hsaco_path: str
    kernel_name: str

    def __call__(self, *args: Any) -> Any:
        return self.executable(*args)


class HipEventTimer(Timer):
    """HIP-event timing of the code object in a child process, on the timing set's group sizes.

    The child makes its own random operands and rotates them past the last-level cache, so the argument
    sets contribute only their `group_sizes` (the third argument).
    """

    name = "hip_events"
    times_any_jax_program = False  # it launches a code object, not the callable it is given

    def __init__(self, timeout_s: float = 600.0) -> None:
        self.timeout_s = timeout_s

    def time(
        self, fn: Callable[..., Any], arg_sets: Sequence[tuple] | Rotation, *, runs: int = 10
    ) -> list[float]:
        if not isinstance(fn, CodeObjectKernel):
            raise Unsupported(f"HipEventTimer times FlyDSL code objects, not {type(fn).__qualname__}")
        group_sizes = np.asarray(self.rotated(arg_sets)[0][2]).tolist()
        request = timing_request(fn.plan, fn.hsaco_path, fn.kernel_name, group_sizes, runs=runs)
        return list(time_in_subprocess(request, timeout_s=self.timeout_s).samples_s)
