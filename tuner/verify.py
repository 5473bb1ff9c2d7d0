"""The check every candidate passes before it may be timed.

The check, per routing draw:
  1. poison: a NaN-filled buffer of the output's size is allocated (filled on the device) and freed right
     before the call, so the allocator is likely to hand the kernel poisoned memory and rows it forgets
     to write show up;
  2. rows past sum(group_sizes) must be exactly zero (ragged_dot's contract); for an op with one output
     slice per expert (`out_grouped`, the weight gradient), every expert with no rows;
  3. no NaN in the computed rows (experts) (NaN never passes, whatever the tolerance);
  4. relative error against the float32 reference within the dtype's tolerance, row by row: the worst
     row's ||out_r - ref_r|| / ||ref_r||, so that one wrong tile among thousands cannot hide in the
     norm of the whole output (a 128x128 tile of a 32768x28672 output is 0.4% of it). A per-expert
     output's rows are its last axis's vectors (each expert's [K, N] slice, row by row).
Checks 2-4 run on the device in one fused computation; only a few scalars come back to the host, never
the output or the reference (gigabytes each for the largest MoE shapes; for those the reference covers a
sample of output rows, or of every expert's K indices: input_cache.sample_axes).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from moetune.kernels import reference
from moetune.kernels.errors import WrongResult
from moetune.kernels.problem import Problem
from moetune.tuner.input_cache import (
    InputCache,
    Inputs,
    Reference,
    live_slices,
    reference_row_count,
    reference_shape,
    sample_axes,
)


def shape_dtypes(problem: Problem) -> tuple[jax.ShapeDtypeStruct, ...]:
    """The argument shapes a kernel is compiled for, the op's operands in call order (for the grouped
    GEMMs: lhs [m, k], rhs, group sizes int32 [g])."""
    return problem.spec.shape_dtypes(problem)


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def _nan_filled(shape: tuple[int, ...], dtype: Any) -> jax.Array:
    return jnp.full(shape, jnp.nan, dtype)


def poisoned_call(
    fn: Callable[..., Any], args: tuple, out_shape: tuple[int, ...], out_dtype: Any
) -> jax.Array:
    """Call `fn` right after a NaN-filled buffer of the output's size was allocated and freed."""
    poison = jax.block_until_ready(_nan_filled(tuple(out_shape), jnp.dtype(out_dtype)))
    poison.delete()
    return jax.block_until_ready(fn(*args))


@functools.partial(jax.jit, static_argnames=("axis",), compiler_options=reference.UNTUNED_COMPILE)
def _compare(
    out: jax.Array, ref: jax.Array, ref_rows: jax.Array, live: jax.Array, axis: int
) -> tuple[jax.Array, ...]:
    """(nonzero values where `live` [out.shape[0]] is False, NaN values where it is True, and the largest
    row's squared error and squared reference norm, as the pair whose ratio is largest) over the
    reference's indices `ref_rows` along `axis`."""
    inside = live.reshape(live.shape + (1,) * (out.ndim - 1))
    out32 = out.astype(jnp.float32)
    tail_bad = jnp.count_nonzero(~inside & (out32 != 0))  # NaN != 0, so NaN in the tail counts too
    nans = jnp.count_nonzero(inside & jnp.isnan(out32))
    diff = jnp.take(out32, ref_rows, axis=axis) - ref
    diff, ref = diff.reshape(-1, diff.shape[-1]), ref.reshape(-1, ref.shape[-1])
    diff_sq = jnp.sum(diff * diff, axis=1)  # inf or NaN where `out` holds inf or NaN
    ref_sq = jnp.sum(ref * ref, axis=1)
    # The worst row by relative error; a row with a zero reference is worst unless its error is zero too.
    ratio = jnp.where(
        ref_sq > 0, diff_sq / jnp.where(ref_sq > 0, ref_sq, 1.0), jnp.where(diff_sq == 0, 0.0, jnp.inf)
    )
    ratio = jnp.where(jnp.isnan(ratio), jnp.inf, ratio)
    worst = jnp.argmax(ratio)
    return tail_bad, nans, diff_sq[worst], ref_sq[worst]


def relative_error_from_squares(diff_sq: float, ref_sq: float) -> float:
    """||out - ref|| / ||ref|| from the squared norms; inf for a non-finite difference, and against a zero
    reference 0.0 when the difference is zero too (the semantics of reference.relative_error)."""
    if not np.isfinite(diff_sq):
        return float("inf")
    if ref_sq == 0.0:
        return 0.0 if diff_sq == 0.0 else float("inf")
    return float(np.sqrt(diff_sq) / np.sqrt(ref_sq))


def check_output(out: jax.Array, ref: Reference, group_sizes: Sequence[int], problem: Problem) -> float:
    """The worst row's relative error of `out`; raises WrongResult when it must not pass (the tolerance
    is the op's, by output dtype)."""
    expected_shape = problem.out_shape
    if tuple(out.shape) != expected_shape:
        raise WrongResult(f"output shape {tuple(out.shape)} is not {expected_shape}")
    if jnp.dtype(out.dtype) != jnp.dtype(problem.out_dtype):
        raise WrongResult(f"output dtype {out.dtype} is not {problem.out_dtype}")
    assigned = min(int(np.sum(group_sizes)), problem.m)
    live = live_slices(problem, group_sizes)
    checked = _compare(out, ref.values, ref.rows, live, sample_axes(problem)[1])
    tail_bad, nans, diff_sq, ref_sq = (x.item() for x in jax.device_get(checked))
    if tail_bad and problem.spec.out_grouped:
        raise WrongResult(f"{tail_bad} values of the {int(np.sum(~live))} experts with no rows are not zero")
    if tail_bad:
        raise WrongResult(f"{tail_bad} values in rows past sum(group_sizes)={assigned} are not zero")
    if nans:
        where = "the experts holding rows" if problem.spec.out_grouped else f"rows [0, {assigned})"
        raise WrongResult(f"output holds {nans} NaN values in {where}")
    error = relative_error_from_squares(float(diff_sq), float(ref_sq))
    limit = problem.spec.tolerance_for(problem.out_dtype)
    if not error <= limit:
        raise WrongResult(
            f"relative error {error:.3g} (worst row) exceeds the {problem.out_dtype} tolerance {limit:g}"
        )
    return error


def warm(inputs: Inputs, cache: InputCache) -> tuple[float, float]:
    """Compile, without running it, the problem's float32 reference program, and compile the check's
    device programs (by running them once on stand-in data: an output-sized zero buffer, small work), so
    that `verify` only runs programs. The references themselves are made by the first `verify` of the
    problem, while the worker holds the device: for the largest problems a reference is seconds of
    float32 GEMM, which next to another worker's timing would inflate that timing severalfold. Once per
    problem: later trials find the references made and do nothing here.

    Returns the seconds spent (compiling the reference, compiling and running the checks): (0, 0) when
    this was done before for the problem."""
    if cache.checks_compiled(inputs):
        return 0.0, 0.0
    problem = inputs.problem
    started = time.perf_counter()
    rows = reference_row_count(problem)
    lhs_axis, out_axis = sample_axes(problem)
    reference.rows_reference_program(problem, rows, lhs_axis)
    compiled = time.perf_counter()
    stand_in = jnp.zeros(problem.out_shape, jnp.dtype(problem.out_dtype))
    stand_in_ref = jnp.zeros(reference_shape(problem, rows), jnp.float32)
    dead = np.zeros(problem.out_shape[0], dtype=bool)
    ids = jnp.arange(rows, dtype=jnp.int32)
    jax.block_until_ready(_compare(stand_in, stand_in_ref, ids, dead, out_axis))
    _nan_filled(problem.out_shape, jnp.dtype(problem.out_dtype)).delete()
    cache.mark_checks_compiled(inputs)
    return compiled - started, time.perf_counter() - compiled


def verify(
    fn: Callable[..., Any], inputs: Inputs, cache: InputCache, draws: Sequence[Sequence[int]]
) -> float:
    """Check `fn` on every draw: the largest relative error, or WrongResult at the first failure."""
    problem = inputs.problem
    worst = 0.0
    for sizes in draws:
        args = cache.verify_args(inputs, sizes)
        ref = cache.reference(inputs, sizes)
        out = poisoned_call(fn, args, problem.out_shape, problem.out_dtype)
        worst = max(worst, check_output(out, ref, sizes, problem))
        del out  # the next draw's poison should land where this output was
    return worst
