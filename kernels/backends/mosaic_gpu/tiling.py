"""Tile geometry of the Hopper grouped GEMM: pure arithmetic shared by the kernel and its search space.

Rows are grouped contiguously by expert. The kernel walks "row tiles": windows of `cta_m` rows, each
expert's starting at its first row rounded down to 8 (kernel_sm90.row_tile). Past sum(group_sizes) the
rows form one more group that is written with zeros. Group i of s_i rows starting at offset r_i (mod 8)
takes cdiv(s_i + r_i, cta_m) windows, so the G + 1 groups together take at most
cdiv(M + 7 (G + 1), cta_m) + G + 1 (`row_tile_bound`); tiles past the real count do nothing.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.problem import Problem

# Barriers and alignment padding beside the buffers (Mosaic reported 24-64 bytes for these kernels).
SMEM_OVERHEAD_BYTES = 1024
# A TMA copy's box is at most 256 elements along each dimension.
TMA_BOX_MAX = 256


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def itemsize(dtype_name: str) -> int:
    return np.dtype(dtype_name if dtype_name != "bfloat16" else "float16").itemsize


@dataclasses.dataclass(frozen=True, slots=True)
class TileGeometry:
    cta_m: int
    cta_n: int
    consumers: int
    k_steps: int  # pipeline steps per tile: K / (block_k * split_k)
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


def geometry(problem: Problem, config: MosaicGpuConfig) -> TileGeometry:
    k_steps = max(1, problem.k // (config.block_k * config.split_k))
    return TileGeometry(
        cta_m=config.cta_m,
        cta_n=config.cta_n,
        consumers=config.consumers,
        k_steps=k_steps,
        stages=min(config.max_concurrent_steps, k_steps),
        row_tiles=row_tile_bound(problem.m, problem.g, config.cta_m),
        col_tiles=cdiv(problem.out_n, config.cta_n),
        split_k=config.split_k,
        out_itemsize=4 if config.split_k > 1 else itemsize(problem.out_dtype),
    )


def accumulators(problem: Problem) -> int:
    """float32 accumulators (and weight tiles per pipeline stage) of one CTA: the op's rhs columns per
    output column, two under the SwiGLU epilogue (gate and up), else one."""
    return problem.spec.rhs_columns_per_out_column


def smem_bytes(problem: Problem, config: MosaicGpuConfig) -> int:
    """Shared memory one CTA allocates: pipeline stages of the lhs tile and the weight tiles plus
    double-buffered epilogue tiles per consumer warpgroup."""
    geo = geometry(problem, config)
    in_bytes = itemsize(problem.lhs_dtype)
    stage = (geo.cta_m + accumulators(problem) * geo.cta_n) * config.block_k * in_bytes
    epilogue = geo.consumers * 2 * config.epi_tile_m * config.epi_tile_n * geo.out_itemsize
    return geo.stages * stage + epilogue + SMEM_OVERHEAD_BYTES


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
