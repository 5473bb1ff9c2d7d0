"""Grouped GEMM written with plain XLA operations, one function per strategy (config.py lists them).

Every strategy computes exactly what jax.lax.ragged_dot computes: rows are grouped contiguously, group g
owns rows [sum(sizes[:g]), sum(sizes[:g+1])), groups are clipped at M, and rows past the last group are
zero. Products accumulate in float32 and are cast to the output dtype once.

Float32 operands multiply at full float32 precision (lax.Precision.HIGHEST): XLA's GPU default rounds
them to TF32, which measured a relative error of 3e-4 on an H200, thirty times the float32 tolerance
every result is verified against (kernels/reference.py). bf16 and f16 operands are unaffected.

`row_start` (a traced int32 scalar, or None for 0) serves a local slice of experts (jax.lax.ragged_dot's
group_offset, resolved by kernels/api.py): the groups start at that row, so rows before it, like rows
past the last group, belong to no group (zero output, no contribution to a weight gradient).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from moetune.kernels.backends.xla.config import XlaConfig
from moetune.kernels.moe.fp8 import moe_mlp_fp8
from moetune.kernels.moe.layer import moe_mlp_using
from moetune.kernels.moe.reference import gated_activation
from moetune.kernels.ops import fp8_scales
from moetune.kernels.ops.grouped_matmul_drhs import RAGGED_CONTRACTION

# rhs [G, N, K] contracts its last dimension with lhs's; group dimension 0 matches lhs's ragged rows.
_TRANSPOSED_RAGGED_DOT = lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((1,), (2,)), ((), ())),
    lhs_ragged_dimensions=(0,),
    rhs_group_dimensions=(0,),
)


def grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    config: XlaConfig,
    transpose_rhs: bool,
    out_dtype: jnp.dtype,
    row_start: jax.Array | None = None,
) -> jax.Array:
    if config.strategy == "ragged_dot":
        precision = _precision(jnp.promote_types(lhs.dtype, rhs.dtype))
        lhs, group_sizes = _from_row_start(lhs, group_sizes, row_start)
        return _ragged_dot(lhs, rhs, group_sizes, transpose_rhs, out_dtype, precision)
    compute_dtype = jnp.promote_types(lhs.dtype, rhs.dtype)
    lhs, rhs = lhs.astype(compute_dtype), rhs.astype(compute_dtype)
    group_sizes = group_sizes.astype(jnp.int32)
    if config.strategy == "dense_masked":
        out = _dense_masked(lhs, rhs, group_sizes, transpose_rhs, row_start)
    elif config.strategy == "segments":
        out = _segments(lhs, rhs, group_sizes, transpose_rhs, row_start)
    else:
        out = _chunked(lhs, rhs, group_sizes, transpose_rhs, config.chunk_m, config.items_per_step, row_start)
    return out.astype(out_dtype)


def _from_row_start(lhs: jax.Array, group_sizes: jax.Array, row_start: jax.Array | None):
    """For ragged_dot, which knows no row start: the rows before it zeroed and counted into group 0, so
    they come out zero (and contribute nothing to a weight gradient)."""
    if row_start is None:
        return lhs, group_sizes
    before = jnp.arange(lhs.shape[0])[:, None] < row_start
    sizes = group_sizes.astype(jnp.int32)
    return jnp.where(before, jnp.zeros((), lhs.dtype), lhs), sizes.at[0].add(row_start.astype(jnp.int32))


def _gated(
    activation: str,
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    config: XlaConfig,
    transpose_rhs: bool,
    out_dtype: jnp.dtype,
    row_start: jax.Array | None = None,
) -> jax.Array:
    """act(gate) * up of the float32 grouped GEMM [M, 2F] -> [M, F]; gate columns first, then up."""
    f32 = jnp.dtype(jnp.float32)
    product = grouped_matmul(
        lhs, rhs, group_sizes, config=config, transpose_rhs=transpose_rhs, out_dtype=f32, row_start=row_start
    )
    return gated_activation(activation, product).astype(out_dtype)


# The fused ops' plain fallbacks: silu(gate) * up and gelu_tanh(gate) * up.
grouped_matmul_swiglu = functools.partial(_gated, "swiglu")
grouped_matmul_geglu = functools.partial(_gated, "geglu")


def _precision(dtype: jnp.dtype) -> lax.Precision | None:
    return lax.Precision.HIGHEST if dtype == jnp.float32 else None


def _product(spec: str, x: jax.Array, w: jax.Array) -> jax.Array:
    """einsum accumulating in float32; x and w share one dtype (grouped_matmul promoted them)."""
    return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32, precision=_precision(x.dtype))


def _ragged_dot(lhs, rhs, group_sizes, transpose_rhs, out_dtype, precision):
    if transpose_rhs:
        return lax.ragged_dot_general(
            lhs,
            rhs,
            group_sizes,
            _TRANSPOSED_RAGGED_DOT,
            precision=precision,
            preferred_element_type=out_dtype,
        )
    return lax.ragged_dot(lhs, rhs, group_sizes, precision=precision, preferred_element_type=out_dtype)


def _group_bounds(group_sizes: jax.Array, m: int, row_start: jax.Array | None = None):
    """Row ranges [starts[g], ends[g]) of each group, clipped at m like ragged_dot's groups; the first
    group starts at `row_start` (None: row 0)."""
    first = jnp.zeros((1,), jnp.int32) if row_start is None else jnp.reshape(row_start, (1,))
    ends = jnp.minimum(first.astype(jnp.int32) + jnp.cumsum(group_sizes.astype(jnp.int32)), m)
    starts = jnp.minimum(jnp.concatenate([first.astype(ends.dtype), ends[:-1]]), m)
    return starts, ends


def _row_groups(group_sizes: jax.Array, m: int, row_start: jax.Array | None = None) -> jax.Array:
    """Group id of every row; rows before `row_start` and past the last group get G.

    Example: sizes [2, 0, 3], m=6 -> ends [2, 2, 5] -> row groups [0, 0, 2, 2, 2, 3].
    """
    starts, ends = _group_bounds(group_sizes, m, row_start)
    rows = jnp.arange(m, dtype=ends.dtype)
    groups = jnp.searchsorted(ends, rows, side="right")
    return jnp.where(rows < starts[0], group_sizes.shape[0], groups)


def _dense_masked(lhs, rhs, group_sizes, transpose_rhs, row_start=None):
    g = rhs.shape[0]
    spec = "mk,gnk->mgn" if transpose_rhs else "mk,gkn->mgn"
    every_expert = _product(spec, lhs, rhs)
    row_groups = _row_groups(group_sizes, lhs.shape[0], row_start)
    picked = jnp.take_along_axis(every_expert, jnp.minimum(row_groups, g - 1)[:, None, None], axis=1)[:, 0]
    return jnp.where((row_groups < g)[:, None], picked, 0.0)


def _segments(lhs, rhs, group_sizes, transpose_rhs, row_start=None):
    row_groups = _row_groups(group_sizes, lhs.shape[0], row_start)
    spec = "mk,nk->mn" if transpose_rhs else "mk,kn->mn"

    def one_group(g, out):
        return jnp.where((row_groups == g)[:, None], _product(spec, lhs, rhs[g]), out)

    # Group 0 runs outside the loop so that the carry starts with the type the body returns: inside
    # shard_map a loop carry must vary over the same mesh axes as the body's output, and zeros do not.
    first = jnp.where((row_groups == 0)[:, None], _product(spec, lhs, rhs[0]), 0.0)
    return lax.fori_loop(1, rhs.shape[0], one_group, first)


def _chunked(lhs, rhs, group_sizes, transpose_rhs, chunk_m, items_per_step, row_start=None):
    """Work items are the (row chunk, group) overlaps; each multiplies one chunk by one gathered expert.

    Example: chunk_m=4, sizes [3, 6], m=9 -> chunks rows [0-3] [4-7] [8]; group 0 overlaps chunk 0, group
    1 overlaps chunks 0, 1, 2 -> items (chunk, group) = (0,0) (0,1) (1,1) (2,1). There are at most
    chunks + G - 1 overlaps, which is the static item count; unused items are masked out.
    """
    m, k = lhs.shape
    g = rhs.shape[0]
    n = rhs.shape[1 if transpose_rhs else 2]
    chunks, starts, ends, per_step = _work_items(group_sizes, m, g, chunk_m, items_per_step, row_start)

    lhs_chunks = _row_chunks(lhs, chunks, chunk_m)
    spec = "bck,bnk->bcn" if transpose_rhs else "bck,bkn->bcn"

    def one_step(out, items):
        chunk_ids, group_ids, is_valid = items
        product = _product(spec, lhs_chunks[chunk_ids], rhs[group_ids])
        keep = _item_rows(chunk_ids, group_ids, is_valid, starts, ends, chunk_m)
        return out.at[chunk_ids].add(jnp.where(keep[..., None], product, 0.0)), None

    out = _scan_items(one_step, jnp.zeros((chunks, chunk_m, n), jnp.float32), per_step)
    return out.reshape(chunks * chunk_m, n)[:m]


def _work_items(group_sizes, m, g, chunk_m, items_per_step, row_start=None):
    """The (row chunk, group) overlaps of _chunked's docstring as (chunks, starts, ends, per-step item
    arrays (chunk ids, group ids, valid) of shape [steps, step])."""
    chunks = -(-m // chunk_m)
    max_items = chunks + g - 1
    step = min(items_per_step, max_items)
    steps = -(-max_items // step)

    starts, ends = _group_bounds(group_sizes, m, row_start)
    nonempty = ends > starts
    first_chunk = starts // chunk_m
    last_chunk = (ends - 1) // chunk_m
    item_counts = jnp.where(nonempty, last_chunk - first_chunk + 1, 0)
    items_end = jnp.cumsum(item_counts)
    item = jnp.arange(steps * step, dtype=items_end.dtype)
    valid = item < items_end[-1]
    item_group = jnp.minimum(jnp.searchsorted(items_end, item, side="right"), g - 1)
    item_chunk = first_chunk[item_group] + item - (items_end - item_counts)[item_group]
    item_chunk = jnp.where(valid, item_chunk, 0)
    per_step = (item_chunk.reshape(steps, step), item_group.reshape(steps, step), valid.reshape(steps, step))
    return chunks, starts, ends, per_step


def _row_chunks(x, chunks, chunk_m):
    """x [m, c] zero-padded to whole chunks: [chunks, chunk_m, c]."""
    return jnp.pad(x, ((0, chunks * chunk_m - x.shape[0]), (0, 0))).reshape(chunks, chunk_m, x.shape[1])


def _item_rows(chunk_ids, group_ids, is_valid, starts, ends, chunk_m):
    """[items, chunk_m]: whether each row of an item's chunk belongs to the item's group."""
    rows = chunk_ids[:, None] * chunk_m + jnp.arange(chunk_m, dtype=chunk_ids.dtype)[None, :]
    return is_valid[:, None] & (rows >= starts[group_ids][:, None]) & (rows < ends[group_ids][:, None])


def _scan_items(one_step, out, per_step):
    # The first step runs outside the loop, as in _segments: the carry then has the body's type.
    out, _ = one_step(out, tuple(x[0] for x in per_step))
    if per_step[0].shape[0] > 1:
        out, _ = lax.scan(functools.partial(_step_if_used, one_step), out, tuple(x[1:] for x in per_step))
    return out


def _step_if_used(one_step, out, items):
    """`one_step` unless all its items are unused: the item count is static (chunks + G - 1), so the
    steps past the groups (a static receive buffer's empty tail) are skipped at run time and the work
    follows the real rows."""
    return lax.cond(items[2].any(), one_step, lambda carry, _: (carry, None), out, items)


def grouped_matmul_drhs(
    lhs: jax.Array,
    dout: jax.Array,
    group_sizes: jax.Array,
    *,
    config: XlaConfig,
    transpose_rhs: bool,
    out_dtype: jnp.dtype,
    row_start: jax.Array | None = None,
) -> jax.Array:
    """The weight gradient out[g] = lhs[rows of g]^T @ dout[rows of g] [G, K, N] ([G, N, K] when
    `transpose_rhs`), accumulated in float32, in each strategy's formulation; an expert with no rows and
    rows past the groups contribute nothing."""
    g = group_sizes.shape[0]
    compute_dtype = jnp.promote_types(lhs.dtype, dout.dtype)
    lhs, dout = lhs.astype(compute_dtype), dout.astype(compute_dtype)
    group_sizes = group_sizes.astype(jnp.int32)
    if config.strategy == "ragged_dot":
        lhs, group_sizes = _from_row_start(lhs, group_sizes, row_start)
        out = lax.ragged_dot_general(
            lhs,
            dout,
            group_sizes,
            RAGGED_CONTRACTION,
            precision=_precision(compute_dtype),
            preferred_element_type=jnp.float32,
        )
    elif config.strategy == "dense_masked":
        member = _row_groups(group_sizes, lhs.shape[0], row_start)[:, None] == jnp.arange(g)[None, :]
        masked = jnp.where(member[:, :, None], lhs[:, None, :], jnp.zeros((), compute_dtype))
        out = _product("mgk,mn->gkn", masked, dout)
    elif config.strategy == "segments":
        out = _drhs_segments(lhs, dout, group_sizes, g, row_start)
    else:
        out = _drhs_chunked(lhs, dout, group_sizes, g, config.chunk_m, config.items_per_step, row_start)
    return (out.transpose(0, 2, 1) if transpose_rhs else out).astype(out_dtype)


def _drhs_segments(lhs, dout, group_sizes, g, row_start=None):
    row_groups = _row_groups(group_sizes, lhs.shape[0], row_start)

    def one_group(e):
        rows_of_e = jnp.where((row_groups == e)[:, None], lhs, jnp.zeros((), lhs.dtype))
        return _product("mk,mn->kn", rows_of_e, dout)

    return lax.map(one_group, jnp.arange(g))


def _drhs_chunked(lhs, dout, group_sizes, g, chunk_m, items_per_step, row_start=None):
    """Each (row chunk, group) item adds its rows' lhs^T @ dout to its expert's [K, N] gradient."""
    m, k = lhs.shape
    chunks, starts, ends, per_step = _work_items(group_sizes, m, g, chunk_m, items_per_step, row_start)
    lhs_chunks, dout_chunks = _row_chunks(lhs, chunks, chunk_m), _row_chunks(dout, chunks, chunk_m)

    def one_step(out, items):
        chunk_ids, group_ids, is_valid = items
        keep = _item_rows(chunk_ids, group_ids, is_valid, starts, ends, chunk_m)
        masked = jnp.where(keep[..., None], lhs_chunks[chunk_ids], jnp.zeros((), lhs.dtype))
        return out.at[group_ids].add(_product("bck,bcn->bkn", masked, dout_chunks[chunk_ids])), None

    return _scan_items(one_step, jnp.zeros((g, k, dout.shape[1]), jnp.float32), per_step)


def _fp8_product(
    lhs, lhs_scale, rhs, rhs_scale, group_sizes, *, config, transpose_rhs, scale_layout, row_start=None
) -> jax.Array:
    """The float32 product of FP8 operands and their scales [M, N], by layout:

    tensor, row_channel  scale after the sum: the scales are constant along K, so
                         out[r, n] = lhs_scale[r] * rhs_scale[g(r), n] * sum_k lhs[r, k] rhs[g(r)][k, n].
                         The GEMM runs on the FP8 values cast to bf16 (exact: e4m3 and e5m2 are subsets
                         of bf16) with float32 accumulation, as the 16-bit ops do; equal to dequantizing
                         first but for float32 rounding.
    block_1x128_128x128  dequantize in the dot: the scales change along K every 128, so no scale can
                         leave the sum; both operands are dequantized to float32 inside the same program
                         (XLA fuses the multiply into the GEMM's operand) and multiplied at full float32
                         precision. A kernel that sums 128-wide K steps apart and scales each (as the
                         Mosaic GPU one will) computes the same up to float32 rounding.
    `row_start` as grouped_matmul's: the groups are a local slice of experts starting at that row.
    """
    if scale_layout == "block_1x128_128x128":
        lhs32, rhs32 = fp8_scales.dequantize(lhs, lhs_scale), fp8_scales.dequantize(rhs, rhs_scale)
        return grouped_matmul(
            lhs32, rhs32, group_sizes, config=config, transpose_rhs=transpose_rhs, out_dtype=jnp.float32,
            row_start=row_start,
        )  # fmt: skip
    unscaled = grouped_matmul(
        lhs.astype(jnp.bfloat16),
        rhs.astype(jnp.bfloat16),
        group_sizes,
        config=config,
        transpose_rhs=transpose_rhs,
        out_dtype=jnp.dtype(jnp.float32),
        row_start=row_start,
    )
    g = rhs.shape[0]
    per_expert = rhs_scale.reshape(g, -1)  # [g, 1] (tensor) or [g, N] (row_channel)
    row_scale = per_expert[jnp.minimum(_row_groups(group_sizes, lhs.shape[0], row_start), g - 1)]
    # Rows outside the groups are zero in `unscaled` and stay zero.
    return unscaled * lhs_scale.reshape(-1, 1) * row_scale


def _scaled(
    activation, lhs, lhs_scale, rhs, rhs_scale, group_sizes, *, config, transpose_rhs, out_dtype,
    scale_layout, row_start=None,
) -> jax.Array:  # fmt: skip
    """The FP8 op's output: its float32 product, then `activation` on it ("" for none) as the 16-bit
    gated ops apply it, cast to the output dtype once."""
    product = _fp8_product(
        lhs,
        lhs_scale,
        rhs,
        rhs_scale,
        group_sizes.astype(jnp.int32),
        config=config,
        transpose_rhs=transpose_rhs,
        scale_layout=scale_layout,
        row_start=row_start,
    )
    return (gated_activation(activation, product) if activation else product).astype(out_dtype)


grouped_matmul_fp8 = functools.partial(_scaled, "")
grouped_matmul_swiglu_fp8 = functools.partial(_scaled, "swiglu")


def moe_decode_block(
    x: jax.Array,
    router_logits: jax.Array,
    w_gate_up: jax.Array,
    w_down: jax.Array,
    *,
    config: XlaConfig,
    transpose_rhs: bool,
    out_dtype: jnp.dtype,
    top_k: int,
    renormalize: bool = True,
) -> jax.Array:
    """The MoE decode block (op "moe_decode_block") as XLA runs it: moe_mlp's unfused path (routing and
    sort by XLA ops, gate_up, SwiGLU, down, combine) on this backend's grouped GEMM in `config`'s strategy;
    ragged_dot's is XLA's own block, the baseline a sweep times beside the fused kernels. K-major weights
    (`transpose_rhs`) go to the grouped GEMMs as they are."""
    gemm = functools.partial(grouped_matmul, config=config, transpose_rhs=transpose_rhs, out_dtype=x.dtype)
    out = moe_mlp_using(
        gemm, x, router_logits, w_gate_up, w_down, top_k=top_k, renormalize=renormalize, routing_mode="xla",
        transpose_weights=transpose_rhs,
    )  # fmt: skip
    return out.astype(out_dtype)


def moe_decode_block_fp8(
    x: jax.Array,
    router_logits: jax.Array,
    *weights: jax.Array,
    config: XlaConfig,
    transpose_rhs: bool,
    out_dtype: jnp.dtype,
    top_k: int,
    scale_layout: str,
    renormalize: bool = True,
) -> jax.Array:
    """The MoE decode block on FP8 weights (op "moe_decode_block_fp8") as XLA runs it: moe_mlp_fp8's
    unfused path (x and the hidden rows quantized in `scale_layout`, both GEMMs FP8 ops) with its routing
    and its GEMMs on this backend. The GEMMs are dispatched with their own configs, so `config` changes
    nothing here: a sweep of this op on xla times that one path. `weights`: w_gate_up, its scale, w_down,
    its scale, in the op's call order (moe_mlp_fp8's too)."""
    del config
    out = moe_mlp_fp8(
        x, router_logits, *weights, top_k=top_k, scale_layout=scale_layout, renormalize=renormalize,
        backend="xla", routing_mode="xla", transpose_weights=transpose_rhs,
    )  # fmt: skip
    return out.astype(out_dtype)
