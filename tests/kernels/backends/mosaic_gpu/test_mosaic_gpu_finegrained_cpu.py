"""The fine-grained paths of the Hopper kernel on a CPU: the row-tile table against the walk, the
table's work items, Pallas's GPU interpreter on the table schedule and on swap-AB tiles (many experts,
few or no rows each, rows past sum(group_sizes), a local slice of experts from `row_start`, both weight
layouts, SwiGLU), and lowering to Mosaic GPU
at the development models' expert counts, with a module whose size does not grow with G."""

from __future__ import annotations

import dataclasses
import functools
import random

import numpy as np
import pytest

from tests.requires import require

jax = require("jax")
jnp = jax.numpy
plgpu = require("jax.experimental.pallas.mosaic_gpu")

from moetune.kernels.backends.mosaic_gpu import (  # noqa: E402
    kernel_sm90,
    schedule,
    space,  # noqa: E402
    tiling,
)
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C  # noqa: E402
from moetune.kernels.device import DeviceFingerprint  # noqa: E402
from moetune.kernels.problem import Problem  # noqa: E402
from moetune.kernels.reference import reference_of, relative_error  # noqa: E402

HOPPER = DeviceFingerprint("NVIDIA H200", "gpu", 132, 0, "9.0", "", "", "", "")
PLAIN = dict(warp_specialized=False, wg_split="none")
TABLE = dict(tile_schedule="table")


def _random_sizes(rng: random.Random, m: int, g: int) -> list[int]:
    """Sizes of g experts, many empty, summing to at most m (sometimes past it)."""
    sizes = [rng.choice([0, 0, rng.randint(0, max(1, m // 4))]) for _ in range(g)]
    if rng.random() < 0.3:
        sizes[rng.randrange(g)] += m  # sum(group_sizes) > M: rows past M are dropped
    return sizes


def _walked(sizes, m, cta_m):
    g = len(sizes)
    ref = jnp.asarray(sizes, jnp.int32)
    tiles = []
    for t in range(tiling.row_tile_bound(m, g, cta_m)):
        r = schedule.row_tile(ref, jnp.int32(t), g=g, m=m, cta_m=cta_m)
        tiles.append((int(r.group), int(r.row0), int(r.lo), int(r.hi)))
    return [t for t in tiles if t[3] > t[2]]


@pytest.mark.parametrize("seed", range(12))
def test_table_rows_are_the_walks_tiles(seed):
    rng = random.Random(seed)
    g, cta_m = rng.choice([1, 3, 8, 33]), rng.choice([8, 16, 64, 128])
    m = rng.randint(1, 400)
    sizes = _random_sizes(rng, m, g)
    rows = tiling.table_row_tiles(m, g, cta_m)
    table = np.asarray(schedule.build_table(jnp.asarray(sizes, jnp.int32), m=m, cta_m=cta_m, rows=rows))
    walked = _walked(sizes, m, cta_m)
    total = len(walked)
    assert total <= rows <= m
    assert (table[:, schedule.TOTAL] == total).all()
    fields = [schedule.GROUP, schedule.ROW0, schedule.LO, schedule.HI]
    assert [tuple(r) for r in table[:total, fields].tolist()] == walked
    # Idle rows: no group, no rows.
    assert (table[total:, schedule.GROUP] == g + 1).all() and (table[total:, schedule.HI] == 0).all()
    # Each tile names its group's first tile and tile count.
    for t, (group, *_rest) in enumerate(walked):
        own = [i for i, w in enumerate(walked) if w[0] == group]
        assert (table[t, schedule.BASE], table[t, schedule.COUNT]) == (own[0], len(own))


def test_table_worked_example():
    table = schedule.build_table(jnp.asarray([3, 0, 6], jnp.int32), m=12, cta_m=4, rows=6)
    assert np.asarray(table)[2].tolist() == [2, 4, 4, 8, 1, 3, 5, 0]


def test_table_rows_do_not_grow_with_g_for_small_m():
    # Decode: 8 rows over 128-512 experts need at most 8 row tiles; the walk's bound carries G of them.
    for g in (128, 256, 512):
        assert tiling.table_row_tiles(8, g, 64) == 8
        assert tiling.row_tile_bound(8, g, 64) > g
    assert tiling.table_row_tiles(32768, 8, 128) == tiling.row_tile_bound(32768, 8, 128)


def _table_walk(sizes, m, cta_m, cols, order, width, split_k=1):
    """(split, row tile, column tile) of every work item of the table schedule, and the table."""
    g = len(sizes)
    rows = tiling.table_row_tiles(m, g, cta_m)
    table = schedule.build_table(jnp.asarray(sizes, jnp.int32), m=m, cta_m=cta_m, rows=rows)
    s = dataclasses.make_dataclass("S", ["g", "col_tiles", "split_k", "grid_minor_dim", "grid_tile_width"])(
        g, cols, split_k, order, width
    )

    def item(lin):
        coords, tiles = schedule.table_work(lin, table, s)
        return coords.split, coords.row, coords.col, tiles.hi > tiles.lo

    split, row, col, live = map(np.asarray, jax.jit(jax.vmap(item))(jnp.arange(rows * cols * split_k)))
    items = list(zip(split[live].tolist(), row[live].tolist(), col[live].tolist(), strict=True))
    return items, int(np.asarray(schedule.table_items(table, s))), live


@pytest.mark.parametrize("order, width", [("m", 1), ("m", 8), ("n", 4), ("expert", 2), ("expert", 8)])
@pytest.mark.parametrize("seed", range(3))
def test_table_work_items_visit_every_tile_once_and_the_real_ones_first(order, width, seed):
    rng = random.Random(seed)
    g, cta_m, cols, split_k = (
        rng.choice([3, 8, 40]),
        rng.choice([16, 64]),
        rng.choice([1, 3]),
        rng.choice([1, 2]),
    )
    m = rng.randint(1, 500)
    sizes = _random_sizes(rng, m, g)
    total = len(_walked(sizes, m, cta_m))
    items, count, live = _table_walk(sizes, m, cta_m, cols, order, width, split_k)
    assert count == total * cols * split_k  # a persistent loop's item count
    expected = {(k, r, c) for k in range(split_k) for r in range(total) for c in range(cols)}
    assert sorted(items) == sorted(expected)
    # Real items first: a grid of one CTA per item starts its idle CTAs last.
    assert live[:count].all() and not live[count:].any()


def _interpret(config, m, k, n, sizes, *, op="grouped_matmul", transpose=False, row_start=None):
    """The interpreter against the float32 reference, with the weights of experts without rows NaN (a
    kernel that reads them into its products shows it), then lowering the same call for cuda (layout
    inference, which the interpreter skips). With `row_start` (a local slice of experts, as expert
    parallelism calls the kernel) the groups start at that row, and every row outside them is zero."""
    g = len(sizes)
    problem = Problem(op, m=m, k=k, n=n, g=g, transpose_rhs=transpose)
    key_l, key_r = jax.random.split(jax.random.key(m + n + g + (row_start or 0)))
    lhs = jax.random.normal(key_l, (m, k), jnp.bfloat16)
    rhs = jax.random.normal(key_r, problem.rhs_shape, jnp.bfloat16)
    empty = jnp.asarray([s == 0 for s in sizes])[:, None, None]
    group_sizes = jnp.asarray(sizes, jnp.int32)
    fn = kernel_sm90.grouped_matmul_swiglu if op == "grouped_matmul_swiglu" else kernel_sm90.grouped_matmul
    kernel = functools.partial(fn, config=config, num_sms=3, transpose_rhs=transpose)
    sliced = {} if row_start is None else {"row_start": jnp.int32(row_start)}
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        out = kernel(lhs, jnp.where(empty, jnp.nan, rhs).astype(jnp.bfloat16), group_sizes, **sliced)
    out = np.asarray(out.astype(jnp.float32))
    start = row_start or 0
    end = min(start + sum(sizes), m)
    assert out.shape == (m, problem.out_n) and np.isfinite(out).all()
    if end > start:  # the reference of the groups' own rows
        local = dataclasses.replace(problem, m=end - start)
        clipped = jnp.asarray(np.diff(np.minimum(np.cumsum([0, *sizes]), end - start)), jnp.int32)
        ref = np.asarray(reference_of(local)(lhs[start:end], rhs, clipped))
        assert relative_error(out[start:end], ref) < 1e-2
    assert not out[:start].any() and not out[end:].any()
    if row_start is None:
        assert "mosaic_gpu" in _lowered(config, problem)


# 64 experts, most empty, a few rows each, and a zero tail past sum(group_sizes) = 43 of M=48.
SIXTY_FOUR = [0] * 64
for _expert, _rows in ((0, 3), (5, 1), (6, 9), (31, 17), (40, 2), (63, 11)):
    SIXTY_FOUR[_expert] = _rows


@pytest.mark.parametrize(
    "config, transpose",
    [
        (C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, **PLAIN, **TABLE), False),
        (C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n", **TABLE), True),
        (C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=4, wg_split="m", **TABLE), False),
        (
            C(block_m=64, block_n=64, block_k=32, max_concurrent_steps=2, persistent=False, **PLAIN, **TABLE),
            True,
        ),
        (C(block_m=8, block_n=64, block_k=64, max_concurrent_steps=2, **PLAIN, **TABLE), False),
        (C(block_m=16, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n", **TABLE), True),
        (
            C(
                block_m=32,
                block_n=128,
                block_k=64,
                max_concurrent_steps=2,
                wg_split="n",
                **TABLE,
            ),
            False,
        ),
        (
            C(
                block_m=8,
                block_n=64,
                block_k=64,
                max_concurrent_steps=2,
                persistent=False,
                wg_split="none",
                **TABLE,
            ),
            True,
        ),
    ],
    ids=[
        "table-plain",
        "table-ws-n-t",
        "table-ws-m",
        "table-np-t",
        "swap8-plain",
        "swap16-ws-t",
        "swap32-ws",
        "swap8-np-t",
    ],
)
def test_interpreted_sixty_four_experts_few_rows_each(config, transpose):
    _interpret(config, 48, 128, 256, SIXTY_FOUR, transpose=transpose)


@pytest.mark.parametrize(
    "config, transpose",
    [
        (C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, **PLAIN, **TABLE), True),
        (C(block_m=8, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n", **TABLE), False),
        (
            C(block_m=16, block_n=64, block_k=64, max_concurrent_steps=2, persistent=False, **PLAIN, **TABLE),
            True,
        ),
    ],
    ids=["table-plain-t", "swap8-ws", "swap16-np-t"],
)
def test_interpreted_swiglu_over_many_experts(config, transpose):
    _interpret(config, 48, 128, 256, SIXTY_FOUR, op="grouped_matmul_swiglu", transpose=transpose)


def test_interpreted_table_expert_order_and_split_k_over_experts_of_several_tiles():
    # Experts of 0-3 row tiles of 16 rows, a row past every expert, strips of 2 row tiles, split-K.
    sizes = [40, 0, 7, 30, 0, 2]
    expert = C(
        block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n", grid_minor_dim="expert"
    )
    _interpret(dataclasses.replace(expert, grid_tile_width=2, **TABLE), 80, 256, 128, sizes)
    split = C(
        block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, epi_tile_n=32, split_k=2, **PLAIN, **TABLE
    )
    _interpret(split, 80, 256, 128, sizes)
    swapped = C(
        block_m=16, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n", grid_minor_dim="expert"
    )
    _interpret(dataclasses.replace(swapped, grid_tile_width=2, **TABLE), 80, 256, 128, sizes, transpose=True)


def test_interpreted_every_expert_empty_and_rows_past_m():
    for config in (
        C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, **PLAIN, **TABLE),
        C(block_m=8, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n", **TABLE),
        C(block_m=8, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n"),  # swapped, walked
    ):
        _interpret(config, 24, 64, 128, [0] * 16)  # all zeros
        _interpret(config, 24, 64, 128, [0, 20, 0, 30] + [0] * 12)  # the last expert cut at M


@pytest.mark.parametrize("seed", range(2))
def test_interpreted_heuristic_configs_of_small_fine_grained_problems(seed):
    rng = random.Random(seed)
    g, m = rng.choice([16, 40]), rng.choice([8, 40])
    for op in ("grouped_matmul", "grouped_matmul_swiglu"):
        problem = Problem(op, m=m, k=256, n=256, g=g)
        config = space.heuristic(problem, HOPPER)
        _interpret(config, m, 256, 256, _random_sizes(rng, m, g), op=op, transpose=rng.random() < 0.5)


def _lowered(config, problem):
    fn = (
        kernel_sm90.grouped_matmul_swiglu
        if problem.op == "grouped_matmul_swiglu"
        else kernel_sm90.grouped_matmul
    )
    args = (
        jax.ShapeDtypeStruct((problem.m, problem.k), jnp.bfloat16),
        jax.ShapeDtypeStruct(problem.rhs_shape, jnp.bfloat16),
        jax.ShapeDtypeStruct((problem.g,), jnp.int32),
    )
    kernel = functools.partial(fn, config=config, num_sms=132, transpose_rhs=problem.transpose_rhs)
    return jax.export.export(jax.jit(kernel), platforms=["cuda"])(*args).mlir_module()


# Development shapes: Qwen3-30B-A3B (128 experts), DeepSeek-V3 (256), Qwen3-Next-80B-A3B (512).
DEV = {
    "qwen3-gate-up": Problem("grouped_matmul_swiglu", m=8, k=2048, n=1536, g=128),
    "qwen3-down": Problem("grouped_matmul", m=8, k=768, n=2048, g=128),
    "deepseek-gate-up": Problem("grouped_matmul_swiglu", m=8, k=7168, n=4096, g=256),
    "deepseek-down": Problem("grouped_matmul", m=8, k=2048, n=7168, g=256),
    "qwen3-next-gate-up": Problem("grouped_matmul_swiglu", m=10, k=2048, n=1024, g=512),
    "qwen3-next-down": Problem("grouped_matmul", m=10, k=512, n=2048, g=512),
}


@pytest.mark.parametrize("tokens", [1, 128, 4096])
@pytest.mark.parametrize("name", sorted(DEV))
def test_heuristic_configs_lower_for_hopper_at_the_development_shapes(name, tokens):
    problem = DEV[name].with_m(DEV[name].m * tokens)
    config = space.heuristic(problem, HOPPER)
    assert config.tile_schedule == "table"
    assert "mosaic_gpu" in _lowered(config, problem)


@pytest.mark.parametrize(
    "config",
    [
        C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n", **TABLE),
        C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, grid_minor_dim="expert", **TABLE),
        C(block_m=16, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n", **TABLE),
    ],
    ids=["ws-n", "expert-order", "swap16"],
)
def test_the_tables_kernel_does_not_grow_with_g(config):
    """The walk unrolls every group into the kernel; the table's kernel is the same code at any G (only
    the prologue's array shapes differ)."""
    problem = Problem("grouped_matmul", m=1024, k=2048, n=1536, g=8)
    sizes = {g: len(_lowered(config, dataclasses.replace(problem, g=g))) for g in (8, 128, 512)}
    assert max(sizes.values()) - min(sizes.values()) < 0.01 * min(sizes.values()), sizes
    walk = dataclasses.replace(config, tile_schedule="walk")
    assert len(_lowered(walk, dataclasses.replace(problem, g=128))) > 1.2 * sizes[128]


@pytest.mark.parametrize(
    "config, op",
    [
        (
            C(block_m=16, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n", **TABLE),
            "grouped_matmul",
        ),
        (
            C(block_m=8, block_n=64, block_k=128, max_concurrent_steps=3, **PLAIN, **TABLE),
            "grouped_matmul_swiglu",
        ),
    ],
    ids=["swap16-ws", "swap8-plain-swiglu"],
)
def test_smem_model_is_not_below_what_mosaic_allocates_for_swapped_tiles(monkeypatch, config, op):
    """With Mosaic's limit forced to 1 byte, its error reports the bytes the kernel really needs."""
    from jax.experimental.mosaic.gpu import core as mosaic_core

    problem = Problem(op, m=256, k=1024, n=512, g=128)
    monkeypatch.setattr(mosaic_core, "_SMEM_SIZE_BOUND", 1)
    with pytest.raises(ValueError, match="exceeds available shared memory") as info:
        _lowered(config, problem)
    actual = int(str(info.value).split("smem_bytes=")[1].split()[0])
    assert actual <= tiling.smem_bytes(problem, config) <= actual + tiling.SMEM_OVERHEAD_BYTES


# The local experts' rows: 31 in all, one expert empty (its weights must not be read).
LOCAL = [0, 9, 3, 0, 17, 2]


@pytest.mark.parametrize(
    "config, op, transpose",
    [
        # a walk config: it runs on the table, whose leading zero group holds the rows before the slice
        (C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n"), "grouped_matmul", True),
        (
            C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, tile_schedule="table", **PLAIN),
            "grouped_matmul",
            False,
        ),
        (
            C(
                block_m=16,
                block_n=64,
                block_k=64,
                max_concurrent_steps=2,
                wg_split="n",
                tile_schedule="table",
            ),
            "grouped_matmul",
            True,
        ),
        (
            C(
                block_m=64,
                block_n=64,
                block_k=64,
                max_concurrent_steps=2,
                wg_split="n",
                grid_minor_dim="expert",
                grid_tile_width=2,
            ),
            "grouped_matmul",
            False,
        ),
        (
            C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, epi_tile_n=32, split_k=2, **PLAIN),
            "grouped_matmul",
            False,
        ),
        (
            C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, **PLAIN),
            "grouped_matmul_swiglu",
            True,
        ),
        (
            C(block_m=8, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n", persistent=False),
            "grouped_matmul_swiglu",
            False,
        ),
    ],
    ids=[
        "walk-ws-t",
        "table-plain",
        "swap16-ws-t",
        "expert-order",
        "split-k",
        "swiglu-plain-t",
        "swiglu-swap8-np",
    ],
)
def test_interpreted_a_local_slice_starts_at_row_start_and_the_rest_is_zero(config, op, transpose):
    _interpret(config, 80, 128, 256, LOCAL, op=op, transpose=transpose, row_start=13)  # not a multiple of 8


def test_interpreted_slices_at_row_zero_and_cut_at_m():
    config = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n")
    _interpret(config, 80, 128, 128, LOCAL, row_start=0)
    _interpret(
        config, 80, 128, 128, LOCAL, row_start=64
    )  # 64 + 31 rows: the slice's last experts cut at M = 80
    _interpret(config, 48, 128, 128, [0, 0, 0], row_start=20)  # no local rows: all zero


def test_the_table_puts_the_rows_before_the_slice_in_a_leading_zero_group():
    # 3 rows before the slice, experts of 5, 0 and 6 rows, M = 16, 4-row tiles: the zero group holds rows
    # 0-2, expert 0 rows 3-7 over windows 0-3 and 4-7, expert 2 rows 8-13, then the zero tail rows 14-15.
    sizes, g = jnp.asarray([5, 0, 6], jnp.int32), 3
    table = np.asarray(schedule.build_table(sizes, m=16, cta_m=4, rows=9, row_start=jnp.int32(3)))
    fields = [schedule.GROUP, schedule.ROW0, schedule.LO, schedule.HI]
    live = [tuple(int(v) for v in row[fields]) for row in table if row[schedule.HI] > row[schedule.LO]]
    assert live == [(g, 0, 0, 3), (0, 0, 3, 4), (0, 4, 4, 8), (2, 8, 8, 12), (2, 12, 12, 14), (g, 12, 14, 16)]
    total = int(table[0, schedule.TOTAL])
    assert (table[total:, schedule.GROUP] == g + 1).all()  # idle past the real tiles
    without = np.asarray(schedule.build_table(sizes, m=16, cta_m=4, rows=9))
    assert tuple(int(v) for v in without[0, fields]) == (0, 0, 0, 4)  # no row_start: expert 0 from row 0
