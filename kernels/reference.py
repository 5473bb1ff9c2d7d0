"""The reference every candidate is checked against: jax.lax.ragged_dot in float32 (followed by the op's
epilogue, `reference_of`), and the tolerances."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from moetune.kernels.errors import Unsupported, WrongResult
from moetune.kernels.moe.reference import gated_activation
from moetune.kernels.problem import GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU, Problem, dtype_name

# Relative error ||out - ref|| / ||ref|| a result may have, by output dtype: a few units of the dtype's
# rounding (bf16 keeps 8 mantissa bits, f16 11, f32 24), with room for a different summation order.
_TOLERANCE = {"bfloat16": 1e-2, "float16": 1e-3, "float32": 1e-5}

# How the reference and the check programs are compiled: XLA's GEMM autotuning (on by default on GPUs)
# costs seconds per new shape and buys nothing for a program that runs once per draw. Never for the
# kernels or the XLA baseline being timed. Ignored where there is nothing to autotune (CPU).
UNTUNED_COMPILE = {"xla_gpu_autotune_level": 0}
_HALF_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# Each op's epilogue after the product ("" for none).
_ACTIVATIONS = {GROUPED_MATMUL: "", GROUPED_MATMUL_SWIGLU: "swiglu"}

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


def _activation(problem: Problem) -> str:
    """The epilogue `problem`'s op applies after the product ("" for none)."""
    if problem.op not in _ACTIVATIONS:
        raise Unsupported(f"no reference for op={problem.op!r}")
    return _ACTIVATIONS[problem.op]


def _product_then_epilogue(
    lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, transpose_rhs: bool, activation: str
) -> jax.Array:
    product = reference_grouped_matmul(lhs, rhs, group_sizes, transpose_rhs=transpose_rhs)
    return gated_activation(activation, product) if activation else product


@functools.partial(jax.jit, static_argnames=("transpose_rhs", "activation"), compiler_options=UNTUNED_COMPILE)
def _reference(
    lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, transpose_rhs: bool, activation: str
) -> jax.Array:
    return _product_then_epilogue(lhs, rhs, group_sizes, transpose_rhs, activation)


@functools.partial(jax.jit, static_argnames=("transpose_rhs", "activation"), compiler_options=UNTUNED_COMPILE)
def _reference_of_rows(
    lhs: jax.Array,
    rows: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    transpose_rhs: bool,
    activation: str,
) -> jax.Array:
    return _product_then_epilogue(lhs[rows], rhs, group_sizes, transpose_rhs, activation)


@functools.lru_cache(maxsize=64)
def rows_reference_program(problem: Problem, rows: int) -> Callable[[Any, Any, Any, Any], jax.Array]:
    """Compiled, not run: (lhs [m, k], row ids int32 [rows], rhs, group sizes int32 [g] of those rows) ->
    the float32 reference of lhs[row ids], [rows, out_n]. Compiling apart from running lets a tuner worker
    compile while another worker times a kernel, and run it only while it holds the device."""
    activation = _activation(problem)
    return _reference_of_rows.lower(
        jax.ShapeDtypeStruct((problem.m, problem.k), jnp.dtype(problem.lhs_dtype)),
        jax.ShapeDtypeStruct((rows,), jnp.int32),
        jax.ShapeDtypeStruct(problem.rhs_shape, jnp.dtype(problem.rhs_dtype)),
        jax.ShapeDtypeStruct((problem.g,), jnp.int32),
        transpose_rhs=problem.transpose_rhs,
        activation=activation,
    ).compile()


def reference_of(problem: Problem) -> Callable[[Any, Any, Any], jax.Array]:
    """(lhs, rhs, group_sizes) -> the float32 result a kernel for `problem` must match, [m, out_n]: one
    compiled program per shape (without autotuning, UNTUNED_COMPILE). Call it outside jit: options like
    these are only taken by a top-level jit."""
    return functools.partial(_reference, transpose_rhs=problem.transpose_rhs, activation=_activation(problem))


def tolerance(dtype: Any) -> float:
    """Largest relative error accepted for a result of `dtype` ('bf16', jnp.bfloat16, ...)."""
    return _TOLERANCE[dtype_name(dtype)]


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
