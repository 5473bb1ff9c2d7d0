"""Tile geometry of the Hopper grouped GEMM: pure arithmetic shared by the kernel and its search space.

Rows are grouped contiguously by expert. The kernel walks "row tiles": windows of `cta_m` rows, each
expert's starting at its first row rounded down to 8 (schedule.py). Past sum(group_sizes) the rows form
one more group that is written with zeros. Group i of s_i rows starting at offset r_i (mod 8) takes
cdiv(s_i + r_i, cta_m) windows, so the G + 1 groups together take at most
cdiv(M + 7 (G + 1), cta_m) + G + 1 (`row_tile_bound`); tiles past the real count do nothing. Only groups
with rows take tiles, and at most min(G + 1, M) groups have rows, which bounds the row-tile table
(`table_row_tiles`) whatever G is when M is small.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.problem import Problem

# Barriers and alignment padding beside the buffers (Mosaic reported 24-64 bytes for these kernels).
SMEM_OVERHEAD_BYTES = 1024
# A TMA copy's box is at most 256 elements along each dimension.
TMA_BOX_MAX = 256
# Registers a consumer thread needs beside its accumulator (addresses, epilogue values); empirical.
NON_ACCUMULATOR_REGISTERS = 40
# FP8 scale layouts the kernel serves: scales constant along K multiply the float32 sum in the epilogue;
# block scales change every SCALE_BLOCK along K and are applied per K step (kernel_sm90).
EPILOGUE_SCALE_LAYOUTS = ("tensor", "row_channel")
BLOCK_SCALE_LAYOUT = "block_1x128_128x128"
SCALE_LAYOUTS = (*EPILOGUE_SCALE_LAYOUTS, BLOCK_SCALE_LAYOUT)
SCALE_BLOCK = 128
BLOCK_SCALED_KS = (SCALE_BLOCK, 2 * SCALE_BLOCK)  # K steps of one or two scale blocks


# Shared-memory swizzles wgmma and TMA take, widest first (bytes of a tile's contiguous row).
SWIZZLES = (128, 64, 32)
# The weight gradient's output sides: multiples of the narrowest swizzled tile's 16 bf16 columns.
DRHS_GRANULE = 16


def swizzle_bytes(columns: int, item: int) -> int:
    """The widest swizzle of which `columns` elements of `item` bytes are a whole number: Mosaic GPU tiles
    the global array by the shared-memory tiles and rounds no tiled dimension up (jax 0.11.2), so a
    dimension of 1440 bf16 columns (2880 bytes) takes 64-byte tiles, not 128-byte ones."""
    width = columns * item
    for swizzle in SWIZZLES:
        if width % swizzle == 0:
            return swizzle
    raise ValueError(f"{columns} columns of {item} bytes are no whole number of {SWIZZLES[-1]}-byte tiles")


def out_swizzle_bytes(out_n: int, epi_tile_n: int, item: int) -> int:
    """The epilogue tiles' swizzle: what an epilogue chunk's columns and the output's both divide."""
    return swizzle_bytes(math.gcd(epi_tile_n, out_n), item)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def itemsize(dtype_name: str) -> int:
    return np.dtype(dtype_name if dtype_name != "bfloat16" else "float16").itemsize


@dataclasses.dataclass(frozen=True, slots=True)
class TileGeometry:
    cta_m: int
    cta_n: int
    consumers: int
    k_steps: int  # pipeline steps per tile: cdiv(cdiv(K, block_k), split_k), the last one maybe partial
    stages: int  # pipeline depth actually allocated: min(max_concurrent_steps, k_steps)
    row_tiles: int  # static bound on row tiles (see module docstring)
    col_tiles: int
    split_k: int
    out_itemsize: int  # bytes of one element the kernel stores (float32 partial sums under split-K)

    @property
    def tiles(self) -> int:
        return self.row_tiles * self.col_tiles * self.split_k


def row_tile_bound(m: int, g: int, cta_m: int) -> int:
    """Row tiles enough for any group sizes: sum over the G + 1 groups of cdiv(s_i + r_i, cta_m), with
    r_i <= 7 and the s_i summing to M, is below (M + 7 (G + 1)) / cta_m + G + 1."""
    return cdiv(m + 7 * (g + 1), cta_m) + g + 1


def table_row_tiles(m: int, g: int, cta_m: int) -> int:
    """Rows of the row-tile table: the same sum taken over the groups that have rows only. Each of them
    has at least one of the M rows, so there are n <= min(G + 1, M); each takes at most as many tiles
    as it has rows (cta_m >= 8 > r_i), so M bounds the sum too. Example: decode at M=8 over G=128
    experts needs at most 8 row tiles, where `row_tile_bound` gives 138."""
    live = min(g + 1, m)
    return min(m, cdiv(m + 7 * live, cta_m) + live)


def row_tiles(problem: Problem, config: MosaicGpuConfig) -> int:
    """The static row-tile count of the grid under the config's tile schedule."""
    bound = table_row_tiles if config.tile_schedule == "table" else row_tile_bound
    return bound(problem.m, problem.g, config.cta_m)


def geometry(problem: Problem, config: MosaicGpuConfig) -> TileGeometry:
    k_steps = max(1, cdiv(cdiv(problem.k, config.block_k), config.split_k))
    return TileGeometry(
        cta_m=config.cta_m,
        cta_n=config.cta_n,
        consumers=config.consumers,
        k_steps=k_steps,
        stages=min(config.max_concurrent_steps, k_steps),
        row_tiles=row_tiles(problem, config),
        col_tiles=cdiv(problem.out_n, config.cta_n),
        split_k=config.split_k,
        out_itemsize=4 if config.split_k > 1 else itemsize(problem.out_dtype),
    )


def weight_tiles(problem: Problem) -> int:
    """Weight tiles per pipeline stage: the op's rhs columns per output column, two under the SwiGLU
    epilogue (gate and up), else one."""
    return problem.spec.rhs_columns_per_out_column


def scale_blocks(problem: Problem, config: MosaicGpuConfig) -> int:
    """FP8 block scales' scale blocks per K step (block_k / SCALE_BLOCK); 1 for every other op."""
    return config.block_k // SCALE_BLOCK if problem.scale_layout == BLOCK_SCALE_LAYOUT else 1


def accumulators(problem: Problem, config: MosaicGpuConfig) -> int:
    """float32 accumulators of one consumer: one per weight tile; under FP8 block scales as many again
    per scale block of a K step (each block's products apart from the scaled totals; kernel_sm90)."""
    if problem.scale_layout != BLOCK_SCALE_LAYOUT:
        return weight_tiles(problem)
    return weight_tiles(problem) * (1 + scale_blocks(problem, config))


def epilogue_rows(config: MosaicGpuConfig) -> int:
    """Rows of one epilogue chunk: epi_tile_m, or every token row of the tile under swap_ab (the
    accumulator's rows are output columns there, so a chunk is cut along those)."""
    return config.block_m if config.swap_ab else config.epi_tile_m


def stage_bytes(problem: Problem, config: MosaicGpuConfig) -> int:
    """Shared memory of one pipeline stage: the lhs tile and the weight tiles of one K step."""
    return (
        (config.cta_m + weight_tiles(problem) * config.cta_n) * config.block_k * itemsize(problem.lhs_dtype)
    )


def smem_bytes(problem: Problem, config: MosaicGpuConfig, stages: int | None = None) -> int:
    """Shared memory one CTA allocates: pipeline stages of the lhs tile and the weight tiles plus
    double-buffered epilogue tiles per consumer warpgroup. `stages` replaces the config's pipeline
    depth (a search for the deepest that fits need not build a config per depth)."""
    geo = geometry(problem, config)
    depth = geo.stages if stages is None else min(stages, geo.k_steps)
    epilogue = geo.consumers * 2 * epilogue_rows(config) * config.epi_tile_n * geo.out_itemsize
    return depth * stage_bytes(problem, config) + epilogue + SMEM_OVERHEAD_BYTES


def accumulator_registers(config: MosaicGpuConfig, count: int = 1) -> int:
    """32-bit registers per thread `count` float32 accumulators take (a warpgroup is 128 threads)."""
    return count * config.block_m * config.block_n // 128


def consumer_register_budget(config: MosaicGpuConfig, registers_per_sm: int) -> int:
    """Registers per thread a consumer warpgroup may hold: what the producer (40) leaves, capped at 255.

    Without warp specialization one warpgroup runs alone and may use up to 255.
    """
    if not config.warp_specialized:
        return 255
    per_thread = registers_per_sm // 128 - 40
    return min(255, (per_thread // config.consumers) // 8 * 8)


@dataclasses.dataclass(frozen=True, slots=True)
class DrhsTiles:
    """The weight-gradient kernel's output tiling (kernel_drhs.py): out [G, P, Q] in tiles of
    [tile_p, tile_q] per consumer warpgroup, P being the wgmma M side. P is K and Q is N, or under
    `transpose_rhs` ([G, N, K]) P is N and Q is K; block_k always tiles K and block_n N."""

    p: int
    q: int
    tile_p: int
    tile_q: int
    consumers: int

    @property
    def cta_q(self) -> int:
        return self.tile_q * self.consumers

    @property
    def tiles_per_expert(self) -> int:
        return cdiv(self.p, self.tile_p) * cdiv(self.q, self.cta_q)


def drhs_tiles(k: int, n: int, transpose_rhs: bool, config: MosaicGpuConfig) -> DrhsTiles:
    if transpose_rhs:
        return DrhsTiles(n, k, config.block_n, config.block_k, config.consumers)
    return DrhsTiles(k, n, config.block_k, config.block_n, config.consumers)


def drhs_smem_bytes(problem: Problem, config: MosaicGpuConfig) -> int:
    """Pipeline stages of one [block_m, tile_p] and one [block_m, cta_q] tile, plus one output tile per
    consumer."""
    t = drhs_tiles(problem.k, problem.n, problem.transpose_rhs, config)
    stage = config.block_m * (t.tile_p + t.cta_q) * itemsize(problem.lhs_dtype)
    out = t.consumers * t.tile_p * t.tile_q * itemsize(problem.out_dtype)
    return config.max_concurrent_steps * stage + out + SMEM_OVERHEAD_BYTES
