"""The `xla` backend: grouped GEMM from plain XLA operations; runs on every device, CPU included.

It also serves the fused MoE ops as the plain fallback: "grouped_matmul_swiglu" is the grouped GEMM in
float32 followed by the activation as a separate XLA op.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from moetune.kernels.backend import Backend, KernelFn
from moetune.kernels.backends.xla import kernel
from moetune.kernels.backends.xla.config import XlaConfig
from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.problem import GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU, Problem

OPS = (GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU)


class XlaBackend(Backend):
    name = "xla"
    config_cls = XlaConfig
    # The fallback of last resort: every other backend should outrank it where it runs.
    priority = 0
    compiles_without_device = True

    def available(self, device: DeviceFingerprint) -> str | None:
        return None

    def check(self, problem: Problem) -> None:
        if problem.op not in OPS:
            raise Unsupported(f"xla computes op={' or '.join(OPS)}, not op={problem.op!r}")

    def compiles_on_device(self) -> bool:
        # On a GPU, XLA's GEMM autotuner times candidate kernels on the device while it compiles. On the
        # H200 those compiles (the sweep's XLA baselines) slowed other workers' timings up to 2.5x.
        return jax.default_backend() == "gpu"

    def search_space(self, problem: Problem, device: DeviceFingerprint):
        from moetune.search_spaces import xla as xla_space

        return xla_space.space(problem, device)

    def heuristic(self, problem: Problem, device: DeviceFingerprint) -> XlaConfig:
        from moetune.search_spaces import xla as xla_space

        return xla_space.heuristic(problem, device)

    def build(self, problem: Problem, config: KernelConfig) -> KernelFn:
        # The search-space constraints only prune redundant or wasteful points; no XlaConfig computes a
        # wrong result, so build accepts every valid one (the constraints are not a second validity check).
        self.check(problem)
        if not isinstance(config, XlaConfig):
            raise ConfigInvalid(f"xla needs an XlaConfig, not {type(config).__qualname__}")
        if problem.op == GROUPED_MATMUL_SWIGLU:
            return functools.partial(
                kernel.grouped_matmul_swiglu,
                config=config,
                transpose_rhs=problem.transpose_rhs,
                out_dtype=jnp.dtype(problem.out_dtype),
            )
        return functools.partial(
            kernel.grouped_matmul,
            config=config,
            transpose_rhs=problem.transpose_rhs,
            out_dtype=jnp.dtype(problem.out_dtype),
        )
