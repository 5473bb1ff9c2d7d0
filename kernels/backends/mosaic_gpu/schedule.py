"""Which rows, columns and K split each work item of the Hopper grouped GEMM covers (kernel_sm90.py).

A row tile is one expert's rows inside a window of `cta_m` rows that starts at a multiple of 8; a work
item is a (row tile, column tile, K split) triple. Two tile schedules (MosaicGpuConfig.tile_schedule)
find a row tile's expert:

  "walk"   every work item walks all G groups, unrolled, reading group_sizes from memory (`row_tile`):
           per-item work, code size and compile time grow with G, and the grid carries
           tiling.row_tile_bound row tiles, about G of them idle. Every config tuned before "table"
           existed lowers exactly as it did.
  "table"  an XLA prologue (`build_table`) turns group_sizes into one row per row tile, once per call;
           a work item reads its tile's row (one 32-byte load) whatever G is, and the grid carries
           tiling.table_row_tiles rows, which for small M is M, not M + G. A persistent kernel loops
           over the real tiles only (their count is in the table); one CTA per item leaves early on
           items past them.

Why a prologue rather than the kernel itself: a tile's expert is a search over prefix sums of
group_sizes, and Mosaic GPU's warpgroup semantics has no scan; a loop over groups in each CTA would be
the walk again. The prologue is a few small XLA fusions (two cumulative sums and a compare-and-count),
shared by every GEMM of a step that uses the same group_sizes and cta_m.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

# An expert's windows start at its first row rounded down to this: lhs tiles are tiled by 8 rows in
# shared memory (plgpu.TilingTransform), so a TMA load may start on any multiple of 8.
ROW_ALIGN = 8

# Columns of the row-tile table: one 32-byte row per row tile.
GROUP, ROW0, LO, HI, BASE, COUNT, TOTAL = range(7)
TABLE_FIELDS = 8


@dataclasses.dataclass(frozen=True)
class RowTile:
    """The rows one row tile covers: rows [lo, hi) of expert `group`, inside the window of `cta_m` rows that
    starts at row `row0` (what the tile loads from lhs and stores from).

    `group` is G for the zero-filled rows past sum(group_sizes); `hi <= lo` means the tile is idle.
    """

    group: jax.Array
    row0: jax.Array
    lo: jax.Array
    hi: jax.Array


@dataclasses.dataclass(frozen=True)
class TileCoords:
    row: jax.Array
    col: jax.Array
    split: jax.Array


def _group_windows(group_sizes_ref: Any, *, g: int, m: int, cta_m: int):
    """Per group in order (the G experts, then the zero group of rows past them): its rows [start, end),
    its first window's row `first` (start rounded down to 8) and its row tile count, 0 without rows.

    A generator: a caller's own per-group ops trace between one group's and the next's, in the order
    row_tile has always emitted them, so its kernels lower unchanged."""
    i32 = jnp.int32
    end = i32(0)
    for i in range(g + 1):
        start = end
        if i < g:
            size = jnp.clip(group_sizes_ref[i], 0, m).astype(i32)
            end = jnp.minimum(start + size, m)
        else:
            end = i32(m)
        first = start - lax.rem(start, i32(ROW_ALIGN))
        yield start, end, first, jnp.where(end > start, lax.div(end - first + cta_m - 1, i32(cta_m)), 0)


def row_tile(group_sizes_ref: Any, t: jax.Array, *, g: int, m: int, cta_m: int) -> RowTile:
    """Row tile number `t`, found by walking the groups in order (unrolled: G is static).

    Each expert's tiles are consecutive windows of `cta_m` rows from its first row rounded down to 8, so an
    expert of s rows takes cdiv(s + (start % 8), cta_m) tiles wherever its rows start (tiles aligned to
    global cta_m-row blocks would take one more whenever its rows straddle a block boundary).
    Example: group_sizes=[3, 0, 6], m=12, cta_m=4. Expert 0 owns rows 0-2, expert 1 none, expert 2 rows
    3-8, the zero group rows 9-11. The tiles are (expert 0, window 0-3, rows 0-2), (expert 2, window 0-3,
    row 3), (expert 2, window 4-7, rows 4-7), (expert 2, window 8-11, row 8), (zero group, window 8-11,
    rows 9-11); tiles past them, up to tiling.row_tile_bound, are idle. Expert 1 gets no tile, so its
    weights are never read. Sizes are clamped so that rows past M (sum(group_sizes) > M) are dropped, as
    ragged_dot drops them.
    """
    i32 = jnp.int32
    tiles_before = i32(0)
    group, row0, lo, hi = i32(g + 1), i32(0), i32(0), i32(0)
    for i, (start, end, first, count) in enumerate(_group_windows(group_sizes_ref, g=g, m=m, cta_m=cta_m)):
        mine = (t >= tiles_before) & (t < tiles_before + count)
        window = first + (t - tiles_before) * cta_m
        group = jnp.where(mine, i32(i), group)
        row0 = jnp.where(mine, window, row0)
        lo = jnp.where(mine, jnp.maximum(start, window), lo)
        hi = jnp.where(mine, jnp.minimum(end, window + cta_m), hi)
        tiles_before = tiles_before + count
    return RowTile(group=group, row0=row0, lo=lo, hi=hi)


def walk_coords(lin: jax.Array, gs_ref: Any, s: Any) -> TileCoords:
    """Linear work index -> (row tile, column tile, K split) under the walk; the split is slowest so that
    each split's tiles follow the L2-friendly snake order."""
    per_split = s.row_tiles * s.col_tiles
    if s.split_k > 1:
        split = lax.div(lin, jnp.int32(per_split))
        lin = lin - split * per_split
    else:
        split = jnp.int32(0)
    if s.grid_minor_dim == "expert":
        row, col = expert_order(lin, gs_ref, s)
    else:
        minor = 0 if s.grid_minor_dim == "m" else 1
        row, col = plgpu.planar_snake(lin, (s.row_tiles, s.col_tiles), minor, s.grid_tile_width)
    return TileCoords(row=row, col=col, split=split)


def expert_order(lin: jax.Array, gs_ref: Any, s: Any) -> tuple[jax.Array, jax.Array]:
    """(row tile, column tile) of work item `lin` when every group's tiles are walked before the next
    group's, each group in strips of `grid_tile_width` of its own row tiles (snaking over the columns).

    A strip of the plain "m" order that straddles experts needs two or three experts' weight columns in
    L2 at once; under skewed routing most strips do (Zipf at T=4096: 24, 12, 8, 6, 5, 4, 4, 3 row tiles).
    Here a strip never mixes experts. Items past the last real tile map to row tile `row_tiles`, which
    row_tile reports idle.
    """
    cols = jnp.int32(s.col_tiles)
    before, base, count = jnp.int32(0), jnp.int32(0), jnp.int32(1)
    for *_, tiles in _group_windows(gs_ref, g=s.g, m=s.m, cta_m=s.cta_m):
        mine = (lin >= before * cols) & (lin < (before + tiles) * cols)
        base = jnp.where(mine, before, base)
        count = jnp.where(mine, tiles, count)
        before = before + tiles
    live = lin < before * cols
    local = jnp.where(live, lin - base * cols, 0)
    row, col = plgpu.planar_snake(local, (count, s.col_tiles), 0, s.grid_tile_width)
    return jnp.where(live, base + row, jnp.int32(s.row_tiles)), col


def build_table(
    group_sizes: jax.Array, *, m: int, cta_m: int, rows: int, row_start: jax.Array | None = None
) -> jax.Array:
    """The row-tile table, int32 [rows, TABLE_FIELDS]: row t holds row tile t's (GROUP, ROW0, LO, HI) as
    `row_tile` would find them, the first tile and tile count of its group (BASE, COUNT, for the expert
    order), and the number of real row tiles (TOTAL, the same in every row). Rows past the real tiles
    are idle: group G + 1, no rows.

    `row_start` (a traced int32 scalar: a local slice of experts, jax.lax.ragged_dot's group_offset):
    the first group starts there, and the rows before it are a leading zero group (GROUP G, as the
    rows past the groups are), so they come out zero. It takes up to one more row tile
    (tiling.table_row_tiles over G + 1 groups bounds the sum).

    Example: group_sizes=[3, 0, 6], m=12, cta_m=4 (row_tile's): the groups' tile counts are 1, 0, 3 and 1
    (the zero group), so tile_end = [1, 1, 4, 5]; tile 2 is the first t with tile_end > 2 at group 2,
    its 2 - tile_start = 1st window, rows 4-7: (2, 4, 4, 8, 1, 3, 5, 0).
    """
    i32 = jnp.int32
    g = group_sizes.shape[0]
    sizes = jnp.clip(group_sizes.astype(i32), 0, m)
    if row_start is not None:
        sizes = jnp.concatenate([jnp.clip(jnp.asarray(row_start, i32), 0, m).reshape(1), sizes])
    n = sizes.shape[0]  # the groups in order: G experts (after the leading zero group under row_start)
    # min(cumsum, m) is row_tile's running min(start + size, m): both drop the rows past M.
    ends = jnp.concatenate([jnp.minimum(jnp.cumsum(sizes), m), jnp.full((1,), m, i32)])
    starts = jnp.concatenate([jnp.zeros((1,), i32), ends[:-1]])
    first = starts - starts % ROW_ALIGN
    counts = jnp.where(ends > starts, (ends - first + cta_m - 1) // cta_m, 0)
    tile_end = jnp.cumsum(counts)
    tile_start = tile_end - counts
    t = jnp.arange(rows, dtype=i32)
    group = jnp.sum(tile_end[None, :] <= t[:, None], axis=1, dtype=i32)  # n + 1 past the last tile
    live = group <= n
    gi = jnp.minimum(group, n)
    row0 = first[gi] + (t - tile_start[gi]) * cta_m
    lo = jnp.maximum(starts[gi], row0)
    hi = jnp.minimum(ends[gi], row0 + cta_m)
    # Under row_start the order's first group is the leading zero group: expert i is the (i + 1)-th.
    expert = gi if row_start is None else jnp.where(gi == 0, g, gi - 1)
    fields = [jnp.where(live, expert, g + 1)]
    fields += [jnp.where(live, v, 0) for v in (row0, lo, hi, tile_start[gi], counts[gi])]
    fields += [jnp.broadcast_to(tile_end[-1], (rows,)), jnp.zeros((rows,), i32)]
    return jnp.stack(fields, axis=1)


def table_items(table_ref: Any, s: Any) -> jax.Array:
    """Work items of the real row tiles (the table's TOTAL), over every column tile and K split."""
    return table_ref[0, TOTAL] * jnp.int32(s.col_tiles * s.split_k)


def table_work(lin: jax.Array, table_ref: Any, s: Any) -> tuple[TileCoords, RowTile]:
    """Work item `lin` under the table: the same orders as the walk's, over the real row tiles only.

    Under the expert order a row tile's row names its group's first tile and tile count, so the item's
    group is found from any of its row tiles: lin // col_tiles lies in the group's own range of tiles.
    Items past the real ones (a grid of one CTA per item is sized for the table's static row count) get
    an idle tile.
    """
    i32 = jnp.int32
    total = table_ref[0, TOTAL]
    cols = i32(s.col_tiles)
    per_split = total * cols
    if s.split_k > 1:
        split = lax.div(lin, per_split)
        lin = lin - split * per_split
    else:
        split = i32(0)
    live = (lin < per_split) & (split < s.split_k)
    lin = jnp.where(live, lin, 0)
    if s.grid_minor_dim == "expert":
        own = lax.div(lin, cols)
        base, count = table_ref[own, BASE], table_ref[own, COUNT]
        row, col = plgpu.planar_snake(lin - base * cols, (count, cols), 0, s.grid_tile_width)
        row = base + row
    else:
        minor = 0 if s.grid_minor_dim == "m" else 1
        row, col = plgpu.planar_snake(lin, (total, cols), minor, s.grid_tile_width)
    idle = lambda v: jnp.where(live, v, 0)  # noqa: E731 - four fields, one rule
    rows = RowTile(
        group=jnp.where(live, table_ref[row, GROUP], i32(s.g + 1)),
        row0=idle(table_ref[row, ROW0]),
        lo=idle(table_ref[row, LO]),
        hi=idle(table_ref[row, HI]),
    )
    return TileCoords(row=row, col=col, split=split), rows


def work(lin: jax.Array, sched_ref: Any, s: Any) -> tuple[TileCoords, RowTile]:
    """Work item `lin`'s coordinates and rows under the config's tile schedule (`sched_ref` is
    group_sizes for the walk, the row-tile table otherwise)."""
    if s.table:
        return table_work(lin, sched_ref, s)
    t = walk_coords(lin, sched_ref, s)
    return t, row_tile(sched_ref, t.row, g=s.g, m=s.m, cta_m=s.cta_m)
