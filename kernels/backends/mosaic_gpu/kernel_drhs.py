"""The grouped GEMM's weight gradient on Hopper (sm_90a) in Pallas Mosaic GPU:
out[g] = lhs[rows of g]^T @ dout[rows of g], output [G, K, N] ([G, N, K] with `transpose_rhs`).

The ragged dimension is the contracted one. A work item is one output tile of one expert; it walks that
expert's rows only, `block_m` at a time, from its first row rounded down to a multiple of `block_m` (a TMA
box starts on a tile boundary) to its last, so rows past sum(group_sizes) and other experts' rows are
never multiplied in and the cost follows the real rows, not the buffer's size. The first and last step of
an expert can hold a neighbour's rows: there the dout tile's foreign rows are zeroed in shared memory
(registers in, select, registers out, then a proxy fence) before the wgmma reads it. Zeroing one operand
is enough for rows of finite values, which every activation and cotangent buffer holds below M, rows past
sum(group_sizes) included (0 * NaN would be NaN); rows past M (`rows`) are cut off first.

wgmma reads the lhs tile [block_m, K tile] through a transposed view as its A operand (the output's K
tile is the instruction's M side) and the dout tile [block_m, N tile] as B; accumulation is float32 in
registers; an expert with no rows stores zeros without reading anything. With `transpose_rhs` the two
operands trade places (out[g]^T = dout^T @ lhs), so both layouts are the same kernel.

Config fields keep their meaning where they can: block_m counts token rows (here the contraction step),
block_n the output tile's N columns, block_k its K rows; wg_split "n" gives two consumer warpgroups one
half of the tile's Q side each (each zeroes its own half of the dout tile, so no two warpgroups write one
buffer), "none" gives one consumer the whole tile. With warp_specialized a producer warpgroup feeds
them and runs one pipeline over all of the CTA's items, so an expert of a few steps (100-200 rows) pays no
pipeline fill per output tile; without it one warpgroup issues copies and wgmmas, its pipeline started
afresh per item. Experts are walked one after another; within one, grid_minor_dim "m" or "n" and
grid_tile_width lay its [P, Q] tiles in strips of that many tiles along P or Q, so that the CTAs at work
at once share operand tiles in L2 (with "m" and width 1 every P tile streams the expert's whole dout: at
Mixtral's 28672 columns that is the expert's 58 MB of dout again for each of K's tiles). The epilogue
chunks, split-K, pad_lhs and the tile schedule play no part and stay at their defaults.

Output sides that no tile divides (gpt-oss's K = N = 2880 in 128-wide tiles) take a partial last tile:
TMA zero-fills the operand columns past them and the stores clip; a consumer's tile wholly past Q stores
nothing. Mosaic GPU tiles the global arrays by the swizzled tiles, so their swizzle narrows to what the
sides divide (one for both operands, as wgmma takes one): K = 1440 (22.5 x 64) takes 64-byte tiles of
32 columns. The sides must be multiples of 16 (32-byte tiles).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moetune.kernels.backends.mosaic_gpu import tiling
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.backends.mosaic_gpu.kernel_sm90 import CTA_AXIS, PRODUCER_REGISTERS, WARPGROUP_AXIS


@dataclasses.dataclass(frozen=True)
class _Static:
    m: int
    g: int
    step: int  # rows per contraction step (block_m)
    tile_p: int  # output rows per tile (the wgmma M side): K, or N under transpose_rhs
    tile_q: int  # output columns per consumer warpgroup
    consumers: int
    warp_specialized: bool
    stages: int
    p_tiles: int
    q_tiles: int
    in_dtype: Any
    out_dtype: Any
    minor_dim: str = "m"
    tile_width: int = 1
    q: int = 0  # output columns of an expert: the last CTA tile may reach past them
    p: int = 0  # output rows of an expert: the last tile may reach past them

    @property
    def operand_columns(self) -> int:
        """Columns of the operands' swizzled tiles, one width for both (wgmma takes one swizzle): what
        the tiles and the output's sides divide, as Mosaic GPU tiles the global operands by them."""
        return math.gcd(self.tile_p, self.p, self.tile_q, self.q)

    @property
    def out_columns(self) -> int:
        """Columns of the output's swizzled tiles: what a consumer's tile and Q divide."""
        return math.gcd(self.tile_q, self.q)

    @property
    def cta_q(self) -> int:
        return self.tile_q * self.consumers

    @property
    def q_tail(self) -> bool:
        """Whether the last CTA tile along Q is partial (a consumer's tile may lie wholly past Q)."""
        return self.q % self.cta_q != 0

    @property
    def items(self) -> int:
        return self.g * self.p_tiles * self.q_tiles


def _transforms(cols: int, dtype: Any) -> tuple:
    item = jnp.dtype(dtype).itemsize
    swizzle = tiling.swizzle_bytes(cols, item)
    return (plgpu.TilingTransform((8, swizzle // item)), plgpu.SwizzleTransform(swizzle))


def _in_specs(s: _Static, first: jax.Array, pt: jax.Array, qt: jax.Array, delay_release: int) -> list:
    """The a tile [step, tile_p] and the b tile [step, cta_q] of contraction step kk."""
    return [
        plgpu.BlockSpec(
            (s.step, s.tile_p),
            lambda kk: (first + kk, pt),
            transforms=_transforms(s.operand_columns, s.in_dtype),
            delay_release=delay_release,
        ),
        plgpu.BlockSpec(
            (s.step, s.cta_q),
            lambda kk: (first + kk, qt),
            transforms=_transforms(s.operand_columns, s.in_dtype),
            delay_release=delay_release,
        ),
    ]


def _rows(s: _Static, bounds_ref: Any, g: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(start, end, first step's block, steps) of expert g: its rows [start, end) clipped to M."""
    start = jnp.minimum(bounds_ref[g], s.m)
    end = jnp.minimum(bounds_ref[g + 1], s.m)
    first = start // s.step
    steps = jnp.where(end > start, (end + s.step - 1) // s.step - first, 0)
    return start, end, first, steps


def _chained_rows(s: _Static, bounds_ref: Any, g: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(start, end, first row of the first step, steps) of expert g when its steps start at its first
    row rounded down to a multiple of 8 (a copy's row offset into a swizzled tile must be whole 8-row
    tiles), not of block_m: an expert of r rows spans about r / block_m + 1/2 steps, not + 1."""
    start = jnp.minimum(bounds_ref[g], s.m)
    end = jnp.minimum(bounds_ref[g + 1], s.m)
    row0 = pl.multiple_of(start // 8 * 8, 8)
    return start, end, row0, jnp.where(end > start, (end - row0 + s.step - 1) // s.step, 0)


def _zero_foreign_rows(b_smem: Any, row0: jax.Array, start: jax.Array, end: jax.Array, s: _Static) -> None:
    """Rows of the dout tile (first global row `row0`) outside [start, end) set to zero, in place."""
    shape = (s.step, s.tile_q)
    rows = row0 + plgpu.layout_cast(lax.broadcasted_iota(jnp.int32, shape, 0), plgpu.Layout.WGMMA)
    values = b_smem[...]
    b_smem[...] = jnp.where((rows >= start) & (rows < end), values, jnp.zeros_like(values))
    plgpu.commit_smem()  # the wgmma reads it through the async proxy


def _step(s: _Static, kk: Any, a_smem: Any, b_smem: Any, acc_ref: Any, first, start, end, steps) -> None:
    step = kk[0]

    @pl.when((step == 0) | (step == steps - 1))
    def _edge():
        _zero_foreign_rows(b_smem, (first + step) * s.step, start, end, s)

    plgpu.wgmma(acc_ref, a_smem.T, b_smem)


def _store(acc: jax.Array | None, out_ref: Any, smem: Any, g: Any, p0: Any, q0: Any, s: _Static) -> None:
    """The [tile_p, tile_q] tile at (p0, q0) of expert g's output; zeros when `acc` is None. The previous
    tile's copy out of `smem` must have been read first; this one is left in flight."""
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    if acc is None:
        smem[...] = jnp.zeros((s.tile_p, s.tile_q), s.out_dtype)
    else:
        smem[...] = acc.astype(s.out_dtype)
    plgpu.commit_smem()

    # A partial last tile: TMA stores clip the rows and columns past P and Q (the operands past them were
    # zero-filled); a consumer's tile wholly past Q stores nothing.
    def copy():
        plgpu.copy_smem_to_gmem(smem, out_ref.at[g, pl.ds(p0, s.tile_p), pl.ds(q0, s.tile_q)])

    if s.q_tail:
        pl.when(q0 < s.q)(copy)
    else:
        copy()


def _tile_out(s: _Static, steps: jax.Array, accumulate: Any, out_ref: Any, smem: Any, g, p0, q0) -> None:
    """One output tile: accumulated by `accumulate(acc_ref)` over the expert's steps and stored, or
    zeros stored where the expert has no rows."""

    @pl.when(steps > 0)
    def _compute():
        def acc_scope(acc_ref):
            accumulate(acc_ref)
            return acc_ref[...]

        acc = pl.run_scoped(acc_scope, plgpu.ACC((s.tile_p, s.tile_q), jnp.float32))
        _store(acc, out_ref, smem, g, p0, q0, s)

    @pl.when(steps == 0)
    def _zeros():
        _store(None, out_ref, smem, g, p0, q0, s)


def _item(index: jax.Array, s: _Static) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Work item -> (expert, p tile, q tile): one expert's tiles after another, each expert's in strips
    of `tile_width` tiles along P ("m") or Q ("n"), snaking (plgpu.planar_snake)."""
    g, rest = index // (s.p_tiles * s.q_tiles), index % (s.p_tiles * s.q_tiles)
    minor = 0 if s.minor_dim == "m" else 1
    pt, qt = plgpu.planar_snake(rest, (s.p_tiles, s.q_tiles), minor, s.tile_width)
    return g, pt, qt


def _out_smem(s: _Static, warpgroups: int) -> Any:
    return plgpu.SMEM(
        (warpgroups, s.tile_p, s.tile_q), s.out_dtype, transforms=_transforms(s.out_columns, s.out_dtype)
    )


def _plain_kernel(bounds_ref, a_ref, b_ref, out_ref, *, s: _Static) -> None:
    """One warpgroup issues the copies and the wgmmas, one wgmma group left in flight."""
    delay = 1 if s.stages > 1 else 0

    def with_out_smem(o_smem):
        smem = o_smem.at[0]

        @plgpu.nd_loop((s.items,), collective_axes=CTA_AXIS)
        def _tile(info):
            g, pt, qt = _item(info.index[0], s)
            start, end, first, steps = _rows(s, bounds_ref, g)
            p0, q0 = pt * s.tile_p, qt * s.tile_q

            def accumulate(acc_ref):
                def body(kk, a_smem, b_smem):
                    _step(s, kk, a_smem, b_smem, acc_ref, first, start, end, steps)
                    plgpu.wgmma_wait(delay)  # step i-1's slot is refilled after step i

                plgpu.emit_pipeline(
                    body,
                    grid=(steps,),
                    in_specs=_in_specs(s, first, pt, qt, delay),
                    max_concurrent_steps=s.stages,
                )(a_ref, b_ref)
                plgpu.wgmma_wait(0)

            _tile_out(s, steps, accumulate, out_ref, smem, g, p0, q0)

        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(with_out_smem, _out_smem(s, 1))


def _consumer_registers(consumers: int) -> int:
    """Registers per thread of a consumer warpgroup: the SM's 512 per thread of one warpgroup, less the
    producer's, shared by the consumers, at most 256, a multiple of 8 (setmaxnreg's step)."""
    return min(256, (512 - PRODUCER_REGISTERS) // consumers) // 8 * 8


def _warp_specialized_kernel(bounds_ref, a_ref, b_ref, out_ref, *, s: _Static) -> None:
    """A producer warpgroup streams the a and b tiles of every contraction step of the CTA's items, one
    item after another, through a ring of `stages` slots; each consumer multiplies one half of the Q
    side. One pipeline spans all of a CTA's items: the next item's tiles arrive while this one's last
    steps multiply and its output tile is stored, so an item of two or three steps (an expert of 100-200
    rows) pays no pipeline fill. Slot use c (counted over all items) waits for `full[c % stages]`, whose
    two copies arrive with their bytes, and is given back on `empty[c % stages]` by every consumer."""
    wg = lax.axis_index(WARPGROUP_AXIS)
    operand = _transforms(s.operand_columns, s.in_dtype)
    a_spec = plgpu.SMEM((s.stages, s.step, s.tile_p), s.in_dtype, transforms=operand)
    b_spec = plgpu.SMEM((s.stages, s.step, s.cta_q), s.in_dtype, transforms=operand)

    @functools.partial(
        pl.run_scoped,
        a_smem=a_spec,
        b_smem=b_spec,
        o_smem=_out_smem(s, s.consumers),
        full=plgpu.Barrier(num_arrivals=2, num_barriers=s.stages),
        empty=plgpu.Barrier(num_arrivals=s.consumers, num_barriers=s.stages),
        collective_axes=WARPGROUP_AXIS,
    )
    def _scope(a_smem, b_smem, o_smem, full, empty):
        def producer():
            plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")

            @plgpu.nd_loop((s.items,), collective_axes=CTA_AXIS, init_carry=jnp.int32(0))
            def uses(info, carry):
                g, pt, qt = _item(info.index[0], s)
                _, _, row0, steps = _chained_rows(s, bounds_ref, g)

                @pl.loop(0, steps)
                def _fetch(kk):
                    use = carry + kk
                    slot = lax.rem(use, s.stages)

                    @pl.when(use >= s.stages)
                    def _wait_free():
                        plgpu.barrier_wait(empty.at[slot])

                    rows = pl.ds(pl.multiple_of(row0 + kk * s.step, 8), s.step)
                    plgpu.copy_gmem_to_smem(
                        a_ref.at[rows, pl.ds(pt * s.tile_p, s.tile_p)], a_smem.at[slot], full.at[slot]
                    )
                    plgpu.copy_gmem_to_smem(
                        b_ref.at[rows, pl.ds(qt * s.cta_q, s.cta_q)], b_smem.at[slot], full.at[slot]
                    )

                return carry + steps

            # Every release is observed before the barriers go away (the last `stages` are not yet).
            @pl.loop(jnp.maximum(uses - s.stages, 0), uses)
            def _drain(use):
                plgpu.barrier_wait(empty.at[lax.rem(use, s.stages)])

        def consumer():
            plgpu.set_max_registers(_consumer_registers(s.consumers), action="increase")
            smem = o_smem.at[wg]

            @plgpu.nd_loop((s.items,), collective_axes=CTA_AXIS, init_carry=jnp.int32(0))
            def _tile(info, carry):
                g, pt, qt = _item(info.index[0], s)
                start, end, row0, steps = _chained_rows(s, bounds_ref, g)
                p0, q0 = pt * s.tile_p, qt * s.cta_q + wg * s.tile_q
                slot_of = lambda kk: lax.rem(carry + kk, s.stages)  # noqa: E731

                def accumulate(acc_ref):
                    # One wgmma group stays in flight: step kk's slot is given back after step kk+1 is
                    # issued.
                    @pl.loop(0, steps)
                    def _multiply(kk):
                        slot = slot_of(kk)
                        plgpu.barrier_wait(full.at[slot])
                        half = b_smem.at[slot].at[:, pl.ds(wg * s.tile_q, s.tile_q)]

                        @pl.when((kk == 0) | (kk == steps - 1))
                        def _edge():
                            _zero_foreign_rows(half, row0 + kk * s.step, start, end, s)

                        plgpu.wgmma(acc_ref, a_smem.at[slot].T, half)
                        plgpu.wgmma_wait(1)

                        @pl.when(kk > 0)
                        def _release():
                            plgpu.barrier_arrive(empty.at[slot_of(kk - 1)])

                    plgpu.wgmma_wait(0)
                    plgpu.barrier_arrive(empty.at[slot_of(steps - 1)])

                _tile_out(s, steps, accumulate, out_ref, smem, g, p0, q0)
                return carry + steps

            plgpu.wait_smem_to_gmem(0)

        lax.cond(wg == s.consumers, producer, consumer)


def kernel_name(config: MosaicGpuConfig) -> str:
    c = config
    body = "plain" if not c.warp_specialized else f"ws{c.wg_split}"
    persistent = "p" if c.persistent else "np"
    return (
        f"moetune_gmm_drhs_m{c.block_m}n{c.block_n}k{c.block_k}s{c.max_concurrent_steps}_{persistent}_{body}"
    )


def grouped_matmul_drhs(
    lhs: jax.Array,
    dout: jax.Array,
    group_sizes: jax.Array,
    *,
    config: MosaicGpuConfig,
    num_sms: int,
    transpose_rhs: bool = False,
    out_dtype: Any = None,
    rows: int | None = None,
    row_start: jax.Array | None = None,
) -> jax.Array:
    """lhs [M, K], dout [M, N], group_sizes [G] -> [G, K, N] ([G, N, K] with `transpose_rhs`).

    `row_start`: the first row of the first group (a traced int32 scalar; expert parallelism's local
    slice), rows before it belong to no group here. `rows` (M) when the operands carry rows past M.
    The config must satisfy the search space's drhs constraints (the backend's build checks them).
    """
    out_dtype = jnp.dtype(out_dtype if out_dtype is not None else lhs.dtype)
    if lhs.dtype != dout.dtype or lhs.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"lhs and dout must both be bfloat16 or both float16; got {lhs.dtype}, {dout.dtype}")
    m = lhs.shape[0] if rows is None else rows
    # Rows past M may hold anything (NaN): cut off, they become the TMA's zero fill, which the zeroing of
    # the other operand's foreign rows cannot turn into NaN.
    lhs, dout = lhs[:m], dout[:m]
    a, b = (dout, lhs) if transpose_rhs else (lhs, dout)
    t = tiling.drhs_tiles(lhs.shape[1], dout.shape[1], transpose_rhs, config)
    # Mosaic GPU tiles the global operands and output by the swizzled shared-memory tiles, which narrow
    # to what the sides divide (32 bytes at the narrowest).
    if t.p % tiling.DRHS_GRANULE or t.q % tiling.DRHS_GRANULE:
        raise ValueError(f"output [{t.p}, {t.q}] must have sides that are multiples of {tiling.DRHS_GRANULE}")
    s = _Static(
        m=m,
        g=group_sizes.shape[0],
        step=config.block_m,
        tile_p=t.tile_p,
        tile_q=t.tile_q,
        consumers=t.consumers,
        warp_specialized=config.warp_specialized,
        stages=config.max_concurrent_steps,
        p_tiles=tiling.cdiv(t.p, t.tile_p),
        q_tiles=tiling.cdiv(t.q, t.cta_q),
        in_dtype=lhs.dtype,
        out_dtype=out_dtype,
        minor_dim=config.grid_minor_dim,
        tile_width=config.grid_tile_width,
        q=t.q,
        p=t.p,
    )
    # TMA boxes of the swizzled tiles need whole 8-row tiles; the padding rows belong to no group.
    if a.shape[0] % 8:
        extra = ((0, 8 - a.shape[0] % 8), (0, 0))
        a, b = jnp.pad(a, extra), jnp.pad(b, extra)
    sizes = group_sizes.astype(jnp.int32)
    offset = jnp.zeros((), jnp.int32) if row_start is None else jnp.asarray(row_start, jnp.int32)
    bounds = offset + jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sizes)])
    body = _warp_specialized_kernel if config.warp_specialized else _plain_kernel
    kernel = plgpu.kernel(
        functools.partial(body, s=s),
        out_type=jax.ShapeDtypeStruct((s.g, t.p, t.q), out_dtype),
        grid=(min(num_sms, s.items) if config.persistent else s.items,),
        grid_names=(CTA_AXIS,),
        num_threads=s.consumers + 1 if config.warp_specialized else None,
        thread_name=WARPGROUP_AXIS if config.warp_specialized else None,
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        kernel_name=kernel_name(config),
    )
    return kernel(bounds, a, b)
