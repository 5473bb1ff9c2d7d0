"""MoE grouped GEMM for Hopper (sm_90a) in Pallas Mosaic GPU: out[rows of g] = lhs[rows of g] @ rhs[g].

Semantics are jax.lax.ragged_dot's: rows are grouped contiguously by expert, accumulation is float32,
rows past sum(group_sizes) come out zero, and an expert with no rows reads none of its weights.

Work is a grid of (row tile, column tile, K split) triples walked by `plgpu.nd_loop`, either one CTA per
SM looping (persistent) or one CTA per triple. A row tile is one expert's rows inside a window of `cta_m`
rows that starts at a multiple of 8; schedule.py says how a work item finds its rows (by walking the
groups, or from a row-tile table built once per call). Each CTA streams [cta_m, block_k] slices of lhs
and [block_k, cta_n] slices of that expert's weights through a TMA pipeline into wgmma, then writes the
expert's rows of the window back through shared memory with TMA stores whose row counts are powers of two
(a store cannot be told "only rows 3..9" at run time, so 7 rows leave as 4 + 2 + 1).

With `swap_ab` (block_m below 64) the weight tile is wgmma's A operand (its columns are the
instruction's 64 rows) and the lhs tile, 8 to 56 token rows, its narrow N side: acc[weight columns, token
rows] += w^T x^T, so no padding rows are multiplied and no 64-row lhs tile is loaded for a handful of
tokens. The accumulator is stored through a transposed view of the epilogue's shared memory (Mosaic GPU
has no transpose of registers in warpgroup semantics), after which the stores are the same.

Two pipelines: with warp specialization a producer warpgroup issues the copies and one or two consumer
warpgroups multiply (split along M or N); without it one warpgroup does both, keeping one wgmma in flight.

The SwiGLU epilogue (op "grouped_matmul_swiglu", rhs [G, K, 2F]) gives each CTA two weight tiles per
step, gate columns [c, c + cta_n) and the matching up columns F + c onwards, multiplied into two float32
accumulators; the epilogue writes silu(gate) * up, so the [M, 2F] product never reaches memory. Output
column tiles then cover F, not 2F.

Widths that no step or tile divides (gpt-oss's 2880 = 22.5 x 128) run whole steps and tiles, the last
one partial: TMA zero-fills the operands past K and N, so a partial K step adds nothing, and the stores
clip the columns past N (a store chunk wholly past them is skipped). Under swiglu the gate tile of a
partial column tile reaches into the up columns, products the clipped stores drop, and its up tile is
indexed by element, F columns on. Mosaic GPU tiles the global operands by the shared-memory tiles, so
the swizzle narrows to what divides K (64 bytes for K = 1440 in 128-wide steps).

The FP8 ops ("grouped_matmul_fp8", "grouped_matmul_swiglu_fp8") run the same pipelines on float8 operands
(wgmma e4m3/e5m2, float32 accumulators). Hopper's 8-bit wgmma takes both operands K-major, so the
weights must be [G, N, K] (`transpose_rhs`, as checkpoints store them). Scales constant along K
(`tensor`, `row_channel`) multiply the float32 sum in the epilogue, before the SwiGLU: one scalar per
expert, or each row's token scale times each column's channel scale, read from global memory straight
into the accumulator's row and column layouts. DeepSeek's block scales (`block_1x128_128x128`) change
every 128 along K, so each 128-wide scale block's wgmmas add into an accumulator of their own, which is
then scaled by the block's token scales and its weight block's scale, added to the float32 total and
reset (as DeepGEMM promotes). A 256-wide K step holds two scale blocks in two such accumulator sets,
so that one wgmma wait serves both blocks' promotions. Two consumers wait on the same stages and so promote at
once, the tensor cores idle meanwhile; with `stagger_consumers` they take turns at a barrier after each
step's wgmmas, so that one promotes while the other's wgmmas run (DeepGEMM's schedule).
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

from moetune.kernels.backends.mosaic_gpu import schedule, tiling
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.backends.mosaic_gpu.schedule import ROW_ALIGN
from moetune.kernels.backends.mosaic_gpu.tiling import BLOCK_SCALE_LAYOUT, SCALE_BLOCK, SCALE_LAYOUTS
from moetune.kernels.ops import GROUPED_MATMUL_FP8, GROUPED_MATMUL_SWIGLU_FP8
from moetune.kernels.problem import GROUPED_MATMUL, GROUPED_MATMUL_SWIGLU, Problem, problem_of

FP8_OPERAND_DTYPES = (jnp.float8_e4m3fn, jnp.float8_e5m2)

# Registers per thread left to the producer warpgroup; the consumers share the rest (the value JAX's
# Hopper matmul uses).
PRODUCER_REGISTERS = 40
WARPGROUP_AXIS = "wg"
CTA_AXIS = "sm"


@dataclasses.dataclass(frozen=True)
class _Static:
    """Everything the kernel body needs that is known at trace time."""

    m: int
    k: int
    g: int
    block_m: int
    block_n: int
    block_k: int
    cta_m: int
    cta_n: int
    consumers: int
    wg_split: str
    warp_specialized: bool
    k_steps: int
    stages: int
    row_tiles: int
    col_tiles: int
    split_k: int
    epi_m: int
    epi_n: int
    grid_minor_dim: str
    grid_tile_width: int
    transpose_rhs: bool
    in_dtype: Any
    store_dtype: Any
    swiglu: bool = False
    up_col_offset: int = 0  # column tiles between a gate tile and its up tile (F / cta_n) under swiglu
    out_n: int = 0  # output columns (F under swiglu): the last column tile may reach past them
    # Warp-specialized, persistent, and k_steps a multiple of stages: a CTA's tile pipelines run as one
    # chain, so the producer loads the next tile's first stages while the consumers finish this one.
    chain: bool = False
    table: bool = False  # tile_schedule "table": the kernel's first operand is the row-tile table
    persistent: bool = True
    swap_ab: bool = False
    scale_layout: str = "none"  # an FP8 op's: the kernel's operands after rhs are lhs_scale, rhs_scale
    stagger: bool = False  # the two consumers issue their wgmmas in turn (MosaicGpuConfig.stagger_consumers)

    @property
    def block_scaled(self) -> bool:
        return self.scale_layout == BLOCK_SCALE_LAYOUT

    @property
    def scale_blocks(self) -> int:
        """Scale blocks per K step under block scales (block_k / 128), one accumulator set each."""
        return self.block_k // SCALE_BLOCK if self.block_scaled else 1

    @property
    def tiles(self) -> int:
        return self.row_tiles * self.col_tiles * self.split_k

    @property
    def n_tail(self) -> bool:
        """Whether the last column tile reaches past the output's columns (a partial tile)."""
        return self.out_n % self.cta_n != 0

    def loop_items(self, sched_ref: Any) -> int | jax.Array:
        """The nd_loop's work items: the static grid, or under the table with a persistent grid only
        the real tiles' items (read from the table), so that no CTA loops over idle ones."""
        if self.table and self.persistent:
            return schedule.table_items(sched_ref, self)
        return self.tiles

    @property
    def ladder(self) -> tuple[int, ...]:
        """Store sizes, largest first: the powers of two up to min(epi_m, m)."""
        top = 1 << (min(self.epi_m, self.m).bit_length() - 1)
        return tuple(top >> i for i in range(top.bit_length()))


def _operand_transforms(s: _Static) -> tuple:
    """The operand tiles' shared-memory tiling and swizzle (one for both: wgmma takes no other). Mosaic
    GPU tiles the global operands by the same (8, swizzle) tiles, so each one's contiguous dimension, and
    every tile's offset along it, must be a whole number of them: with a partial last K step, K = 1440
    takes no 128-byte swizzle (64 columns) but a 64-byte one (32 columns). [K, N] weights are contiguous
    along N, so F = 1440 under swiglu (an up tile 1440 columns on) narrows it likewise."""
    width = math.gcd(s.block_k, s.k)
    if not s.transpose_rhs:
        width = math.gcd(width, s.out_n)
    item = jnp.dtype(s.in_dtype).itemsize
    swizzle = tiling.swizzle_bytes(width, item)
    elems = swizzle // item
    return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))


def _out_smem(s: _Static, warpgroups: int) -> Any:
    """Two epilogue slots per consumer warpgroup. Tiling rows by 1 keeps any row a valid TMA start while
    the swizzle keeps the register -> shared memory stores free of bank conflicts. Mosaic GPU tiles the
    global output by the same tiles, so the swizzle narrows to what divides N (32 columns for 1440)."""
    item = jnp.dtype(s.store_dtype).itemsize
    swizzle = tiling.out_swizzle_bytes(s.out_n, s.epi_n, item)
    transforms = (plgpu.TilingTransform((1, swizzle // item)), plgpu.SwizzleTransform(swizzle))
    return plgpu.SMEM((warpgroups, 2, s.epi_m, s.epi_n), s.store_dtype, transforms=transforms)


def _in_specs(s: _Static, row0: jax.Array, col: jax.Array, k0: jax.Array, delay_release: int) -> list:
    """lhs rows [row0, row0 + cta_m) (element-indexed: row0 is any multiple of ROW_ALIGN), then one weight
    tile per accumulator: column tile `col` (the gate under swiglu), and under swiglu the up tile
    `up_col_offset` column tiles further (F columns further, indexed by element, when F is no whole
    number of column tiles)."""
    transforms = _operand_transforms(s)
    lhs = plgpu.BlockSpec(
        (pl.Element(s.cta_m), s.block_k),
        lambda kk: (pl.multiple_of(row0, ROW_ALIGN), k0 + kk),
        transforms=transforms,
        delay_release=delay_release,
    )

    # Under swiglu with a partial last column tile, F is no whole number of tiles: the columns are
    # indexed by element, the up tile's from F + col * cta_n (in bounds up to 2F, zero-filled past it).
    by_element = s.swiglu and s.n_tail
    cols = pl.Element(s.cta_n) if by_element else s.cta_n

    def rhs(c):
        if s.transpose_rhs:
            return plgpu.BlockSpec(
                (cols, s.block_k),
                lambda kk: (c, k0 + kk),
                transforms=transforms,
                delay_release=delay_release,
            )
        return plgpu.BlockSpec(
            (s.block_k, cols),
            lambda kk: (k0 + kk, c),
            transforms=transforms,
            delay_release=delay_release,
        )

    if by_element:
        return [lhs, rhs(col * s.cta_n), rhs(col * s.cta_n + s.out_n)]
    if s.swiglu:
        return [lhs, rhs(col), rhs(col + s.up_col_offset)]
    return [lhs, rhs(col)]


def _rhs_operands(s: _Static, rhs_ref: Any) -> tuple:
    """The weight refs the pipeline streams: the expert's weights once per weight tile of a step."""
    return (rhs_ref, rhs_ref) if s.swiglu else (rhs_ref,)


def _weight_tiles(s: _Static) -> int:
    return 2 if s.swiglu else 1


def _accumulators(s: _Static, shape: tuple[int, int]) -> tuple:
    """float32 accumulators of a [rows, cols] output tile: [cols, rows] (transposed) under swap_ab. One
    per weight tile; under block scales the totals first, then as many again per scale block of a K
    step for its products."""
    if s.swap_ab:
        shape = shape[::-1]
    count = _weight_tiles(s) * (1 + s.scale_blocks if s.block_scaled else 1)
    return tuple(plgpu.ACC(shape, jnp.float32) for _ in range(count))


def _mma_targets(s: _Static, acc_refs: tuple, block: int = 0) -> tuple:
    """The accumulators the wgmmas add into: under block scales, those of the step's scale block `block`."""
    if not s.block_scaled:
        return acc_refs
    n = _weight_tiles(s)
    return acc_refs[n * (1 + block) : n * (2 + block)]


def _k_slice(s: _Static, ref: Any, block: int) -> Any:
    """Scale block `block` of a K step's [rows, block_k] shared-memory tile (the whole tile otherwise)."""
    if s.scale_blocks == 1:
        return ref
    return ref.at[:, pl.ds(block * SCALE_BLOCK, SCALE_BLOCK)]


def _next_step(s: _Static, k0: Any, step: Any) -> Any:
    """The K step after `step` of a tile whose steps start at k0 (the last step's own: its prefetch is
    never used, but must read inside the scales)."""
    return k0 + jnp.minimum(step + 1, s.k_steps - 1)


def _promote(s: _Static, acc_refs: tuple, factors: list, block: int) -> None:
    """Block scales, after scale block `block`'s wgmmas are done: add its products times their scales
    (`factors`, one per weight tile: _Scales.step_factors) to the totals and start its accumulators
    again from zero."""
    n = _weight_tiles(s)
    partials = _mma_targets(s, acc_refs, block)
    for total, partial, factor in zip(acc_refs[:n], partials, factors, strict=True):
        product = partial[...]
        total[...] = total[...] + (product * factor[None, :] if s.swap_ab else product * factor[:, None])
        partial[...] = jnp.zeros(partial.shape, jnp.float32)


def _promote_step(s: _Static, acc_refs: tuple, factors: list) -> None:
    """After a K step's wgmmas: promote each of its scale blocks. Every block's wgmmas are waited for
    first: an accumulator read while others are still being written (promoting one block under the
    next one's wgmmas) measured slower on the H200 (docs/fp8.md)."""
    plgpu.wgmma_wait(0)
    for block in range(s.scale_blocks):
        _promote(s, acc_refs, factors[block], block)


def _take_turn(turn: Any) -> None:
    """Meet the other consumer at `turn` (a barrier both arrive at). Under stagger_consumers each
    consumer meets after issuing each step's wgmmas, consumer 1 once more before its first step and
    consumer 0 once after its last: consumer 1 then issues step j only after consumer 0 has issued it,
    and consumer 0 issues step j + 1 only after consumer 1 has issued step j - 1, so that their wgmmas
    stay about half a step apart."""
    plgpu.barrier_arrive(turn)
    plgpu.barrier_wait(turn)


def _swapped_operands(s: _Static, a_smem: Any, b_smem: Any, wg: Any = None) -> tuple[Any, Any]:
    """wgmma's (A, B) under swap_ab: the weight tile as [columns, K] (a transposed view of a [K, N] tile,
    the tile itself of an [N, K] one), this consumer's half under wg_split "n", and the lhs tile as
    [K, rows]."""
    if s.transpose_rhs:
        a = b_smem if wg is None else b_smem.at[pl.ds(wg * s.block_n, s.block_n)]
    else:
        a = (b_smem if wg is None else b_smem.at[:, pl.ds(wg * s.block_n, s.block_n)]).T
    return a, a_smem.T


def _col_offsets(s: _Static) -> tuple[int, ...]:
    """Per weight tile, its columns' offset from the gate tile's: under swiglu the up tile starts F
    columns after the gate's."""
    return (0, s.out_n)[: _weight_tiles(s)]


def _epilogue(s: _Static, acc_refs: tuple, scale: Any = None) -> jax.Array:
    """The float32 [rows, cols] result to store: the product, or silu(gate) * up. `scale(values, col0)`
    multiplies an FP8 op's accumulator of the columns from `col0` on by its scales (_Scales)."""
    if s.block_scaled:
        values = [ref[...] for ref in acc_refs[: _weight_tiles(s)]]  # the totals, already scaled
    elif scale is None:
        values = [ref[...] for ref in acc_refs]
    else:
        values = [scale(ref[...], offset) for ref, offset in zip(acc_refs, _col_offsets(s), strict=True)]
    if s.swiglu:
        gate, up = values
        return jax.nn.silu(gate) * up
    return values[0]


@dataclasses.dataclass(frozen=True)
class _Scales:
    """An FP8 tile's scales, applied to its float32 accumulator [rows, cols] ([cols, rows] under swap_ab)
    whose first row is `row0` and first column `col0`, of expert `group`.

    tensor: lhs_scale [1] and rhs_scale [G], one scalar per expert. row_channel: lhs_scale [rows past
    every window] per token and rhs_scale [G, N] per output channel, loaded from global memory into the
    accumulator's row and column layouts (a tile reads rows + cols floats, against K times as many
    operand bytes). block_1x128_128x128 (`block`, per K step): lhs_scale [K / 128, rows past every
    window], transposed so that a step's token scales are contiguous, and rhs_scale [G, N / 128, K / 128],
    one scalar per step for a tile within one 128-column block."""

    s: _Static
    refs: tuple
    group: Any
    row0: Any
    col0: Any
    rows: int
    cols: int

    def __call__(self, values: jax.Array, col_offset: int = 0) -> jax.Array:
        lhs_scale, rhs_scale = self.refs
        if self.s.scale_layout == "tensor":
            return values * (lhs_scale[0] * rhs_scale[self.group])
        # WGMMA.reduce(1) is a vector along an accumulator's rows, reduce(0) along its columns.
        along_rows, along_cols = plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA.reduce(0)
        if self.s.swap_ab:
            along_rows, along_cols = along_cols, along_rows
        token = plgpu.load(lhs_scale.at[pl.ds(self.row0, self.rows)], layout=along_rows, optimized=False)
        channel = plgpu.load(
            rhs_scale.at[self.group, pl.ds(self.col0 + col_offset, self.cols)],
            layout=along_cols,
            optimized=False,
        )
        if self.s.swap_ab:
            return values * channel[:, None] * token[None, :]
        return values * token[:, None] * channel[None, :]

    def step_factors(self, step: Any) -> list[list[jax.Array]]:
        """Per scale block of K step `step`, per weight tile: the block's token scales times its weight
        block's scale, a vector along the token rows. The pipelines load a step's factors during the
        step before (a load from global memory takes longer than one step's wgmmas), so that no wait
        follows the wgmmas' own."""
        lhs_scale, rhs_scale = self.refs
        along_rows = plgpu.Layout.WGMMA.reduce(0 if self.s.swap_ab else 1)
        offsets = _col_offsets(self.s)
        factors = []
        for block in range(self.s.scale_blocks):
            k_block = step * self.s.scale_blocks + block
            token_ref = lhs_scale.at[k_block, pl.ds(self.row0, self.rows)]
            token = plgpu.load(token_ref, layout=along_rows, optimized=False)
            factors.append(
                [token * rhs_scale[self.group, (self.col0 + off) // SCALE_BLOCK, k_block] for off in offsets]
            )
        return factors


def _scales(s: _Static, refs: tuple, **tile: Any) -> _Scales | None:
    return _Scales(s, refs, **tile) if s.scale_layout != "none" else None


def _store_rows(
    acc: jax.Array | None, out_ref: Any, smem: Any, *, row0: Any, lo: Any, hi: Any, col0: Any, s: _Static
) -> None:
    """Write rows [lo, hi) of a [block_m, block_n] result whose first row is global row `row0` (the result
    is [block_n, block_m] under swap_ab).

    `acc` None writes zeros. The result leaves in [epi_m, epi_n] chunks through two shared-memory
    slots. Every chunk commits exactly one bulk group (empty when it holds none of the rows), so "at most
    one group in flight" always means the slot about to be overwritten has been read out. In a partial
    last column tile the TMA stores clip the columns past the output's; a chunk that starts past them
    copies nothing.
    """
    first = jnp.clip(lo - row0, 0, s.block_m)
    end = jnp.clip(hi - row0, 0, s.block_m)

    @pl.when(end > first)
    def _store():
        chunk = 0
        for r in range(0, s.block_m, s.epi_m):
            lo_in = jnp.clip(first, r, r + s.epi_m)
            count = jnp.clip(end, r, r + s.epi_m) - lo_in
            for c in range(0, s.block_n, s.epi_n):
                slot = chunk % 2
                plgpu.wait_smem_to_gmem(0 if chunk == 0 else 1, wait_read_only=True)
                if s.swap_ab:
                    # acc is [columns, rows]: it goes in through the slot's transposed view, and so do the
                    # zeros (Mosaic GPU infers no layout for one buffer stored both ways).
                    if acc is None:
                        values = jnp.zeros((s.epi_n, s.epi_m), s.store_dtype)
                    else:
                        values = acc[c : c + s.epi_n, r : r + s.epi_m].astype(s.store_dtype)
                    smem.at[slot].T[...] = values
                elif acc is None:
                    smem[slot] = jnp.zeros((s.epi_m, s.epi_n), s.store_dtype)
                else:
                    smem[slot] = acc[r : r + s.epi_m, c : c + s.epi_n].astype(s.store_dtype)
                plgpu.commit_smem()
                start = lo_in - r
                for size in s.ladder:
                    take = count & size
                    copies = take != 0
                    if s.n_tail:
                        copies = copies & (col0 + c < s.out_n)

                    @pl.when(copies)
                    def _copy(start=start, size=size, slot=slot, r=r, c=c):
                        plgpu.copy_smem_to_gmem(
                            smem.at[slot, pl.ds(start, size)],
                            out_ref.at[pl.ds(row0 + r + start, size), pl.ds(col0 + c, s.epi_n)],
                            commit_group=False,
                        )

                    start = start + take
                plgpu.commit_smem_to_gmem_group()
                chunk += 1


def _plain_kernel(gs_ref, lhs_ref, rhs_ref, *refs, s: _Static) -> None:
    """One warpgroup per CTA: it issues the copies and the wgmmas, one wgmma group left in flight.

    `gs_ref` is group_sizes under the walk and the row-tile table under the table (schedule.py); `refs`
    are an FP8 op's scales, then the output."""
    *scale_refs, out_ref = refs
    delay = 1 if s.stages > 1 else 0

    def with_out_smem(o_smem):
        smem = o_smem.at[0]

        @plgpu.nd_loop((s.loop_items(gs_ref),), collective_axes=CTA_AXIS)
        def _tile(info):
            t, rows = schedule.work(info.index[0], gs_ref, s)
            has_rows = rows.hi > rows.lo
            out_view = out_ref.at[t.split] if s.split_k > 1 else out_ref
            row0 = rows.row0
            col0 = t.col * s.cta_n

            @pl.when(has_rows & (rows.group < s.g))
            def _compute():
                def acc_scope(*acc_refs):
                    scale = _scales(
                        s, scale_refs, group=rows.group, row0=row0, col0=col0, rows=s.cta_m, cols=s.cta_n
                    )
                    k0 = t.split * s.k_steps

                    def step(idx, a_smem, *b_smems_and_carry):
                        # Under block scales the carry is this step's scale factors, loaded a step ahead.
                        carried = b_smems_and_carry if s.block_scaled else (*b_smems_and_carry, None)
                        *b_smems, factors = carried
                        for block in range(s.scale_blocks):
                            a_block = _k_slice(s, a_smem, block)
                            targets = _mma_targets(s, acc_refs, block)
                            for acc_ref, b_smem in zip(targets, b_smems, strict=True):
                                b_block = _k_slice(s, b_smem, block)
                                if s.swap_ab:
                                    plgpu.wgmma(acc_ref, *_swapped_operands(s, a_block, b_block))
                                else:
                                    plgpu.wgmma(acc_ref, a_block, b_block.T if s.transpose_rhs else b_block)
                        if s.block_scaled:
                            following = scale.step_factors(_next_step(s, k0, idx[0]))
                            _promote_step(s, acc_refs, factors)
                            return following
                        # The slot of step i-1 is refilled after step i: its wgmmas (one group each)
                        # must be done.
                        plgpu.wgmma_wait(delay * len(b_smems))
                        return None

                    plgpu.emit_pipeline(
                        step,
                        grid=(s.k_steps,),
                        in_specs=_in_specs(s, rows.row0, t.col, k0, delay),
                        max_concurrent_steps=s.stages,
                        init_carry=scale.step_factors(k0) if s.block_scaled else None,
                    )(lhs_ref, *_rhs_operands(s, rhs_ref.at[rows.group]))
                    return _epilogue(s, acc_refs, scale)

                acc = pl.run_scoped(acc_scope, *_accumulators(s, (s.cta_m, s.cta_n)))
                _store_rows(acc, out_view, smem, row0=row0, lo=rows.lo, hi=rows.hi, col0=col0, s=s)

            @pl.when(has_rows & (rows.group == s.g))
            def _zero_fill():
                _store_rows(None, out_view, smem, row0=row0, lo=rows.lo, hi=rows.hi, col0=col0, s=s)

        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(with_out_smem, _out_smem(s, 1))


def _warp_specialized_kernel(gs_ref, lhs_ref, rhs_ref, *refs, s: _Static) -> None:
    """A producer warpgroup streams operands; `s.consumers` warpgroups multiply and write back."""
    *scale_refs, out_ref = refs
    wg = lax.axis_index(WARPGROUP_AXIS)

    def pipeline(row0, col, k0, body, context, state=None):
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(s.k_steps,),
            memory_registers=PRODUCER_REGISTERS,
            in_specs=_in_specs(s, row0, col, k0, 0),
            wg_axis=WARPGROUP_AXIS,
            num_compute_wgs=s.consumers,
            max_concurrent_steps=s.stages,
            compute_context=context,
            pipeline_state=state,
        )

    # Allocated once, outside the tile loop: a scoped allocation per tile would synchronise warpgroups.
    zero = jnp.int32(0)
    unused = lambda *_, **__: None  # noqa: E731 - the allocations do not depend on the body
    allocations = pipeline(zero, zero, zero, unused, unused).get_allocations(
        lhs_ref, *_rhs_operands(s, rhs_ref.at[0])
    )

    # Under stagger_consumers, the barrier at which the consumers take turns (_take_turn).
    turns = {"turn": plgpu.Barrier(num_arrivals=s.consumers)} if s.stagger else {}

    @functools.partial(
        pl.run_scoped,
        pipeline_allocs=allocations,
        o_smem=_out_smem(s, s.consumers),
        collective_axes=WARPGROUP_AXIS,
        **turns,
    )
    def _scope(pipeline_allocs, o_smem, turn=None):
        smem = o_smem.at[wg]

        # Chained: a CTA's first tile with rows starts the chain (the producer fills every stage), later
        # ones continue it (each load waits only for its slot to be consumed, so the next tile's first
        # stages stream in while the consumers finish this tile and write it back). Which tile is a CTA's
        # last with rows is not known in the loop, so no tile stops the chain; the producer waits for the
        # last stages' consumption after the loop instead, as a stopping pipeline would.
        @plgpu.nd_loop(
            (s.loop_items(gs_ref),), collective_axes=CTA_AXIS, init_carry=jnp.int32(0) if s.chain else None
        )
        def _tile(info, carry=None):
            t, rows = schedule.work(info.index[0], gs_ref, s)
            has_rows = rows.hi > rows.lo
            out_view = out_ref.at[t.split] if s.split_k > 1 else out_ref
            row0 = rows.row0 + (wg * s.block_m if s.wg_split == "m" else 0)
            col0 = t.col * s.cta_n + (wg * s.block_n if s.wg_split == "n" else 0)

            @pl.when(has_rows & (rows.group < s.g))
            def _compute():
                scale = _scales(
                    s, scale_refs, group=rows.group, row0=row0, col0=col0, rows=s.block_m, cols=s.block_n
                )

                def mma(idx, a_smem, *b_smems_and_carry):
                    # The carry: the accumulators, and under block scales this step's scale factors,
                    # loaded a step ahead so that their latency passes during the previous step.
                    *b_smems, carry = b_smems_and_carry
                    acc_refs, factors = carry if s.block_scaled else (carry, None)
                    if s.wg_split == "m":
                        a_smem = a_smem.at[pl.ds(wg * s.block_m, s.block_m)]

                    def issue():
                        for block in range(s.scale_blocks):
                            a_block = _k_slice(s, a_smem, block)
                            targets = _mma_targets(s, acc_refs, block)
                            for acc_ref, b_smem in zip(targets, b_smems, strict=True):
                                b_smem = _k_slice(s, b_smem, block)
                                if s.swap_ab:
                                    split_wg = wg if s.wg_split == "n" else None
                                    plgpu.wgmma(acc_ref, *_swapped_operands(s, a_block, b_smem, split_wg))
                                    continue
                                if s.transpose_rhs:
                                    if s.wg_split == "n":
                                        b_smem = b_smem.at[pl.ds(wg * s.block_n, s.block_n)]
                                    b_smem = b_smem.T
                                elif s.wg_split == "n":
                                    b_smem = b_smem.at[:, pl.ds(wg * s.block_n, s.block_n)]
                                plgpu.wgmma(acc_ref, a_block, b_smem)

                    if s.wg_split == "m":
                        # An expert's last window is often part empty: a consumer whose half holds none
                        # of its rows multiplies nothing (its stores skip those rows anyway).
                        pl.when(row0 < rows.hi)(issue)
                    else:
                        issue()
                    if s.stagger:
                        # Each consumer waits for its wgmmas and promotes while the other's run.
                        _take_turn(turn)
                    if s.block_scaled:
                        following = scale.step_factors(_next_step(s, t.split * s.k_steps, idx[0]))
                        _promote_step(s, acc_refs, factors)
                        return acc_refs, following
                    # The slot is released when the body returns, so its wgmmas must be done by then.
                    plgpu.wgmma_wait(0)
                    return acc_refs

                def context(run_pipeline):
                    def _acc(*acc_refs):
                        if s.stagger:
                            # The meetings that pair consumer 1's step j with consumer 0's step j + 1
                            # (_take_turn), as many for each consumer per tile.
                            pl.when(wg == 1)(lambda: _take_turn(turn))
                        if s.block_scaled:
                            run_pipeline((acc_refs, scale.step_factors(t.split * s.k_steps)))
                        else:
                            run_pipeline(acc_refs)
                        if s.stagger:
                            pl.when(wg == 0)(lambda: _take_turn(turn))
                        _store_rows(
                            _epilogue(s, acc_refs, scale),
                            out_view,
                            smem,
                            row0=row0,
                            lo=rows.lo,
                            hi=rows.hi,
                            col0=col0,
                            s=s,
                        )

                    pl.run_scoped(_acc, *_accumulators(s, (s.block_m, s.block_n)))

                state = None
                if s.chain:
                    start, steady = plgpu.PipelinePipeline.START, plgpu.PipelinePipeline.STEADY
                    state = jnp.where(carry > 0, jnp.int32(steady), jnp.int32(start))
                pipeline(rows.row0, t.col, t.split * s.k_steps, mma, context, state)(
                    lhs_ref, *_rhs_operands(s, rhs_ref.at[rows.group]), allocations=pipeline_allocs
                )

            @pl.when(has_rows & (rows.group == s.g) & (wg < s.consumers))
            def _zero_fill():
                _store_rows(None, out_view, smem, row0=row0, lo=rows.lo, hi=rows.hi, col0=col0, s=s)

            if s.chain:
                return carry | (has_rows & (rows.group < s.g)).astype(jnp.int32)

        if s.chain:
            chained = _tile  # the loop's final carry: whether this CTA ran any pipeline

            @pl.when((wg == s.consumers) & (chained > 0))
            def _stop_chain():
                # k_steps % stages == 0, so the chain's last stages used slots 0..stages-1 in order.
                for slot in range(s.stages):
                    for barrier in pipeline_allocs["flat_consumed_barrier_refs"]:
                        plgpu.barrier_wait(barrier.at[slot])

        @pl.when(wg < s.consumers)
        def _drain():
            plgpu.wait_smem_to_gmem(0)


def chains(problem: Problem, config: MosaicGpuConfig) -> bool:
    """Whether a CTA runs its tiles' pipelines as one chain: warp-specialized, persistent, and the k-steps
    of a tile a multiple of the stages (Pallas chains pipelines only when their slots line up)."""
    geo = tiling.geometry(problem, config)
    return config.warp_specialized and config.persistent and geo.k_steps % geo.stages == 0


_NAME_PREFIX = {
    GROUPED_MATMUL: "moetune_gmm_",
    GROUPED_MATMUL_SWIGLU: "moetune_gmm_swiglu_",
    GROUPED_MATMUL_FP8: "moetune_gmm_fp8_",
    GROUPED_MATMUL_SWIGLU_FP8: "moetune_gmm_swiglu_fp8_",
}


def kernel_name(config: MosaicGpuConfig, op: str = GROUPED_MATMUL) -> str:
    """Short op and config tag used as the kernel's name, so a profile shows which variant ran."""
    c = config
    parts = [
        f"m{c.block_m}n{c.block_n}k{c.block_k}s{c.max_concurrent_steps}",
        f"{c.grid_minor_dim}{c.grid_tile_width}",
        "p" if c.persistent else "np",
        f"ws{c.wg_split}" if c.warp_specialized else "plain",
        f"e{c.epi_tile_m}x{c.epi_tile_n}",
        f"sk{c.split_k}",
    ] + (["pad"] if c.pad_lhs else [])
    # Only what differs from the defaults, so that every config tuned before these existed keeps its name
    # (the name is part of the lowered module).
    parts += (["table"] if c.tile_schedule == "table" else []) + (["swab"] if c.swap_ab else [])
    parts += ["stag"] if c.stagger_consumers else []
    return _NAME_PREFIX[op] + "_".join(parts)


def grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    config: MosaicGpuConfig,
    num_sms: int,
    transpose_rhs: bool = False,
    out_dtype: Any = None,
    rows: int | None = None,
    row_start: jax.Array | None = None,
) -> jax.Array:
    """ragged_dot(lhs [M, K], rhs [G, K, N] or [G, N, K], group_sizes [G]) -> [M, N] on Hopper.

    `num_sms` sizes the persistent grid (from the device fingerprint). The config must satisfy the
    search space's constraints (the backend's build checks them); violations surface here as errors from
    Pallas. `rows` (M) when lhs carries rows past M that belong to no group, e.g. already padded by its
    producer: their contents are never stored, and the result is [M, N]. `row_start` (a traced int32
    scalar; expert parallelism's local slice of experts): the first group starts at that row, and the
    rows before it come out zero, as the rows past the groups do (the table schedule serves it, so a
    "walk" config runs as "table").
    """
    return _grouped(
        GROUPED_MATMUL, lhs, rhs, group_sizes, config, num_sms, transpose_rhs, out_dtype, rows,
        row_start=row_start,
    )  # fmt: skip


def grouped_matmul_swiglu(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    config: MosaicGpuConfig,
    num_sms: int,
    transpose_rhs: bool = False,
    out_dtype: Any = None,
    rows: int | None = None,
    row_start: jax.Array | None = None,
) -> jax.Array:
    """silu(gate) * up of ragged_dot(lhs [M, K], rhs [G, K, 2F] or [G, 2F, K]) -> [M, F] on Hopper, from
    the float32 accumulators. Needs split_k == 1. `row_start` as grouped_matmul's."""
    return _grouped(
        GROUPED_MATMUL_SWIGLU, lhs, rhs, group_sizes, config, num_sms, transpose_rhs, out_dtype, rows,
        row_start=row_start,
    )  # fmt: skip


def grouped_matmul_fp8(
    lhs: jax.Array,
    lhs_scale: jax.Array,
    rhs: jax.Array,
    rhs_scale: jax.Array,
    group_sizes: jax.Array,
    *,
    config: MosaicGpuConfig,
    num_sms: int,
    scale_layout: str,
    transpose_rhs: bool = True,
    out_dtype: Any = None,
    rows: int | None = None,
    op: str = GROUPED_MATMUL_FP8,
    row_start: jax.Array | None = None,
) -> jax.Array:
    """The FP8 grouped GEMM: dequant(lhs) [M, K] @ dequant(rhs) [G, N, K] per group -> [M, N], bf16
    unless `out_dtype` says otherwise, for the scale layouts of tiling.SCALE_LAYOUTS (scale shapes as
    kernels/ops/fp8_scales.py gives them). Weights must be K-major (`transpose_rhs`). `op` the SwiGLU
    op: silu(gate) * up into rhs [G, 2F, K], gate and up each scaled first (grouped_matmul_swiglu_fp8).
    `row_start` as grouped_matmul's: rhs and rhs_scale hold a local slice of experts whose rows start
    there (the token scales are read by lhs row, wherever the slice starts)."""
    return _grouped(
        op, lhs, rhs, group_sizes, config, num_sms, transpose_rhs, out_dtype, rows,
        scales=(lhs_scale, rhs_scale), scale_layout=scale_layout, row_start=row_start,
    )  # fmt: skip


grouped_matmul_swiglu_fp8 = functools.partial(grouped_matmul_fp8, op=GROUPED_MATMUL_SWIGLU_FP8)


def _check_operands(lhs: jax.Array, rhs: jax.Array, transpose_rhs: bool, scale_layout: str) -> None:
    if scale_layout == "none":
        if lhs.dtype != rhs.dtype or lhs.dtype not in (jnp.bfloat16, jnp.float16):
            raise ValueError(f"lhs and rhs must both be bfloat16 or float16; got {lhs.dtype}, {rhs.dtype}")
        return
    if lhs.dtype not in FP8_OPERAND_DTYPES or rhs.dtype not in FP8_OPERAND_DTYPES:
        raise ValueError(f"lhs and rhs must be float8_e4m3fn or float8_e5m2; got {lhs.dtype}, {rhs.dtype}")
    if not transpose_rhs:
        raise ValueError("8-bit wgmma takes K-major weights only: pass rhs as [G, N, K] with transpose_rhs")
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout={scale_layout!r} is not one of {SCALE_LAYOUTS}")


def _kernel_scales(
    scale_layout: str, lhs_scale: jax.Array, rhs_scale: jax.Array, lhs_rows: int, cta_m: int, cols: int
):
    """The scales as the kernel reads them (_Scales): one scalar and one per expert (tensor); the token
    scales [rows] padded past the last window's end (a window may start at row M - 1 and is cta_m rows
    tall) and the channel scales [G, N] (row_channel), padded to `cols` where a partial last column tile
    reads past N; the token scales transposed, [K / 128, rows] padded likewise, and the weight blocks'
    as they are (block)."""
    g = rhs_scale.shape[0]
    lhs_scale, rhs_scale = lhs_scale.astype(jnp.float32), rhs_scale.astype(jnp.float32)
    if scale_layout == "tensor":
        return lhs_scale.reshape(1), rhs_scale.reshape(g)
    if scale_layout == BLOCK_SCALE_LAYOUT:
        return jnp.pad(lhs_scale.T, ((0, 0), (0, lhs_rows + cta_m - lhs_scale.shape[0]))), rhs_scale
    token = lhs_scale.reshape(-1)
    token = jnp.pad(token, (0, lhs_rows + cta_m - token.shape[0]))
    channel = rhs_scale.reshape(g, -1)
    if cols > channel.shape[1]:
        channel = jnp.pad(channel, ((0, 0), (0, cols - channel.shape[1])))
    return token, channel


def _grouped(
    op: str,
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    config: MosaicGpuConfig,
    num_sms: int,
    transpose_rhs: bool,
    out_dtype: Any,
    rows: int | None,
    scales: tuple[jax.Array, jax.Array] | None = None,
    scale_layout: str = "none",
    row_start: jax.Array | None = None,
) -> jax.Array:
    if row_start is not None and config.tile_schedule != "table":
        # The rows before a local slice's first group are a group of the row-tile table (its leading
        # zero group); the walk has no place for them, and the table serves every config the walk does.
        config = dataclasses.replace(config, tile_schedule="table")
    if out_dtype is None:
        out_dtype = lhs.dtype if scale_layout == "none" else jnp.bfloat16
    out_dtype = jnp.dtype(out_dtype)
    rows = lhs.shape[0] if rows is None else rows
    if not 0 < rows <= lhs.shape[0]:
        raise ValueError(f"rows={rows} must be between 1 and lhs's {lhs.shape[0]} rows")
    _check_operands(lhs, rhs, transpose_rhs, scale_layout)
    m_rows = jax.ShapeDtypeStruct((rows, lhs.shape[1]), lhs.dtype)
    problem = problem_of(
        m_rows, rhs, group_sizes, transpose_rhs=transpose_rhs, preferred_element_type=out_dtype, op=op,
        scale_layout=scale_layout,
    )  # fmt: skip
    swiglu = problem.spec.rhs_columns_per_out_column == 2
    if swiglu and config.split_k > 1:
        raise ValueError(f"{op} needs split_k=1; got {config}")
    geo = tiling.geometry(problem, config)
    s = _Static(
        m=problem.m,
        k=problem.k,
        g=problem.g,
        block_m=config.block_m,
        block_n=config.block_n,
        block_k=config.block_k,
        cta_m=geo.cta_m,
        cta_n=geo.cta_n,
        consumers=geo.consumers,
        wg_split=config.wg_split,
        warp_specialized=config.warp_specialized,
        k_steps=geo.k_steps,
        stages=geo.stages,
        # One more group under row_start: the rows before the slice (schedule.build_table).
        row_tiles=geo.row_tiles
        if row_start is None
        else tiling.table_row_tiles(problem.m, problem.g + 1, geo.cta_m),
        col_tiles=geo.col_tiles,
        split_k=config.split_k,
        epi_m=tiling.epilogue_rows(config),
        epi_n=config.epi_tile_n,
        grid_minor_dim=config.grid_minor_dim,
        grid_tile_width=config.grid_tile_width,
        transpose_rhs=transpose_rhs,
        in_dtype=lhs.dtype,
        store_dtype=jnp.dtype(jnp.float32) if config.split_k > 1 else out_dtype,
        swiglu=swiglu,
        up_col_offset=problem.out_n // geo.cta_n if swiglu else 0,
        out_n=problem.out_n,
        chain=chains(problem, config),
        table=config.tile_schedule == "table",
        persistent=config.persistent,
        swap_ab=config.swap_ab,
        scale_layout=scale_layout,
        stagger=config.stagger_consumers,
    )
    if config.split_k > 1:
        out_type = jax.ShapeDtypeStruct((config.split_k, problem.m, problem.out_n), jnp.float32)
    else:
        out_type = jax.ShapeDtypeStruct((problem.m, problem.out_n), out_dtype)
    body = _warp_specialized_kernel if config.warp_specialized else _plain_kernel
    num_ctas = min(num_sms, s.tiles) if config.persistent else s.tiles
    kernel = plgpu.kernel(
        functools.partial(body, s=s),
        out_type=out_type,
        grid=(num_ctas,),
        grid_names=(CTA_AXIS,),
        num_threads=s.consumers + 1 if config.warp_specialized else None,
        thread_name=WARPGROUP_AXIS if config.warp_specialized else None,
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        kernel_name=kernel_name(config, op),
    )
    # TMA loads of the swizzled lhs tiles need M to be a multiple of 8 (or below 8); the padding rows
    # are never stored. Rows lhs already carries past M count (their contents are never stored either).
    if lhs.shape[0] > 8 and lhs.shape[0] % 8:
        lhs = jnp.pad(lhs, ((0, 8 - lhs.shape[0] % 8), (0, 0)))
    # TMA zero-fills the rows of a box past the array's end, and at decode that is most of every lhs tile
    # (62 of 64 rows at M=2): on the H200 the fill took gate_up's T=1 weight stream from 91% to 79% of the
    # read bandwidth (lab/bench/decode_ops.py --only stream). `pad_lhs` pads an lhs of at most one
    # window so that every window lies inside it (a copy, unless the producer left that many rows); the
    # padding rows belong to no group and are never stored.
    if config.pad_lhs and problem.m <= geo.cta_m:
        window = (problem.m - 1) // ROW_ALIGN * ROW_ALIGN + geo.cta_m
        lhs = jnp.pad(lhs, ((0, max(0, window - lhs.shape[0])), (0, 0)))
    sizes = group_sizes.astype(jnp.int32)
    if s.table:
        sizes = schedule.build_table(
            sizes, m=problem.m, cta_m=geo.cta_m, rows=s.row_tiles, row_start=row_start
        )
    # The last column tile's channel scales: up to its end, F columns on under swiglu.
    cols = s.col_tiles * s.cta_n + (problem.out_n if swiglu else 0)
    scale_args = (
        () if scales is None else _kernel_scales(scale_layout, *scales, lhs.shape[0], geo.cta_m, cols)
    )
    out = kernel(sizes, lhs, rhs, *scale_args)
    if config.split_k > 1:
        out = out.sum(axis=0).astype(out_dtype)
    return out
