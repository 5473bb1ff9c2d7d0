"""The Hopper kernel on a CPU: row-tile arithmetic, Pallas's GPU interpreter, and lowering to Mosaic GPU.

The interpreter runs the kernel's jaxpr (TMA copies, barriers, wgmma, both pipelines) on the CPU, so
index arithmetic, the zero-filled tail and empty experts are checked without a GPU. Lowering through
jax.export for the cuda platform runs Mosaic GPU's own passes (layout inference, TMA and shared-memory
checks) short of PTX, so a config that cannot compile fails here first. Timing and the real hardware
are tests/gpu's job.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import random
import subprocess
import sys
import types

import numpy as np
import pytest

from tests.requires import require

jax = require("jax")
jnp = jax.numpy
plgpu = require("jax.experimental.pallas.mosaic_gpu")

from moetune.kernels.backends.mosaic_gpu import cost_model as cost  # noqa: E402
from moetune.kernels.backends.mosaic_gpu import kernel_sm90, schedule, space, tiling, timer  # noqa: E402
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C  # noqa: E402
from moetune.kernels.device import DeviceFingerprint  # noqa: E402
from moetune.kernels.problem import Problem, problem_of  # noqa: E402
from moetune.kernels.reference import reference_grouped_matmul, relative_error  # noqa: E402

PLAIN = dict(warp_specialized=False, wg_split="none")
HOPPER = DeviceFingerprint("NVIDIA H200", "gpu", 132, 0, "9.0", "", "", "", "")


def _tiles(sizes, m, cta_m):
    g = len(sizes)
    ref = jnp.asarray(sizes, jnp.int32)
    out = []
    for t in range(tiling.row_tile_bound(m, g, cta_m)):
        r = schedule.row_tile(ref, jnp.int32(t), g=g, m=m, cta_m=cta_m)
        out.append((int(r.group), int(r.row0), int(r.lo), int(r.hi)))
    return out


def test_row_tiles_worked_example():
    tiles = _tiles([3, 0, 6], m=12, cta_m=4)
    real = [t for t in tiles if t[3] > t[2]]
    assert real == [(0, 0, 0, 3), (2, 0, 3, 4), (2, 4, 4, 8), (2, 8, 8, 9), (3, 8, 9, 12)]


def test_an_expert_s_windows_start_at_its_first_row_rounded_down_to_8():
    # Three experts of 100 rows, 64-row windows. Windows on global 64-row blocks would cut expert 1 (rows
    # 100-199) into three tiles (blocks 1, 2, 3); from row 96 it needs two.
    real = [t for t in _tiles([100, 100, 100], m=300, cta_m=64) if t[3] > t[2]]
    assert real == [
        (0, 0, 0, 64), (0, 64, 64, 100), (1, 96, 100, 160), (1, 160, 160, 200), (2, 200, 200, 264),
        (2, 264, 264, 300),
    ]  # fmt: skip


@pytest.mark.parametrize("seed", range(20))
def test_row_tiles_cover_every_row_once(seed):
    rng = random.Random(seed)
    g, cta_m = rng.choice([1, 3, 8]), rng.choice([64, 128])
    m = rng.randint(1, 700)
    sizes = [rng.choice([0, rng.randint(0, m)]) for _ in range(g)]
    owner = np.full(m, -1)
    ends = np.minimum(np.cumsum(sizes), m)
    expected = np.searchsorted(ends, np.arange(m), side="right")  # g means "past the last expert"
    tiles = _tiles(sizes, m, cta_m)
    for group, row0, lo, hi in tiles:
        if hi <= lo:
            continue
        assert row0 % schedule.ROW_ALIGN == 0 and row0 <= lo < hi <= row0 + cta_m
        assert (owner[lo:hi] == -1).all(), "a row belongs to two tiles"
        owner[lo:hi] = group
    assert (owner == expected).all()
    # Each group takes cdiv(rows + start % 8, cta_m) tiles, and the bound leaves room for them.
    starts = np.concatenate([[0], ends])
    stops = np.concatenate([ends, [m]])
    need = sum(-(-(b - a + a % 8) // cta_m) for a, b in zip(starts, stops, strict=True) if b > a)
    assert sum(hi > lo for _, _, lo, hi in tiles) == need <= len(tiles)


def _expert_walk(sizes, m, cta_m, cols, width):
    """(row tile, column tile) of every work item of the "expert" order, idle ones included."""
    g = len(sizes)
    s = types.SimpleNamespace(
        g=g,
        m=m,
        cta_m=cta_m,
        col_tiles=cols,
        grid_tile_width=width,
        row_tiles=tiling.row_tile_bound(m, g, cta_m),
    )
    ref = jnp.asarray(sizes, jnp.int32)
    walk = jax.jit(jax.vmap(lambda lin: schedule.expert_order(lin, ref, s)))
    rows, cols_ = walk(jnp.arange(s.row_tiles * cols, dtype=jnp.int32))
    return s.row_tiles, list(zip(np.asarray(rows).tolist(), np.asarray(cols_).tolist(), strict=True))


@pytest.mark.parametrize("seed", range(12))
def test_expert_order_visits_every_tile_once_one_expert_after_another(seed):
    rng = random.Random(seed)
    g, cta_m, cols, width = (
        rng.choice([1, 3, 8]),
        rng.choice([64, 128]),
        rng.choice([1, 3, 7]),
        rng.choice([1, 2, 8]),
    )
    m = rng.randint(1, 900)
    sizes = [rng.choice([0, rng.randint(0, m)]) for _ in range(g)]
    bound, walk = _expert_walk(sizes, m, cta_m, cols, width)
    tiles = _tiles(sizes, m, cta_m)
    real = [t for t, (_, _, lo, hi) in enumerate(tiles) if hi > lo]
    live = [(r, c) for r, c in walk if r < bound]
    # Every real (row tile, column tile) once, real tiles first, then only idle items.
    assert sorted(live) == sorted((r, c) for r in real for c in range(cols))
    assert walk[: len(live)] == live and all(r == bound for r, _ in walk[len(live) :])
    # A group's tiles all come before the next group's; inside a group, each run of width * cols items
    # (a strip) covers `width` of its row tiles (fewer in its last strip) and every column.
    groups = [tiles[r][0] for r, _ in live]
    assert groups == sorted(groups)
    for group in set(groups):
        items = [item for item, owner in zip(live, groups, strict=True) if owner == group]
        for start in range(0, len(items), width * cols):
            strip = items[start : start + width * cols]
            rows = {r for r, _ in strip}
            assert len(rows) == len(strip) // cols <= width and {c for _, c in strip} == set(range(cols))


def test_expert_order_strips_stay_inside_an_expert():
    # Zipf-like: 3, 2 and 1 row tiles of 64 rows; strips of 2 row tiles over 2 columns.
    _, walk = _expert_walk([192, 128, 64], 384, 64, cols=2, width=2)
    assert walk[:12] == [
        (0, 0),
        (1, 0),
        (0, 1),
        (1, 1),
        (2, 1),
        (2, 0),
        (3, 0),
        (4, 0),
        (3, 1),
        (4, 1),
        (5, 0),
        (5, 1),
    ]


def _interpret(config, m, k, n, sizes, transpose=False):
    g = len(sizes)
    key_l, key_r = jax.random.split(jax.random.key(m + n))
    lhs = jax.random.normal(key_l, (m, k), jnp.bfloat16)
    rhs = jax.random.normal(key_r, (g, n, k) if transpose else (g, k, n), jnp.bfloat16)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        out = kernel_sm90.grouped_matmul(
            lhs, rhs, group_sizes, config=config, num_sms=3, transpose_rhs=transpose
        )
    out = np.asarray(out.astype(jnp.float32))
    ref = np.asarray(reference_grouped_matmul(lhs, rhs, group_sizes, transpose_rhs=transpose))
    assert np.isfinite(out).all(), "the interpreter's NaN-filled output was not fully overwritten"
    assert relative_error(out, ref) < 1e-2
    assert not out[min(sum(sizes), m) :].any()


def test_interpreted_plain_pipeline_with_split_k():
    config = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, epi_tile_n=32, split_k=2, **PLAIN)
    _interpret(config, 70, 256, 128, [20, 0, 30, 15])


def test_interpreted_warp_specialized_split_n_with_row_chunks():
    config = C(block_m=128, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n", epi_tile_n=32)
    _interpret(config, 300, 128, 256, [100, 7, 0, 150])


def test_interpreted_warp_specialized_split_m_transposed_tiny_m():
    config = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="m")
    _interpret(config, 5, 128, 128, [2, 0, 3, 0], transpose=True)


def test_interpreted_windows_starting_off_any_block_boundary():
    # Experts start at rows 0, 13, 14, 64, 64 and 71: windows from rows 8, 64 and 64 overlap their
    # neighbours' rows, which the stores must leave alone; rows 71-79 are the zero tail.
    sizes = [13, 1, 50, 0, 7]
    split_m = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="m")
    _interpret(split_m, 80, 128, 128, sizes)
    _interpret(C(block_m=64, block_n=64, block_k=32, max_concurrent_steps=2, **PLAIN), 80, 64, 64, sizes)


def test_interpreted_chained_tile_pipelines_across_experts_and_tiles():
    # 8 k-steps in 4 stages: each CTA (3 of them for 2 x 4 tiles) chains its tiles' pipelines, so the
    # producer loads a tile's first stages while the consumers finish the previous one, across experts.
    chained = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=4, wg_split="n")
    assert kernel_sm90.chains(Problem("grouped_matmul", m=200, k=512, n=256, g=4), chained)
    _interpret(chained, 200, 512, 256, [70, 0, 90, 30])
    # 8 k-steps in 3 stages do not chain (the slots would not line up between tiles): one pipeline a tile.
    unchained = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=3, wg_split="m")
    assert not kernel_sm90.chains(Problem("grouped_matmul", m=200, k=512, n=256, g=4), unchained)
    _interpret(unchained, 200, 512, 256, [70, 0, 90, 30])


def test_interpreted_expert_order_chained_and_plain():
    # Strips of 2 row tiles that never cross an expert, chained across experts and tiles, then the plain
    # pipeline with an expert of 2 tiles, an empty one and the zero-filled tail.
    chained = C(
        block_m=64, block_n=64, block_k=64, max_concurrent_steps=4, wg_split="n", grid_minor_dim="expert"
    )
    _interpret(dataclasses.replace(chained, grid_tile_width=2), 300, 256, 256, [130, 0, 90, 50])
    plain = C(block_m=64, block_n=64, block_k=32, max_concurrent_steps=2, grid_minor_dim="expert", **PLAIN)
    _interpret(dataclasses.replace(plain, grid_tile_width=2), 200, 64, 128, [100, 0, 70])


@pytest.mark.parametrize("m, sizes", [(2, [0, 1, 0, 1]), (16, [3, 0, 6, 7]), (64, [64, 0, 0, 0])])
def test_pad_lhs_pads_a_small_lhs_so_that_every_window_lies_inside_it(m, sizes):
    # The last expert's window starts at its first row rounded down to 8 and is cta_m rows tall: the padded
    # lhs must reach its end, so that TMA fills no row (the fill cost the T=1 GEMMs 12% on the H200).
    config = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, pad_lhs=True, **PLAIN)
    assert _lhs_rows(config, m) == {m, (m - 1) // 8 * 8 + 64}
    assert _lhs_rows(dataclasses.replace(config, pad_lhs=False), m) == {m}
    _interpret(config, m, 128, 128, sizes)


def test_pad_lhs_leaves_a_lhs_taller_than_one_window_uncopied():
    config = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, pad_lhs=True, **PLAIN)
    assert _lhs_rows(config, 72) == {72}


def _lhs_rows(config, m) -> set[int]:
    """Row counts of the [rows, 128] bfloat16 arrays a traced call on an [m, 128] lhs makes: the lhs and
    any padded copy of it."""
    args = [jax.ShapeDtypeStruct(s, d) for s, d in (((m, 128), jnp.bfloat16), ((4, 128, 128), jnp.bfloat16))]
    fn = functools.partial(kernel_sm90.grouped_matmul, config=config, num_sms=3)
    jaxpr = jax.make_jaxpr(fn)(*args, jax.ShapeDtypeStruct((4,), jnp.int32))
    avals = [v.aval for e in jaxpr.eqns for v in (*e.invars, *e.outvars) if hasattr(v, "aval")]
    return {a.shape[0] for a in avals if a.shape[1:] == (128,) and a.dtype == jnp.bfloat16 and a.ndim == 2}


# Widths that are no multiple of the tile, scaled down so that the interpreter runs them in seconds but
# keeping their tails: gpt-oss's 2880 (22.5 x 128, 11.25 x 256: a last tile of 64), its down at TP=2 with
# K=1440 (11.25 x 128: a last K step of 32), 5760 (22.5 x 256), 1408 and 2816 (5.5 and 11 x 256).
TAIL_WS = C(block_m=64, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="n")
TAIL_PLAIN = C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=2, **PLAIN)


@pytest.mark.parametrize(
    "config, k, n, transpose",
    [
        (TAIL_WS, 192, 384, True),  # 2880's K tail (1.5 steps of 128); 1408's column tail (1.5 x 256)
        # swap-AB (16 token rows on wgmma's N side): 2.5 CTA tiles of 128 columns, 1.25 K steps of 128
        (C(block_m=16, block_n=64, block_k=128, max_concurrent_steps=2, wg_split="n"), 160, 320, False),
        # 11.25 K steps of 128; 320 = 1.25 CTA tiles of 256 (as 2880)
        pytest.param(TAIL_WS, 1440, 320, False, marks=pytest.mark.slow),
        # 2880 itself: 22.5 tiles of 128; K=96 is 1.5 steps of 64
        pytest.param(TAIL_PLAIN, 96, 2880, False, marks=pytest.mark.slow),
        # 12 steps (the last partial), 6 a split
        pytest.param(dataclasses.replace(TAIL_WS, split_k=2), 1440, 320, False, marks=pytest.mark.slow),
        # N = 160 (2.5 x 64, as 1440): 32-column swizzled output tiles, [K, N] weights likewise
        pytest.param(TAIL_WS, 192, 160, False, marks=pytest.mark.slow),
    ],
)
def test_interpreted_partial_last_k_step_and_column_tile(config, k, n, transpose):
    assert k % (config.block_k * config.split_k) or n % config.cta_n
    _interpret(config, 40, k, n, [17, 0, 13], transpose=transpose)


STAGGER_CASES = {
    # chained across tiles and experts, consumers splitting the columns
    "chained-n": (dict(max_concurrent_steps=4, wg_split="n"), 200, 512, 256, [70, 0, 90, 30]),
    # one pipeline a tile, consumers splitting the rows: consumer 1's half of an expert's last window
    # often holds none of its rows, so it issues nothing there but must still take its turns
    "unchained-m": (dict(max_concurrent_steps=3, wg_split="m"), 200, 512, 256, [70, 0, 90, 30]),
}


@pytest.mark.parametrize("case", STAGGER_CASES)
def test_interpreted_staggered_consumers_take_balanced_turns(case):
    # The interpreter simulates the warpgroups' threads and barriers, so turns that do not pair up
    # deadlock it: run in a child process, whose timeout turns a deadlock into a failure here.
    fields, m, k, n, sizes = STAGGER_CASES[case]
    code = f"""
from tests.kernels.backends.mosaic_gpu.test_mosaic_gpu_kernel_cpu import C, _interpret
config = C(block_m=64, block_n=64, block_k=64, stagger_consumers=True, **{fields!r})
_interpret(config, {m}, {k}, {n}, {sizes!r})
"""
    root = pathlib.Path(__file__).resolve().parents[4]
    env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}
    try:
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=240
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the staggered consumers deadlocked: their turns do not pair up")
    assert result.returncode == 0, result.stderr[-3000:]


def test_interpreted_192_row_tiles_split_n_and_plain():
    # Three wgmma row tiles a consumer; experts of 150 and 200 rows take one and two windows.
    split_n = C(block_m=192, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n", epi_tile_n=64)
    _interpret(split_n, 400, 128, 256, [150, 7, 0, 200])
    _interpret(
        C(block_m=192, block_n=64, block_k=64, max_concurrent_steps=2, **PLAIN),
        400,
        128,
        128,
        [150, 7, 0, 200],
    )


def _lower(config, m, k, n, g, call=kernel_sm90.grouped_matmul):
    lhs = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((g, k, n), jnp.bfloat16)
    sizes = jax.ShapeDtypeStruct((g,), jnp.int32)
    fn = jax.jit(functools.partial(call, config=config, num_sms=132))
    return jax.export.export(fn, platforms=["cuda"])(lhs, rhs, sizes)


def test_lowers_for_hopper_mixtral_gate_up():
    exported = _lower(C(block_m=128, block_n=128, block_k=128, max_concurrent_steps=2), 8192, 4096, 28672, 8)
    assert "mosaic_gpu" in exported.mlir_module()


def test_smem_model_is_not_below_what_mosaic_allocates(monkeypatch):
    """With Mosaic's limit forced to 1 byte, its error reports the bytes the kernel really needs."""
    from jax.experimental.mosaic.gpu import core as mosaic_core

    config = C(block_m=64, block_n=256, block_k=64, max_concurrent_steps=4, wg_split="m")
    problem = problem_of(
        jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16),
        jax.ShapeDtypeStruct((8, 1024, 512), jnp.bfloat16),
        jax.ShapeDtypeStruct((8,), jnp.int32),
    )
    monkeypatch.setattr(mosaic_core, "_SMEM_SIZE_BOUND", 1)
    with pytest.raises(ValueError, match="exceeds available shared memory") as info:
        _lower(config, 1024, 1024, 512, 8)
    actual = int(str(info.value).split("smem_bytes=")[1].split()[0])
    assert actual <= tiling.smem_bytes(problem, config) <= actual + tiling.SMEM_OVERHEAD_BYTES


def test_kernel_name_tags_the_config():
    name = kernel_sm90.kernel_name(C(wg_split="m", persistent=False, split_k=2, block_m=64))
    assert name == "moetune_gmm_m64n128k64s4_m8_np_wsm_e64x64_sk2"
    assert "_expert16_" in kernel_sm90.kernel_name(C(grid_minor_dim="expert", grid_tile_width=16))
    assert kernel_sm90.kernel_name(C(stagger_consumers=True)).endswith("_sk1_stag")


GPT_OSS_WIDTHS = [(2880, 2880), (1440, 2880), (2880, 5760), (2048, 1408), (1408, 2816), (2880, 1440)]


@pytest.mark.parametrize("tokens", [4096, 16384])
@pytest.mark.parametrize("k, n", GPT_OSS_WIDTHS)
def test_heuristic_tail_configs_lower_for_hopper_at_full_size(k, n, tokens):
    # gpt-oss-120b (128 experts, top-4): its down (K=N=2880), at TP=2 (K=1440), and the widths 1408/2816.
    problem = Problem("grouped_matmul", m=tokens * 4, k=k, n=n, g=128)
    config = space.heuristic(problem, HOPPER)
    assert "mosaic_gpu" in _lower(config, problem.m, k, n, problem.g).mlir_module()


@pytest.mark.parametrize(
    "config, lowers",
    [
        (C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=2, epi_tile_n=64), True),
        (C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=2, epi_tile_n=128), False),
        (C(block_m=16, block_n=64, block_k=64, wg_split="none", warp_specialized=False), False),
    ],
)
def test_the_epilogue_swizzle_constraint_is_what_lowers(config, lowers):
    # N = 1440 narrows the output's swizzled tiles to 32 columns: space.epilogue_fits_swizzle refuses
    # exactly the epilogues Mosaic GPU cannot lay the accumulator's store out for (jax 0.11.2); should a
    # newer one lower them, this fails and the constraint can go.
    problem = Problem("grouped_matmul", m=64, k=2880, n=1440, g=16)
    assert (space.epilogue_fits_swizzle(problem, config, HOPPER) is None) == lowers
    if lowers:
        assert "mosaic_gpu" in _lower(config, 64, 2880, 1440, 16).mlir_module()
    else:
        with pytest.raises(ValueError, match="Failed to infer a possible set of layouts"):
            _lower(config, 64, 2880, 1440, 16)


@pytest.mark.parametrize("op, k, n", [("grouped_matmul", 768, 2048), ("grouped_matmul_swiglu", 2048, 1536)])
def test_the_best_ranked_192_row_tiles_lower_for_hopper_at_mid_size_experts(op, k, n):
    # Qwen3-30B-A3B at 4096 tokens (256 rows an expert): the cost model's best 192-row config of the space.
    problem = Problem(op, m=32768, k=k, n=n, g=128)
    valid, _ = space.space(problem, HOPPER).enumerate(problem, HOPPER)
    best = min(
        (c for c in valid if c.block_m == 192), key=lambda c: cost.estimate(problem, c, HOPPER).seconds
    )
    call = kernel_sm90.grouped_matmul_swiglu if op == "grouped_matmul_swiglu" else kernel_sm90.grouped_matmul
    assert "mosaic_gpu" in _lower(best, problem.m, k, n, problem.g, call).mlir_module()


def test_expert_order_lowers_for_hopper_mixtral_gate_up():
    config = C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, grid_minor_dim="expert")
    assert "mosaic_gpu" in _lower(config, 8192, 4096, 28672, 8).mlir_module()


def test_rotation_copies_small_sets_until_they_outgrow_the_cache():
    arrays = (jnp.ones((256,), jnp.float32),)  # 1 KiB
    sets = timer.rotation([arrays], min_bytes=4096)
    assert len(sets) == 4
    assert len({s[0].unsafe_buffer_pointer() for s in sets}) == 4
    assert len(timer.rotation([arrays], min_bytes=10)) == 1


class FakeCupti:
    """Records one fake launch per call of the timed function, 2 ms each, like CUPTI's (name, ms) list."""

    calls = 0
    recording = False

    def __init__(self):
        FakeCupti.calls = 0

    def start(self):
        FakeCupti.recording = True

    def stop(self):
        FakeCupti.recording = False
        return [("gmm", 2.0)] * FakeCupti.calls


def test_cupti_timer_times_a_compiled_executable_without_tracing_it():
    """The tuner hands the timer a jax.stages.Compiled, which cannot be traced again (a jit around it
    fails with 'Cannot apply JAX transformations to a function lowered and compiled')."""
    import jax

    compiled = jax.jit(lambda x: x * 2).lower(jnp.ones((256,), jnp.float32)).compile()

    def counted(*args):
        FakeCupti.calls += FakeCupti.recording
        return compiled(*args)

    arrays = (jnp.ones((256,), jnp.float32),)  # 1 KiB: rotated over 4 copies to reach 4 KiB
    samples = timer.CuptiTimer(min_rotation_bytes=4096, session=FakeCupti).time(counted, [arrays], runs=3)
    assert FakeCupti.calls == 4 * timer.MIN_RUNS  # every set, every run (at least MIN_RUNS runs)
    assert samples == pytest.approx([2e-3] * timer.MIN_RUNS)


def test_cupti_timer_reuses_a_rotation_made_once(monkeypatch):
    """The tuner makes a problem's rotation once (CuptiTimer.rotation) and times every candidate on it:
    given a Rotation, `time` must not copy the sets again."""
    arrays = (jnp.ones((256,), jnp.float32),)
    cupti = timer.CuptiTimer(min_rotation_bytes=4096, session=FakeCupti)
    made = cupti.rotation([arrays])
    assert len(made.sets) == 4

    def no_copies(*args, **kwargs):
        raise AssertionError("rotation copied again")

    monkeypatch.setattr(timer, "rotation", no_copies)

    def counted(*args):
        FakeCupti.calls += FakeCupti.recording
        return args[0] * 2

    for _ in range(2):
        samples = cupti.time(counted, made, runs=10)
        assert FakeCupti.calls == 4 * 10 and samples == pytest.approx([2e-3] * 10)


class TimedCupti:
    """Returns scripted launches (name, ms), one per call made while recording, and counts sessions."""

    launches: list[float] = []
    sessions = 0
    recorded = 0
    recording = False

    def start(self):
        TimedCupti.sessions += 1
        TimedCupti.recorded, TimedCupti.recording = 0, True

    def stop(self):
        TimedCupti.recording = False
        return [("gmm", ms) for ms in TimedCupti.launches[: TimedCupti.recorded]]


def _recorded_by_timed_cupti(*args):
    TimedCupti.recorded += TimedCupti.recording
    return args[0] + 1


def test_cupti_time_each_splits_one_session_into_what_separate_time_calls_return():
    """The tuner times a candidate on every routing in one CUPTI session (starting one is the costly
    part); the launches of that session must split back into each rotation's own passes."""
    cupti = timer.CuptiTimer(min_rotation_bytes=0, session=TimedCupti)
    small = cupti.rotation([(jnp.ones((8,), jnp.float32),)] * 2)
    large = cupti.rotation([(jnp.ones((16,), jnp.float32),)] * 3)
    runs = timer.MIN_RUNS
    # Distinct times per launch: a split that is off by one launch changes the samples.
    TimedCupti.launches = [float(i + 1) for i in range(runs * (2 + 3))]
    TimedCupti.sessions = 0
    together = cupti.time_each(_recorded_by_timed_cupti, [small, large], runs=runs)
    assert TimedCupti.sessions == 1

    separate = [cupti.time(_recorded_by_timed_cupti, small, runs=runs)]
    TimedCupti.launches = TimedCupti.launches[runs * 2 :]  # the launches that followed small's
    separate.append(cupti.time(_recorded_by_timed_cupti, large, runs=runs))
    assert TimedCupti.sessions == 3
    assert [len(samples) for samples in together] == [runs, runs]
    for rotation_samples, alone in zip(together, separate, strict=True):
        assert rotation_samples == pytest.approx(alone)
    assert together[0][0] == pytest.approx((1 + 2) * 1e-3 / 2)  # first pass over small: launches 1, 2


def test_cupti_time_each_skips_the_warm_up_pass_only_when_the_caller_warmed_fn():
    """The tuner verifies a candidate right before timing it, so the timer's own warm-up pass would be
    lane time spent for nothing; every other caller keeps it."""
    cupti = timer.CuptiTimer(min_rotation_bytes=0, session=TimedCupti)
    rotation = cupti.rotation([(jnp.ones((8,), jnp.float32),)] * 2)
    TimedCupti.launches = [1.0] * (2 * timer.MIN_RUNS)
    calls = []

    def fn(*args):
        calls.append(TimedCupti.recording)
        return _recorded_by_timed_cupti(*args)

    cupti.time_each(fn, [rotation], runs=timer.MIN_RUNS)
    assert calls.count(False) == 2 and calls.count(True) == 2 * timer.MIN_RUNS
    calls.clear()
    cupti.time_each(fn, [rotation], runs=timer.MIN_RUNS, warmed=True)
    assert calls.count(False) == 0 and calls.count(True) == 2 * timer.MIN_RUNS


def test_cupti_time_each_splits_several_launches_per_call():
    cupti = timer.CuptiTimer(min_rotation_bytes=0, session=TimedCupti)
    rotations = [
        cupti.rotation([(jnp.ones((8,), jnp.float32),)]),
        cupti.rotation([(jnp.ones((4,), jnp.float32),)]),
    ]

    def two_launches(*args):
        TimedCupti.recorded += 2 * TimedCupti.recording
        return args[0]

    TimedCupti.launches = [1.0] * (2 * timer.MIN_RUNS) + [3.0] * (2 * timer.MIN_RUNS)
    samples = cupti.time_each(two_launches, rotations, runs=timer.MIN_RUNS)
    assert samples == [pytest.approx([2e-3] * timer.MIN_RUNS), pytest.approx([6e-3] * timer.MIN_RUNS)]


def test_cupti_time_each_rejects_a_session_without_launches():
    class Silent(TimedCupti):
        def stop(self):
            return []

    arrays = (jnp.ones((8,), jnp.float32),)
    with pytest.raises(RuntimeError, match="no kernel launch"):
        timer.CuptiTimer(min_rotation_bytes=0, session=Silent).time_each(
            lambda x: x + 1, [[arrays], [arrays, arrays]], runs=10
        )


def test_cupti_time_each_rejects_launch_counts_that_do_not_split_over_every_rotations_calls():
    class Short(TimedCupti):
        def stop(self):
            return [("gmm", 1.0)] * (3 * timer.MIN_RUNS - 1)

    arrays = (jnp.ones((8,), jnp.float32),)
    calls = 3 * timer.MIN_RUNS  # one set, then two sets, each MIN_RUNS times
    with pytest.raises(RuntimeError, match=f"{calls - 1} launches for {calls} calls"):
        timer.CuptiTimer(min_rotation_bytes=0, session=Short).time_each(
            lambda x: x + 1, [[arrays], [arrays, arrays]], runs=3
        )


def test_cupti_timer_rejects_launch_counts_that_do_not_split_evenly():
    class Odd(FakeCupti):
        def stop(self):
            return [("gmm", 1.0)] * 7

    arrays = (jnp.ones((1024,), jnp.float32),)
    with pytest.raises(RuntimeError, match="not a whole number"):
        timer.CuptiTimer(min_rotation_bytes=0, session=Odd).time(lambda x: x + 1, [arrays], runs=10)
