"""How FP8 operands and their float32 scales fit together, per scale layout (Problem.scale_layout).

A scale covers a block of its operand: value[i, j] = q[i, j] * scale[i // bi, j // bj], so a scale's shape
is its operand's shape divided by the block, axis by axis (a whole axis for a block of the axis's size):

  layout               lhs [m, k] block -> scale        rhs [g, k, n] block -> scale
  tensor               [m, k]  -> [1, 1]                [1, k, n]     -> [g, 1, 1]   (one per expert)
  row_channel          [1, k]  -> [m, 1]  (per token)   [1, k, 1]     -> [g, 1, n]   (per output channel)
  block_1x128_128x128  [1, 128] -> [m, k/128]           [1, 128, 128] -> [g, k/128, n/128]   (DeepSeek-V3)

With `transpose_rhs` (rhs [g, n, k]) the rhs scale follows the weights' layout: [g, n, 1] for row_channel,
[g, n/128, k/128] for blocks. Scales keep their operand's rank, so dequantizing is a broadcast (and, for
blocks, a repeat): the reference, the xla kernels and the tuner's draws all call `dequantize`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from moetune.kernels.deferred_jit import deferred_jit
from moetune.kernels.errors import ConfigInvalid

if TYPE_CHECKING:
    import jax

    from moetune.kernels.problem import Problem

BLOCK = 128  # the K (and N) width of one block-scale block
# layout -> (lhs (rows, k) block, rhs (k, n) block); None: the whole axis.
BLOCKS: dict[str, tuple[tuple[int | None, int | None], tuple[int | None, int | None]]] = {
    "tensor": ((None, None), (None, None)),
    "row_channel": ((1, None), (None, 1)),
    "block_1x128_128x128": ((1, BLOCK), (BLOCK, BLOCK)),
}
SCALE_DTYPE = "float32"


def block_shape(problem: Problem, side: str) -> tuple[int, ...]:
    """The block one scale of operand `side` ("lhs" or "rhs") covers, in the operand's own layout."""
    if side == "lhs":
        lhs_block = BLOCKS[problem.scale_layout][0]
        return tuple(d if b is None else b for d, b in zip((problem.m, problem.k), lhs_block, strict=True))
    return weight_block(problem.k, problem.n, problem.scale_layout, problem.transpose_rhs)


def weight_block(k: int, n: int, layout: str, transposed: bool) -> tuple[int, int, int]:
    """The block one scale of a [G, k, n] weight ([G, n, k] when `transposed`) covers in `layout`."""
    bk, bn = (d if b is None else b for d, b in zip((k, n), BLOCKS[layout][1], strict=True))
    return (1, bn, bk) if transposed else (1, bk, bn)


def scale_shape(problem: Problem, side: str) -> tuple[int, ...]:
    """The shape of operand `side`'s scale: its shape divided by its block (module docstring)."""
    shape = (problem.m, problem.k) if side == "lhs" else problem.rhs_shape
    return blocks_of(shape, block_shape(problem, side))


def blocks_of(shape: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
    """How many blocks cover `shape`, axis by axis (a partial last block counts)."""
    return tuple(-(-d // b) for d, b in zip(shape, block, strict=True))


def divisible_blocks(problem: Problem) -> str | None:
    """A ProblemCheck: block scales need k and n to be whole blocks (the kernels step K 128 at a time)."""
    if problem.scale_layout != "block_1x128_128x128":
        return None
    if problem.k % BLOCK or problem.n % BLOCK:
        return (
            f"with scale_layout={problem.scale_layout} needs k and n multiples of {BLOCK}; "
            f"got k={problem.k}, n={problem.n}"
        )
    return None


def check_scales(problem: Problem, lhs_scale: Any, rhs_scale: Any) -> None:
    """Raise ConfigInvalid naming the scale whose shape or dtype does not fit `problem`'s layout."""
    check_scale(problem, "lhs", lhs_scale, "lhs_scale")
    check_scale(problem, "rhs", rhs_scale, "rhs_scale")


def check_scale(problem: Problem, side: str, scale: Any, name: str) -> None:
    """Raise ConfigInvalid when `scale`, the scale of operand `side` that the caller calls `name`, is not
    float32 in the shape `problem`'s layout gives it."""
    wanted = scale_shape(problem, side)
    got = (tuple(scale.shape), np.dtype(scale.dtype).name)
    if got != (wanted, SCALE_DTYPE):
        raise ConfigInvalid(
            f"{name} must be {SCALE_DTYPE} {list(wanted)} for scale_layout={problem.scale_layout} "
            f"(m={problem.m}, k={problem.k}, n={problem.n}, g={problem.g}, "
            f"transpose_rhs={problem.transpose_rhs}); got {got[1]} {list(got[0])}"
        )


def expand(scale: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """`scale` stretched over the operand shape `shape`: broadcast where it has one entry, repeated over
    each block elsewhere (a last partial block is cut)."""
    import jax
    import jax.numpy as jnp

    for axis, (size, dim) in enumerate(zip(scale.shape, shape, strict=True)):
        if size not in (1, dim):
            repeated = jnp.repeat(scale, -(-dim // size), axis=axis)
            scale = jax.lax.slice_in_dim(repeated, 0, dim, axis=axis)
    return scale


def dequantize(values: jax.Array, scale: jax.Array) -> jax.Array:
    """values * scale in float32 (the FP8 values are exact in float32)."""
    import jax.numpy as jnp

    return values.astype(jnp.float32) * expand(scale.astype(jnp.float32), values.shape)


def quantize(x: jax.Array, block: tuple[int, ...], dtype: Any) -> tuple[jax.Array, jax.Array]:
    """(values in `dtype`, float32 scales) with one scale per `block` of x: each block's largest magnitude
    maps to the dtype's largest finite value (an all-zero block gets scale 1). Values are clipped before
    the cast: float8_e4m3fn has no infinity and would turn an overflow into NaN."""
    import jax.numpy as jnp

    x = x.astype(jnp.float32)
    interleaved = []
    for dim, b in zip(x.shape, block, strict=True):
        if dim % b:
            raise ConfigInvalid(f"quantize needs whole blocks: dim {dim} is not a multiple of block {b}")
        interleaved += [dim // b, b]
    amax = jnp.max(jnp.abs(x.reshape(interleaved)), axis=tuple(range(1, len(interleaved), 2)))
    top = float(jnp.finfo(dtype).max)
    scale = jnp.where(amax > 0, amax / top, 1.0).astype(jnp.float32)
    values = jnp.clip(x / expand(scale, x.shape), -top, top).astype(dtype)
    return values, scale


@deferred_jit(static_argnames=("shape", "block", "dtype", "stddev", "spread_axis"))
def draw_quantized(
    key: jax.Array,
    shape: tuple[int, ...],
    block: tuple[int, ...],
    dtype: str,
    stddev: float,
    spread_axis: int,
) -> tuple[jax.Array, jax.Array]:
    """A normal draw of `shape` quantized to `dtype` in `block`s: what the tuner verifies and times FP8
    ops on. Each slice along `spread_axis` (lhs rows, rhs output columns) is scaled by a log-normal factor
    (spread e^+-1), as activations have louder tokens and weights louder channels: the scales then differ
    across rows and blocks, as real ones do, instead of all being nearly equal."""
    import jax
    import jax.numpy as jnp

    values_key, spread_key = jax.random.split(key)
    spread_shape = [1] * len(shape)
    spread_shape[spread_axis] = shape[spread_axis]
    spread = jnp.exp(jax.random.normal(spread_key, tuple(spread_shape), jnp.float32))
    x = jax.random.normal(values_key, shape, jnp.float32) * stddev * spread
    return quantize(x, block, dtype)
