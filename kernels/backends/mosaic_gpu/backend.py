"""The `mosaic_gpu` backend: the Pallas Mosaic GPU grouped GEMM on Hopper (plain, or with the fused
SwiGLU epilogue; 16-bit, or FP8 with scales) and its weight gradient (a ragged contraction, its own
kernel and search space), timed with CUPTI; beside them the fused MoE decode block, two Pallas Triton
kernels with a Config and a search space of their own (kernel_decode.py, space_decode.py)."""

from __future__ import annotations

import functools
import types

import jax.numpy as jnp

from moetune.kernels.backend import Backend, KernelFn
from moetune.kernels.backends.mosaic_gpu import hardware
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.backends.mosaic_gpu.kernel_decode import DecodeBlockConfig
from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint, current_fingerprint
from moetune.kernels.errors import ConfigInvalid, ResourceExceeded, Unsupported
from moetune.kernels.problem import Problem
from moetune.kernels.timing import Timer


class MosaicGpuBackend(Backend):
    name = "mosaic_gpu"
    config_cls = MosaicGpuConfig
    # The default wherever it runs: it outranks the portable backends.
    priority = 100
    # The fused epilogue is SwiGLU's only; other gated ops (grouped_matmul_geglu) fall through to xla.
    kernels = {
        "grouped_matmul": "grouped_matmul",
        "grouped_matmul_swiglu": "grouped_matmul_swiglu",
        "grouped_matmul_drhs": "kernel_drhs:grouped_matmul_drhs",
        "grouped_matmul_fp8": "grouped_matmul_fp8",
        "grouped_matmul_swiglu_fp8": "grouped_matmul_swiglu_fp8",
        "moe_decode_block": "kernel_decode:moe_decode_block",
        "moe_decode_block_fp8": "kernel_decode:moe_decode_block_fp8",
    }
    op_configs = {"moe_decode_block": DecodeBlockConfig, "moe_decode_block_fp8": DecodeBlockConfig}
    kernel_module = "moetune.kernels.backends.mosaic_gpu.kernel_sm90"
    # The decode block's two kernels, and the routing kernel its unfused baseline (fused=False) runs on a GPU.
    shared_kernel_modules = ("moetune.kernels.moe.decode_block", "moetune.kernels.moe.routing_kernel")
    # The GEMM kernels take a local slice's `row_start` (the forward and FP8 ones through the row-tile
    # table).
    serves_group_offset = frozenset(
        {
            "grouped_matmul",
            "grouped_matmul_swiglu",
            "grouped_matmul_drhs",
            "grouped_matmul_fp8",
            "grouped_matmul_swiglu_fp8",
        }
    )
    prior_compile_s = 2.5  # 1.4-4 s per candidate on the H200's tuning workers (tuner/driver.py)

    def available(self, device: DeviceFingerprint) -> str | None:
        if device.platform != "gpu":
            return f"mosaic_gpu needs an NVIDIA GPU; this device is {device.platform} ({device.device_kind})"
        if not hardware.is_hopper(device.compute_capability):
            return (
                f"mosaic_gpu's kernel is written for Hopper (compute capability 9.x); "
                f"{device.device_kind} is {device.compute_capability or 'unknown'}"
            )
        if device.core_count < 1:
            return f"the device fingerprint of {device.device_kind} reports no SM count"
        try:
            import jax.experimental.pallas.mosaic_gpu  # noqa: F401
        except ImportError as e:
            return f"Pallas Mosaic GPU is not importable ({e})"
        return None

    def check_problem(self, problem: Problem) -> None:
        _space(problem).check_problem(problem)

    def search_space(self, problem: Problem, device: DeviceFingerprint):
        return _space(problem).space(problem, device)

    def heuristic(self, problem: Problem, device: DeviceFingerprint) -> MosaicGpuConfig:
        return _space(problem).heuristic(problem, device)

    def build(self, problem: Problem, config: KernelConfig) -> KernelFn:
        """The kernel for `problem` on the running device.

        The search space's validity constraints decide, exactly as in the pruner; its pruning-only
        constraints (wasteful but correct points) do not, so any config that runs correctly builds.
        """
        space = _space(problem)
        self.check(problem)
        config_cls = self.config_class(problem.op)
        if not isinstance(config, config_cls):
            raise ConfigInvalid(
                f"mosaic_gpu needs a {config_cls.__qualname__}, not {type(config).__qualname__}"
            )
        device = current_fingerprint()
        # The decode block reads no device facts: it builds anywhere (Pallas's interpreter runs it on a CPU).
        reason = None if problem.spec.routed else self.available(device)
        if reason is not None:
            raise Unsupported(reason)
        for constraint in space.VALIDITY_CONSTRAINTS:
            reason = constraint(problem, config, device)
            if reason is not None:
                error = ResourceExceeded if constraint in space.RESOURCE_CONSTRAINTS else ConfigInvalid
                raise error(f"{constraint.__name__}: {reason}")
        if problem.spec.routed:  # the decode block: its tokens' operands and top_k
            return functools.partial(
                self.kernel_for(problem.op), config=config, **problem.spec.options(problem)
            )
        # rows=m: an lhs with rows past m (the backend contract) is used as it is; pad_lhs configs then
        # need no copy of a decode-sized lhs that its producer padded (kernel_sm90).
        scaled = {} if problem.scale_layout == "none" else {"scale_layout": problem.scale_layout}
        return functools.partial(
            self.kernel_for(problem.op),
            config=config,
            num_sms=device.core_count,
            transpose_rhs=problem.transpose_rhs,
            out_dtype=jnp.dtype(problem.out_dtype),
            rows=problem.m,
            **scaled,
        )

    def timer(self) -> Timer:
        from moetune.kernels.backends.mosaic_gpu.timer import CuptiTimer

        return CuptiTimer()


def _space(problem: Problem) -> types.ModuleType:
    """The search space module of `problem`'s kernel: the decode block's for the op routing its tokens
    itself, the weight gradient's for an op with one output slice per expert, the forward kernels'
    otherwise."""
    if problem.spec.routed:
        from moetune.kernels.backends.mosaic_gpu import space_decode

        return space_decode
    if problem.spec.out_grouped:
        from moetune.kernels.backends.mosaic_gpu import space_drhs

        return space_drhs
    from moetune.kernels.backends.mosaic_gpu import space

    return space
