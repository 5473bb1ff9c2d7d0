"""The grouped GEMM: out[rows of g] = lhs[rows of g] @ rhs[g], jax.lax.ragged_dot's semantics.

lhs [m, k], rhs [g, k, n] ([g, n, k] when `transpose_rhs`), group sizes [g] int32 -> out [m, n]. Rows are
grouped contiguously by expert, accumulation is float32, rows past sum(group_sizes) are zero.

Its operands, dims, FLOPs and reference serve the ops that fuse a gated epilogue into it as well
(`gated`: grouped_matmul_swiglu, grouped_matmul_geglu), which differ only in what follows the product.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from moetune.kernels.ops.spec import Operand, OpSpec, Vjp
from moetune.kernels.problem import Problem

if TYPE_CHECKING:
    import jax

LHS = Operand("lhs", lambda p: (p.m, p.k), lambda p: p.lhs_dtype, stddev=lambda p: 1.0)
# rhs scaled by 1/sqrt(k) keeps outputs near unit size for every k, so tolerances mean the same.
RHS = Operand(
    "rhs", lambda p: p.rhs_shape, lambda p: p.rhs_dtype, stddev=lambda p: 1.0 / math.sqrt(p.k), weights=True
)
GROUP_SIZES = Operand("group_sizes", lambda p: (p.g,), lambda p: "int32", kind="group_sizes")
OPERANDS = (LHS, RHS, GROUP_SIZES)


def dims_of(lhs: Any, rhs: Any, group_sizes: Any, transpose_rhs: bool) -> tuple[int, int, int, int]:
    """(m, k, n, g) of lhs [M, K] and rhs [G, K, N] (or [G, N, K]); ValueError naming the first misfit."""
    if len(lhs.shape) != 2:
        raise ValueError(f"lhs must be [M, K]; got shape {tuple(lhs.shape)}")
    if len(rhs.shape) != 3:
        raise ValueError(
            f"rhs must be [G, {'N, K' if transpose_rhs else 'K, N'}]; got shape {tuple(rhs.shape)}"
        )
    m, k = lhs.shape
    g = rhs.shape[0]
    rhs_k, n = (rhs.shape[2], rhs.shape[1]) if transpose_rhs else (rhs.shape[1], rhs.shape[2])
    if rhs_k != k:
        layout = "[G, N, K]" if transpose_rhs else "[G, K, N]"
        raise ValueError(f"lhs has K={k} but rhs {layout} has K={rhs_k} (shape {tuple(rhs.shape)})")
    if group_sizes is not None:
        if tuple(group_sizes.shape) != (g,):
            raise ValueError(f"group_sizes must have shape ({g},) for G={g}; got {tuple(group_sizes.shape)}")
        if not np.issubdtype(group_sizes.dtype, np.integer):
            raise ValueError(f"group_sizes must be integers (int32); got dtype {group_sizes.dtype}")
    return int(m), int(k), int(n), int(g)


def flops(problem: Problem) -> int:
    """2 m k n: every row multiplies by one expert (an epilogue's few ops per output are left out)."""
    return 2 * problem.m * problem.k * problem.n


def reference(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, transpose_rhs: bool) -> jax.Array:
    from moetune.kernels.reference import reference_grouped_matmul  # jax: imported where a reference runs

    return reference_grouped_matmul(lhs, rhs, group_sizes, transpose_rhs=transpose_rhs)


SPEC = OpSpec(
    name="grouped_matmul",
    summary="out[M, N] = lhs[M, K] @ rhs[g] for each contiguous group g of rows",
    operands=OPERANDS,
    out_shape=lambda p: (p.m, p.n),
    reference=reference,
    dims_of=dims_of,
    flops=flops,
    # dlhs = dout @ rhs[g]^T is this op with the other rhs layout; drhs is the weight gradient.
    vjp=Vjp(dlhs="grouped_matmul", drhs="grouped_matmul_drhs"),
)


def _even_n(problem: Problem) -> str | None:
    return None if problem.n % 2 == 0 else f"needs an even n (gate and up halves); got n={problem.n}"


def gated(name: str, activation: str, summary: str) -> OpSpec:
    """The grouped GEMM into rhs [G, K, 2F] followed by act(gate) * up on its float32 product, gate
    columns first, then up: out [M, F]. `activation` names a gate of kernels.moe.reference.GATES."""

    def gated_reference(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, transpose_rhs: bool):
        from moetune.kernels.moe.reference import gated_activation

        return gated_activation(activation, reference(lhs, rhs, group_sizes, transpose_rhs=transpose_rhs))

    gated_reference.__name__ = f"{name}_reference"
    return OpSpec(
        name=name,
        summary=summary,
        operands=OPERANDS,
        out_shape=lambda p: (p.m, p.n // 2),
        reference=gated_reference,
        dims_of=dims_of,
        flops=flops,
        checks=(_even_n,),
        epilogue=activation,
        rhs_columns_per_out_column=2,
        out_columns="F",
        vjp=Vjp(dlhs="grouped_matmul", drhs="grouped_matmul_drhs", product="grouped_matmul"),
    )
