"""The `xla` backend: grouped GEMM from plain XLA operations; runs on every device, CPU included.

It closes every fallback chain, so it serves every op: the fused ones as the plain fallback, the grouped
GEMM in float32 followed by the epilogue as a separate XLA op ("grouped_matmul_swiglu",
"grouped_matmul_geglu"), the grouped GEMM's weight gradient ("grouped_matmul_drhs"), the FP8 ops in
every scale layout ("grouped_matmul_fp8", "grouped_matmul_swiglu_fp8"; kernel.py says per layout whether
the scales apply after the sum or inside the dot), and the MoE decode block ("moe_decode_block") as the
unfused MoE path on its grouped GEMM, on FP8 weights ("moe_decode_block_fp8") as the unfused FP8 path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from moetune.kernels.backend import Backend, KernelFn
from moetune.kernels.backends.xla.config import XlaConfig
from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.problem import Problem


class XlaBackend(Backend):
    name = "xla"
    config_cls = XlaConfig
    # The fallback of last resort: every other backend should outrank it where it runs.
    priority = 0
    compiles_without_device = True
    serves_group_offset = True
    prior_compile_s = 0.7  # one jitted XLA program: 0.2-1 s on a busy 2-core CPU
    kernels = {
        "grouped_matmul": "grouped_matmul",
        "grouped_matmul_swiglu": "grouped_matmul_swiglu",
        "grouped_matmul_geglu": "grouped_matmul_geglu",
        "grouped_matmul_drhs": "grouped_matmul_drhs",
        "grouped_matmul_fp8": "grouped_matmul_fp8",
        "grouped_matmul_swiglu_fp8": "grouped_matmul_swiglu_fp8",
        "moe_decode_block": "moe_decode_block",
        "moe_decode_block_fp8": "moe_decode_block_fp8",
    }
    kernel_module = "moetune.kernels.backends.xla.kernel"

    def available(self, device: DeviceFingerprint) -> str | None:
        return None

    def compiles_on_device(self) -> bool:
        # On a GPU, XLA's GEMM autotuner times candidate kernels on the device while it compiles. On the
        # H200 those compiles (the sweep's XLA baselines) slowed other workers' timings up to 2.5x.
        return jax.default_backend() == "gpu"

    def search_space(self, problem: Problem, device: DeviceFingerprint):
        from moetune.kernels.backends.xla import space as xla_space

        return xla_space.space(problem, device)

    def heuristic(self, problem: Problem, device: DeviceFingerprint) -> XlaConfig:
        from moetune.kernels.backends.xla import space as xla_space

        return xla_space.heuristic(problem, device)

    def build(self, problem: Problem, config: KernelConfig) -> KernelFn:
        # The search-space constraints only prune redundant or wasteful points; no XlaConfig computes a
        # wrong result, so build accepts every valid one (the constraints are not a second validity check).
        self.check(problem)
        if not isinstance(config, XlaConfig):
            raise ConfigInvalid(f"xla needs an XlaConfig, not {type(config).__qualname__}")
        kernel = functools.partial(
            self.kernel_for(problem.op),
            config=config,
            out_dtype=jnp.dtype(problem.out_dtype),
            **problem.spec.options(problem),
        )
        if problem.spec.routed:  # its operands are its tokens': no lhs rows past m to drop
            return kernel
        if problem.scale_layout != "none":
            return _first_scaled_rows(functools.partial(kernel, scale_layout=problem.scale_layout), problem.m)
        return _first_rows(kernel, problem.m)


def _first_rows(kernel: Callable[..., Any], m: int) -> KernelFn:
    """`kernel` on lhs's first m rows: the backend contract lets lhs carry rows past m that belong to no
    group, and the XLA strategies size their output by lhs."""

    def on_first_rows(lhs: Any, rhs: Any, group_sizes: Any, row_start: Any = None) -> Any:
        return kernel(lhs[:m] if lhs.shape[0] > m else lhs, rhs, group_sizes, row_start=row_start)

    return on_first_rows


def _first_scaled_rows(kernel: Callable[..., Any], m: int) -> Callable[..., Any]:
    """`_first_rows` for an FP8 op (lhs, lhs_scale, rhs, rhs_scale, group_sizes): a per-row lhs scale
    carries the same rows past m as lhs."""

    def on_first_rows(
        lhs: Any, lhs_scale: Any, rhs: Any, rhs_scale: Any, group_sizes: Any, row_start: Any = None
    ) -> Any:
        if lhs.shape[0] > m:
            per_row = lhs_scale.shape[0] == lhs.shape[0]
            lhs, lhs_scale = lhs[:m], lhs_scale[:m] if per_row else lhs_scale
        return kernel(lhs, lhs_scale, rhs, rhs_scale, group_sizes, row_start=row_start)

    return on_first_rows
