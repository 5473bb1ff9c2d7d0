"""A decode step's attention projections (a few rows times a weight matrix) as one Pallas Triton kernel,
with the attention block's RMSNorm folded in.

XLA runs the q/k/v projection of a decode step as four kernels on the H200: the RMSNorm's sum of squares,
its scaling, the Triton GEMM and its split-K sum (17.2 us in all, the GEMM 14.0). Here the GEMM's programs
apply the norm to x themselves: each reads x's rows whole for the norm's scale (8 KB, from L2), then
scales its own K slices before the dot, so no kernel writes the normed row. The split-K partial sums go
out in float32 for the consumer to add (XLA fuses that sum into the kernel that reads them: the residual
add after wo, its own small kernel before attention).

The dot is a tensor-core dot of x padded to DOT_ROWS rows, so that Triton pipelines the weight tiles'
loads `num_stages` deep. Products summed elementwise with plain loads were slower at every tiling: one
loop step waits for its load, and at one or two steps a program they still read at only 65% of the
roofline (H200, Mixtral-8x7B's projections).

Numerics follow `rms_norm(x) @ w` with float32 accumulation: the normed row is rounded to x's dtype before
the dot, the partial sums are float32.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

Array = Any
DOT_ROWS = 16  # the smallest M of Triton's dot: x's rows are padded to it in registers
MAX_ROWS = 4  # decode batches up to this take the kernel; each of their rows is read whole for the norm


@dataclasses.dataclass(frozen=True)
class Tiling:
    block_n: int = 128  # output columns per program: block_n * 2 contiguous bytes per weight row
    block_k: int = 64  # weight rows per loop step
    split_k: int = 8  # programs along K, each writing a float32 partial sum
    num_warps: int = 4
    num_stages: int = 3  # weight tiles in flight per program


# The tiling per weight shape (K, N); others take Tiling()'s defaults, which were the best of 30 tilings
# timed alone for Mixtral's wqkv [4096, 6144] and wo [4096, 4096] on the H200: 14.6 and 9.7 us.
TILINGS: dict[tuple[int, int], Tiling] = {}


def tiling_for(k: int, n: int) -> Tiling:
    return TILINGS.get((k, n), Tiling())


def fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], tiling: Tiling) -> bool:
    rows, k = x_shape
    k_w, n = w_shape
    return (
        rows <= MAX_ROWS
        and k == k_w
        and n % tiling.block_n == 0
        and k % (tiling.split_k * tiling.block_k) == 0
    )


def partial_sums(
    x: Array,
    w: Array,
    *,
    norm: tuple[Array, float] | None = None,
    tiling: Tiling = Tiling(),
    interpret: bool = False,
) -> Array:
    """Split-K partial sums [split_k, M, N] float32 of x [M, K] @ w [K, N] (of rms_norm(x) @ w when `norm`
    is (weight [K], eps)). Their sum over axis 0 is the product."""
    rows, k = x.shape
    n = w.shape[1]
    if not fits(x.shape, w.shape, tiling):
        raise ValueError(f"gemv: x {x.shape} @ w {w.shape} does not fit {tiling}")
    inputs, eps = (x, w), None
    if norm is not None:
        norm_weight, eps = norm
        if norm_weight.shape != (k,):
            raise ValueError(f"gemv: norm weight {norm_weight.shape} for K={k}")
        inputs += (norm_weight,)
    steps = k // (tiling.split_k * tiling.block_k)
    return pl.pallas_call(
        functools.partial(_kernel, steps=steps, tiling=tiling, eps=eps),
        out_shape=jax.ShapeDtypeStruct((tiling.split_k, rows, n), jnp.float32),
        grid=(n // tiling.block_n, tiling.split_k),
        compiler_params=pltriton.CompilerParams(num_warps=tiling.num_warps, num_stages=tiling.num_stages),
        interpret=interpret,
        name="moetune_gemv",
    )(*inputs)


def project(
    x: Array,
    w: Array,
    *,
    norm: tuple[Array, float] | None = None,
    tiling: Tiling = Tiling(),
    interpret: bool = False,
) -> Array:
    """x [M, K] @ w [K, N] (rms_norm(x) @ w with `norm`) in x's dtype: the kernel's partial sums, added."""
    parts = partial_sums(x, w, norm=norm, tiling=tiling, interpret=interpret)
    return jnp.sum(parts, axis=0).astype(x.dtype)


def accumulate(
    x: Array, w: Array, into: Array, *, tiling: Tiling = Tiling(), interpret: bool = False
) -> Array:
    """into [M, N] float32 plus x [M, K] @ w [K, N], in place: each program adds its split-K partial sum
    into `into` with atomic adds, so a decode step's residual add needs no kernel of its own (the wo
    projection adds into the residual stream). The adds' order, and with it the last bits, vary run to run."""
    rows, k = x.shape
    n = w.shape[1]
    if not fits(x.shape, w.shape, tiling) or into.shape != (rows, n) or into.dtype != jnp.float32:
        raise ValueError(f"gemv: {into.dtype} {into.shape} += x {x.shape} @ w {w.shape} misfits {tiling}")
    steps = k // (tiling.split_k * tiling.block_k)
    return pl.pallas_call(
        functools.partial(_kernel, steps=steps, tiling=tiling, accumulate=True),
        out_shape=jax.ShapeDtypeStruct(into.shape, jnp.float32),
        grid=(n // tiling.block_n, tiling.split_k),
        compiler_params=pltriton.CompilerParams(num_warps=tiling.num_warps, num_stages=tiling.num_stages),
        input_output_aliases={2: 0},
        interpret=interpret,
        name="moetune_gemv_accumulate",
    )(x, w, into)


def _kernel(*refs, steps, tiling, eps=None, accumulate=False):
    x_ref, w_ref, out_ref = refs[0], refs[1], refs[-1]
    norm_ref = refs[2] if eps is not None else None
    column_tile, split = pl.program_id(0), pl.program_id(1)
    rows, k = x_ref.shape
    bk = tiling.block_k
    columns = pl.ds(column_tile * tiling.block_n, tiling.block_n)
    dtype = x_ref.dtype
    # float32 weights take full-precision dots, as XLA's do under the tests' float32 matmul precision.
    precision = jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None
    row = jnp.arange(DOT_ROWS)
    clamped = jnp.minimum(row, rows - 1)  # rows past M read row M-1 (in bounds) and are zeroed below
    if norm_ref is not None:  # rms_norm's scale of each row, from the whole row, as a [DOT_ROWS] column
        scale = jnp.zeros((DOT_ROWS,), jnp.float32)
        for r in range(rows):
            whole = x_ref[r, :].astype(jnp.float32)
            scale = jnp.where(row == r, jax.lax.rsqrt(jnp.sum(whole * whole) / k + eps), scale)

    def step(i, acc):
        ks = pl.ds(pl.multiple_of((split * steps + i) * bk, bk), bk)
        x = x_ref[clamped, ks]
        if norm_ref is not None:
            x = x.astype(jnp.float32) * scale[:, None] * norm_ref[ks].astype(jnp.float32)[None, :]
        x = jnp.where((row < rows)[:, None], x.astype(dtype), 0)
        w = w_ref[ks, columns]
        return acc + jax.lax.dot(x, w, precision=precision, preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, steps, step, jnp.zeros((DOT_ROWS, tiling.block_n), jnp.float32))
    if accumulate:  # row by row: the interpreter's atomics take no mask, and acc's rows cannot be sliced
        for r in range(rows):
            part = jnp.sum(jnp.where((row == r)[:, None], acc, 0), axis=0)
            pltriton.atomic_add(out_ref, (jnp.int32(r), columns), part)
    else:
        pltriton.store(out_ref.at[split, pl.ds(0, DOT_ROWS), columns], acc, mask=(row < rows)[:, None])
