"""The grouped GEMM's weight gradient: out[g] = lhs[rows of g]^T @ dout[rows of g], the cotangent of
rhs in grouped_matmul's VJP.

lhs [m, k], dout [m, n], group sizes [g] int32 -> out [g, k, n] ([g, n, k] when `transpose_rhs`: the
layout of the weights it is the gradient of). The ragged dimension, rows grouped contiguously by expert,
is the contracted one; accumulation is float32; an expert with no rows gets exactly zero and rows past
sum(group_sizes) contribute nothing. In its Problem, n is dout's columns and rhs_dtype is dout's dtype.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from moetune.kernels.ops.grouped_matmul import GROUP_SIZES, LHS, flops
from moetune.kernels.ops.spec import Operand, OpSpec

if TYPE_CHECKING:
    import jax
    from jax import lax


@functools.cache
def ragged_contraction() -> lax.RaggedDotDimensionNumbers:
    """Contract lhs [M, K] with dout [M, N] over their rows, the ragged dimension -> [G, K, N]."""
    from jax import lax

    return lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((0,), (0,)), ((), ())),
        lhs_ragged_dimensions=(0,),
        rhs_group_dimensions=(),
    )


def __getattr__(name: str) -> Any:
    # RAGGED_CONTRACTION, as the xla backend's kernel imports it: built when first read (it is jax's), so
    # the spec imports without jax.
    if name == "RAGGED_CONTRACTION":
        return ragged_contraction()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# An output gradient of unit size, like the forward's output the rhs draw is scaled for.
DOUT = Operand("dout", lambda p: (p.m, p.n), lambda p: p.rhs_dtype, stddev=lambda p: 1.0)


def dims_of(lhs: Any, dout: Any, group_sizes: Any, transpose_rhs: bool) -> tuple[int, int, int, int]:
    """(m, k, n, g) of lhs [M, K], dout [M, N] and group_sizes [G]; ValueError naming the first misfit.
    G comes from the group sizes, which are required: no operand but them holds it."""
    if len(lhs.shape) != 2:
        raise ValueError(f"lhs must be [M, K]; got shape {tuple(lhs.shape)}")
    if len(dout.shape) != 2 or dout.shape[0] != lhs.shape[0]:
        raise ValueError(f"dout must be [M, N] with lhs's M={lhs.shape[0]}; got shape {tuple(dout.shape)}")
    if group_sizes is None or len(group_sizes.shape) != 1:
        raise ValueError("the weight gradient needs group_sizes [G] (they give the expert count G)")
    if not np.issubdtype(group_sizes.dtype, np.integer):
        raise ValueError(f"group_sizes must be integers (int32); got dtype {group_sizes.dtype}")
    return int(lhs.shape[0]), int(lhs.shape[1]), int(dout.shape[1]), int(group_sizes.shape[0])


def reference(lhs: jax.Array, dout: jax.Array, group_sizes: jax.Array, *, transpose_rhs: bool) -> jax.Array:
    """jax.lax.ragged_dot_general over the ragged rows in float32; 16-bit operands of one dtype go in as
    they are (their products are exact in float32), as in kernels.reference.reference_grouped_matmul.
    Past kernels.reference's bound on ragged_dot's [G, M, K] expansion it walks row chunks instead."""
    import jax.numpy as jnp
    from jax import lax

    from moetune.kernels import reference as grouped_reference

    dtype = jnp.dtype(lhs.dtype)
    same_half = dtype == jnp.dtype(dout.dtype) and dtype in grouped_reference.HALF_DTYPES
    if not same_half:
        lhs, dout = jnp.asarray(lhs, jnp.float32), jnp.asarray(dout, jnp.float32)
    precision = lax.Precision.DEFAULT if same_half else lax.Precision.HIGHEST
    sizes = jnp.asarray(group_sizes, jnp.int32)
    if grouped_reference.expands_past_bound(sizes.shape[0], lhs, dout):
        out = grouped_reference.chunked_weight_gradient(lhs, dout, sizes, precision=precision)
    else:
        out = lax.ragged_dot_general(
            lhs, dout, sizes, ragged_contraction(), precision=precision, preferred_element_type=jnp.float32
        )
    return out.transpose(0, 2, 1) if transpose_rhs else out


SPEC = OpSpec(
    name="grouped_matmul_drhs",
    summary="out[g] = lhs[rows of g]^T @ dout[rows of g] [G, K, N]: the grouped GEMM's weight gradient",
    operands=(LHS, DOUT, GROUP_SIZES),
    out_shape=lambda p: p.rhs_shape,
    reference=reference,
    dims_of=dims_of,
    flops=flops,  # 2 m k n: every row's outer product lands in one expert
    out_grouped=True,
)
