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
HALF_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# jax.lax.ragged_dot outside TPUs is one dense dot of lhs expanded to [G, M, K] (jax's
# _ragged_dot_general_impl): G times the bytes and FLOPs of the grouped GEMM, 256 GiB for Qwen3-Next's 512
# experts at 16384 tokens. Past this expansion the reference walks row chunks instead (a loop of small
# GEMMs, each chunk by its own experts' weights).
DENSE_EXPANSION_MAX_BYTES = 2 << 30
CHUNK_ROWS = 128

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
    same_half = jnp.dtype(lhs.dtype) == jnp.dtype(rhs.dtype) and jnp.dtype(lhs.dtype) in HALF_DTYPES
    if not same_half:
        lhs, rhs = jnp.asarray(lhs, jnp.float32), jnp.asarray(rhs, jnp.float32)
    precision = lax.Precision.DEFAULT if same_half else lax.Precision.HIGHEST
    sizes = jnp.asarray(group_sizes, jnp.int32)
    if expands_past_bound(rhs.shape[0], lhs):
        return chunked_grouped_matmul(lhs, rhs, sizes, transpose_rhs=transpose_rhs, precision=precision)
    if transpose_rhs:
        return lax.ragged_dot_general(
            lhs, rhs, sizes, _TRANSPOSED, precision=precision, preferred_element_type=jnp.float32
        )
    return lax.ragged_dot(lhs, rhs, sizes, precision=precision, preferred_element_type=jnp.float32)


def expands_past_bound(groups: int, *row_operands: jax.Array) -> bool:
    """Whether ragged_dot's lowering, which expands each [M, K] row operand to [G, M, K], would pass
    DENSE_EXPANSION_MAX_BYTES: there a reference walks row chunks instead."""
    expanded = sum(groups * op.shape[0] * op.shape[1] * jnp.dtype(op.dtype).itemsize for op in row_operands)
    return expanded > DENSE_EXPANSION_MAX_BYTES


def _chunk_group_pairs(group_sizes: jax.Array, m: int, chunk_rows: int) -> tuple[int, int, Callable]:
    """(chunks, pairs bound, pair p -> (group, first row, its rows' mask [chunk_rows])) of the row chunks
    of `chunk_rows` rows and the groups they meet: group g's rows are contiguous, so chunk c meets the
    groups from the one holding its first row to the one holding its last, and the pairs number at most
    chunks + G. A pair past the last has an all-False mask; rows past sum(group_sizes) are in no mask."""
    g = group_sizes.shape[0]
    chunks = max(1, -(-m // chunk_rows))
    ends = jnp.cumsum(group_sizes)
    starts = ends - group_sizes
    total = jnp.minimum(ends[-1], m)
    first_row = jnp.arange(chunks, dtype=jnp.int32) * chunk_rows
    last_row = jnp.minimum(first_row + chunk_rows, jnp.maximum(total, 1)) - 1
    # The group holding row r: how many groups end at or before it (empty groups end where the last did).
    first_group = jnp.searchsorted(ends, first_row, side="right").astype(jnp.int32)
    last_group = jnp.maximum(jnp.searchsorted(ends, last_row, side="right").astype(jnp.int32), first_group)
    pairs = last_group - first_group + 1
    pair_ends = jnp.cumsum(pairs)

    def pair(p):
        chunk = jnp.minimum(jnp.searchsorted(pair_ends, p, side="right"), chunks - 1).astype(jnp.int32)
        group = jnp.minimum(first_group[chunk] + p - (pair_ends[chunk] - pairs[chunk]), g - 1)
        row0 = chunk * chunk_rows
        index = row0 + jnp.arange(chunk_rows)
        mine = (index >= starts[group]) & (index < jnp.minimum(ends[group], total)) & (p < pair_ends[-1])
        return group, row0, mine

    return chunks, chunks + g, pair


def _pad_rows(x: jax.Array, rows: int) -> jax.Array:
    return jnp.zeros((rows, x.shape[1]), x.dtype).at[: x.shape[0]].set(x)


def chunked_grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    transpose_rhs: bool = False,
    precision: lax.Precision = lax.Precision.DEFAULT,
    chunk_rows: int = CHUNK_ROWS,
) -> jax.Array:
    """The float32 grouped GEMM as a loop over (row chunk, group) pairs (_chunk_group_pairs), in bytes
    and FLOPs of the rows' own experts. Each pair multiplies the chunk by rhs[g] and keeps g's rows; rows
    past sum(group_sizes) stay zero."""
    m, k = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    chunks, bound, pair_of = _chunk_group_pairs(group_sizes, m, chunk_rows)
    padded = _pad_rows(lhs, chunks * chunk_rows)
    contract = ((1,), (1,)) if transpose_rhs else ((1,), (0,))

    def pair(p, out):
        group, row0, mine = pair_of(p)
        rows = lax.dynamic_slice(padded, (row0, 0), (chunk_rows, k))
        product = lax.dot_general(
            rows, rhs[group], (contract, ((), ())), precision=precision, preferred_element_type=jnp.float32
        )
        held = lax.dynamic_slice(out, (row0, 0), (chunk_rows, n))
        return lax.dynamic_update_slice(out, jnp.where(mine[:, None], product, held), (row0, 0))

    out = lax.fori_loop(0, bound, pair, jnp.zeros((chunks * chunk_rows, n), jnp.float32))
    return out[:m]


def chunked_weight_gradient(
    lhs: jax.Array,
    dout: jax.Array,
    group_sizes: jax.Array,
    *,
    precision: lax.Precision = lax.Precision.DEFAULT,
    chunk_rows: int = CHUNK_ROWS,
) -> jax.Array:
    """out[g] = lhs[rows of g]^T @ dout[rows of g] in float32, [G, K, N], as a loop over (row chunk,
    group) pairs (_chunk_group_pairs): each adds its masked rows' outer products into out[g], so memory
    is the output and one chunk, where ragged_dot's weight gradient expands lhs to [G, M, K]."""
    m, k = lhs.shape
    n = dout.shape[1]
    g = group_sizes.shape[0]
    chunks, bound, pair_of = _chunk_group_pairs(group_sizes, m, chunk_rows)
    lhs_rows, dout_rows = _pad_rows(lhs, chunks * chunk_rows), _pad_rows(dout, chunks * chunk_rows)

    def pair(p, out):
        group, row0, mine = pair_of(p)
        # Both sides masked: a row of another group contributes 0, never 0 * inf.
        rows = jnp.where(mine[:, None], lax.dynamic_slice(lhs_rows, (row0, 0), (chunk_rows, k)), 0)
        grads = jnp.where(mine[:, None], lax.dynamic_slice(dout_rows, (row0, 0), (chunk_rows, n)), 0)
        product = lax.dot_general(
            rows, grads, (((0,), (0,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
        )
        return out.at[group].add(product)

    return lax.fori_loop(0, bound, pair, jnp.zeros((g, k, n), jnp.float32))


@functools.partial(jax.jit, static_argnames=("op", "options"), compiler_options=UNTUNED_COMPILE)
def _reference(*operands: jax.Array, op: str, options: tuple[tuple[str, Any], ...]) -> jax.Array:
    return ops.get(op).reference(*operands, **dict(options))


@functools.partial(jax.jit, static_argnames=("op", "options", "axis"), compiler_options=UNTUNED_COMPILE)
def _reference_of_rows(
    lhs: jax.Array,
    rows: jax.Array,
    *operands: jax.Array,
    op: str,
    options: tuple[tuple[str, Any], ...],
    axis: int,
) -> jax.Array:
    spec = ops.get(op)
    # An operand with one entry per lhs row is sampled with it: a scale of lhs per row (FP8 per token or
    # per 1x128 block), a routed op's router logits.
    operands = tuple(
        jnp.take(x, rows, axis=0) if axis == 0 and _per_lhs_row(o, x, lhs) else x
        for o, x in zip(spec.operands[1:], operands, strict=True)
    )
    return spec.reference(jnp.take(lhs, rows, axis=axis), *operands, **dict(options))


def _per_lhs_row(operand: Any, value: jax.Array, lhs: jax.Array) -> bool:
    if operand.kind == "routing":
        return True
    return operand.scales == "lhs" and value.shape[0] == lhs.shape[0]


def _options(problem: Problem) -> tuple[tuple[str, Any], ...]:
    """The op's keyword options of `problem` (OpSpec.options), hashable: a static argument of the jits."""
    return tuple(sorted(problem.spec.options(problem).items()))


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
        options=_options(problem),
        axis=axis,
    ).compile()


def reference_of(problem: Problem) -> Callable[..., jax.Array]:
    """(the op's operands: lhs, rhs, group_sizes) -> the float32 result a kernel for `problem` must match,
    [m, out_n]: one compiled program per shape (without autotuning, UNTUNED_COMPILE). Call it outside
    jit: options like these are only taken by a top-level jit."""
    return functools.partial(_reference, op=problem.op, options=_options(problem))


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
