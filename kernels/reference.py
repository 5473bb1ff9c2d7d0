"""The reference every candidate is checked against: each op's float32 reference (its spec's, built on
`reference_grouped_matmul`, jax.lax.ragged_dot in float32), compiled without autotuning, and the
tolerances."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from moetune.kernels import ops
from moetune.kernels.errors import WrongResult
from moetune.kernels.ops.spec import TOLERANCE
from moetune.kernels.problem import Problem, dtype_name

# How the reference and the check programs are compiled: XLA's GEMM autotuning (on by default on GPUs)
# costs seconds per new shape and buys nothing for a program that runs once per draw. Never for the
# kernels or the XLA baseline being timed. Ignored where there is nothing to autotune (CPU).
UNTUNED_COMPILE = {"xla_gpu_autotune_level": 0}
_HALF_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))

_TRANSPOSED = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((1,), (2,)), ((), ())),
    lhs_ragged_dimensions=(0,),
    rhs_group_dimensions=(0,),
)


def reference_grouped_matmul(
    lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, transpose_rhs: bool = False
) -> jax.Array:
    """jax.lax.ragged_dot with float32 products and float32 accumulation, a float32 result; rhs is
    [G, N, K] when `transpose_rhs`.

    Operands of one 16-bit dtype (bf16 or f16) go in as they are, accumulated in float32: the product of
    two such values is exact in float32, so this is the float32 computation, and on a GPU it runs on the
    tensor cores. Casting them to float32 first would force a full-precision float32 GEMM, an order of
    magnitude slower on Hopper, which a tuner pays for every new problem while it holds the GPU. Other
    operands are cast to float32 and multiplied at HIGHEST precision."""
    same_half = jnp.dtype(lhs.dtype) == jnp.dtype(rhs.dtype) and jnp.dtype(lhs.dtype) in _HALF_DTYPES
    if not same_half:
        lhs, rhs = jnp.asarray(lhs, jnp.float32), jnp.asarray(rhs, jnp.float32)
    precision = lax.Precision.DEFAULT if same_half else lax.Precision.HIGHEST
    sizes = jnp.asarray(group_sizes, jnp.int32)
    if transpose_rhs:
        return lax.ragged_dot_general(
            lhs, rhs, sizes, _TRANSPOSED, precision=precision, preferred_element_type=jnp.float32
        )
    return lax.ragged_dot(lhs, rhs, sizes, precision=precision, preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnames=("op", "transpose_rhs"), compiler_options=UNTUNED_COMPILE)
def _reference(*operands: jax.Array, op: str, transpose_rhs: bool) -> jax.Array:
    return ops.get(op).reference(*operands, transpose_rhs=transpose_rhs)


@functools.partial(jax.jit, static_argnames=("op", "transpose_rhs", "axis"), compiler_options=UNTUNED_COMPILE)
def _reference_of_rows(
    lhs: jax.Array, rows: jax.Array, *operands: jax.Array, op: str, transpose_rhs: bool, axis: int
) -> jax.Array:
    spec = ops.get(op)
    # A scale of lhs with one entry per lhs row (FP8 per token or per 1x128 block) is sampled with it.
    operands = tuple(
        jnp.take(x, rows, axis=0) if axis == 0 and o.scales == "lhs" and x.shape[0] == lhs.shape[0] else x
        for o, x in zip(spec.operands[1:], operands, strict=True)
    )
    return spec.reference(jnp.take(lhs, rows, axis=axis), *operands, transpose_rhs=transpose_rhs)


@functools.lru_cache(maxsize=64)
def rows_reference_program(problem: Problem, rows: int, axis: int = 0) -> Callable[..., jax.Array]:
    """Compiled, not run: (lhs [m, k], row ids int32 [rows], the op's other operands, with the group sizes
    of those rows) -> the float32 reference of lhs[row ids], [rows, out_n]. `axis=1` picks lhs columns
    instead (K indices, for an op with one output slice per expert). Compiling apart from running lets a
    tuner worker compile while another worker times a kernel, and run it only while it holds the device."""
    lhs, *others = problem.spec.shape_dtypes(problem)
    return _reference_of_rows.lower(
        lhs,
        jax.ShapeDtypeStruct((rows,), jnp.int32),
        *others,
        op=problem.op,
        transpose_rhs=problem.transpose_rhs,
        axis=axis,
    ).compile()


def reference_of(problem: Problem) -> Callable[..., jax.Array]:
    """(the op's operands: lhs, rhs, group_sizes) -> the float32 result a kernel for `problem` must match,
    [m, out_n]: one compiled program per shape (without autotuning, UNTUNED_COMPILE). Call it outside
    jit: options like these are only taken by a top-level jit."""
    return functools.partial(_reference, op=problem.op, transpose_rhs=problem.transpose_rhs)


def tolerance(dtype: Any) -> float:
    """Largest relative error accepted for a result of `dtype` ('bf16', jnp.bfloat16, ...) by default;
    an op's spec may set its own (OpSpec.tolerance)."""
    return TOLERANCE[dtype_name(dtype)]


def relative_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in float64; inf when `out` holds NaN or inf, so such a result never passes.

    A zero reference (every group empty) gives 0.0 for an all-zero `out` and inf otherwise.
    """
    out64 = np.asarray(out, dtype=np.float64)
    ref64 = np.asarray(ref, dtype=np.float64)
    if out64.shape != ref64.shape:
        raise WrongResult(f"output shape {out64.shape} != reference shape {ref64.shape}")
    if not np.all(np.isfinite(out64)):
        return float("inf")
    diff = float(np.linalg.norm(out64 - ref64))
    norm = float(np.linalg.norm(ref64))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / norm
