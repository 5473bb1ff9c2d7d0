"""mosaic_gpu's fused MoE decode block on a CPU, registered only in tests as "decode_interpreted": the
backend's own search space, Config and kernels (the block's two Pallas Triton kernels, or the unfused
layer of the baseline), built to run in Pallas's interpreter, verified for real, and timed by a simulated
timer: the fused configs take the cost model's estimate for the device the sweep records (each kernel's
its own, as CUPTI names them), the unfused baseline takes `UNFUSED_S`. A test sets UNFUSED_S to make the
fused block win or lose.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from moetune.kernels import timing
from moetune.kernels.backends.mosaic_gpu import cost_model_decode
from moetune.kernels.backends.mosaic_gpu.backend import MosaicGpuBackend
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.timing import Rotation, Timer

H200 = DeviceFingerprint("NVIDIA H200", "gpu", 132, 150 << 30, "9.0", "", "", "", "")
UNFUSED_S = 1.0


class Timed:
    """A compiled kernel with the seconds its simulated timing reports, and each of its kernels'."""

    def __init__(self, compiled: Callable[..., Any], kernels: tuple[tuple[str, float], ...]) -> None:
        self.compiled = compiled
        self.kernels = kernels
        self.seconds = sum(seconds for _, seconds in kernels)

    def __call__(self, *args: Any) -> Any:
        return self.compiled(*args)


class SimulatedTimer(Timer):
    name = "simulated"
    times_any_jax_program = False

    def time(self, fn: Any, arg_sets: Sequence[tuple] | Rotation, *, runs: int = 10) -> list[float]:
        # A spread of +-0.2% around the simulated time, as tests/tuner/sim_backend.py's.
        return [fn.seconds * (1 + 0.002 * ((i % 5) - 2) / 2) for i in range(runs)]

    def time_kernels(
        self, fn: Any, rotations: Sequence, *, runs: int = 10, warmed: bool = False
    ) -> timing.Timed:
        return timing.Timed(self.time_each(fn, rotations, runs=runs, warmed=warmed), fn.kernels)


class InterpretedDecodeBackend(MosaicGpuBackend):
    name = "decode_interpreted"
    kernels = {"moe_decode_block": "kernel_decode:moe_decode_block"}

    def available(self, device: DeviceFingerprint) -> str | None:
        return None

    def source_hash(self) -> str:
        return "decode-interpreted-v1"

    def build(self, problem, config):
        self.check(problem)
        reason = self.search_space(problem, H200).invalid(problem, config, H200)
        if reason is not None:
            raise ConfigInvalid(reason)
        kernel = functools.partial(
            self.kernel_for(problem.op), config=config, **problem.spec.options(problem)
        )
        return functools.partial(kernel, interpret=True) if config.fused else kernel

    def executable(self, problem, config, compiled):
        if not config.fused:
            return Timed(compiled, (("unfused", UNFUSED_S),))
        estimate = cost_model_decode.estimate(problem, config.decode_config(), H200)
        kernels = (("moetune_decode_up", estimate.up.seconds), ("moetune_decode_down", estimate.down.seconds))
        return Timed(compiled, kernels)

    def timer(self) -> Timer:
        return SimulatedTimer()


BACKEND = InterpretedDecodeBackend()
