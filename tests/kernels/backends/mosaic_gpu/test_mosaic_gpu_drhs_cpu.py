"""The Hopper weight-gradient kernel on a CPU: Pallas's GPU interpreter (TMA copies, barriers, wgmma,
the zeroing of foreign rows, both pipelines), lowering to Mosaic GPU for the cuda platform (layout
inference and shared memory, short of PTX), and its search space and heuristic."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest

from tests.requires import require

jax = require("jax")
jnp = jax.numpy
plgpu = require("jax.experimental.pallas.mosaic_gpu")

from moetune.kernels.backends.mosaic_gpu import BACKEND, hardware, kernel_drhs, tiling  # noqa: E402
from moetune.kernels.backends.mosaic_gpu import space_drhs as space  # noqa: E402
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C  # noqa: E402
from moetune.kernels.errors import Unsupported  # noqa: E402
from moetune.kernels.ops.grouped_matmul_drhs import reference  # noqa: E402
from moetune.kernels.problem import Problem  # noqa: E402
from tests.db.db_factories import H200  # noqa: E402

PLAIN = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, warp_specialized=False, wg_split="none")
SPLIT_N = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, warp_specialized=True, wg_split="n")
ONE_CONSUMER = C(
    block_m=64, block_n=64, block_k=128, max_concurrent_steps=3, warp_specialized=True, wg_split="none"
)


def _operands(m, k, n, seed=0, past_rows=0.0):
    kl, kd = jax.random.split(jax.random.key(seed))
    lhs = jax.random.normal(kl, (m, k), jnp.float32).astype(jnp.bfloat16)
    dout = jax.random.normal(kd, (m, n), jnp.float32).astype(jnp.bfloat16)
    return lhs, dout


def _interpret(config, lhs, dout, sizes, transpose=False, row_start=None):
    group_sizes = jnp.asarray(sizes, jnp.int32)
    start = None if row_start is None else jnp.int32(row_start)
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        out = kernel_drhs.grouped_matmul_drhs(
            lhs, dout, group_sizes, config=config, num_sms=3, transpose_rhs=transpose,
            out_dtype=jnp.float32, row_start=start,
        )  # fmt: skip
    return np.asarray(out)


def _expected(lhs, dout, sizes, transpose=False, row_start=0):
    """Per expert in float64 from its own rows only."""
    lhs64, dout64 = np.asarray(lhs, np.float64), np.asarray(dout, np.float64)
    bounds = row_start + np.concatenate([[0], np.cumsum(sizes)])
    out = np.stack([lhs64[a:b].T @ dout64[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    return out.transpose(0, 2, 1) if transpose else out


@pytest.mark.parametrize("config", [PLAIN, SPLIT_N, ONE_CONSUMER], ids=["plain", "split_n", "one_consumer"])
def test_each_expert_gets_its_own_rows_and_an_empty_expert_exactly_zero(config):
    # Experts starting and ending inside 64-row steps, one spanning a single step, one empty.
    sizes = [70, 0, 90, 3, 30]
    lhs, dout = _operands(200, 128, 128)
    out = _interpret(config, lhs, dout, sizes)
    np.testing.assert_allclose(out, _expected(lhs, dout, sizes), rtol=1e-5, atol=1e-3)
    assert not out[1].any()


@pytest.mark.parametrize("config", [SPLIT_N, ONE_CONSUMER], ids=["split_n", "one_consumer"])
def test_one_pipeline_carries_a_cta_through_all_its_items(config):
    # One CTA walks every output tile of every expert: the slot ring wraps many times, item after item,
    # experts start off the 8-row grid, span one to three steps or none, and the rows past the groups
    # hold large values that must not reach any expert.
    sizes = [5, 131, 0, 61, 1, 66]
    lhs, dout = _operands(300, 128, 128, seed=4)
    lhs = lhs.at[264:].set(1e4)
    dout = dout.at[264:].set(1e4)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        out = kernel_drhs.grouped_matmul_drhs(
            lhs, dout, group_sizes, config=config, num_sms=1, out_dtype=jnp.float32
        )
    np.testing.assert_allclose(np.asarray(out), _expected(lhs, dout, sizes), rtol=1e-5, atol=1e-3)
    assert not np.asarray(out)[2].any()


def test_rows_past_the_groups_are_never_multiplied_in():
    # A half-full buffer: the rows past sum(group_sizes) hold large values, which must not reach any expert.
    sizes = [40, 57]
    lhs, dout = _operands(192, 64, 128, seed=1)
    lhs = lhs.at[97:].set(1e4)
    dout = dout.at[97:].set(1e4)
    out = _interpret(PLAIN, lhs, dout, sizes)
    np.testing.assert_allclose(out, _expected(lhs, dout, sizes), rtol=1e-5, atol=1e-3)


def test_transposed_layout_is_the_weights_layout():
    sizes = [3, 0, 60, 5]
    lhs, dout = _operands(200, 64, 128, seed=2)
    out = _interpret(PLAIN, lhs, dout, sizes, transpose=True)
    assert out.shape == (4, 128, 64)
    np.testing.assert_allclose(out, _expected(lhs, dout, sizes, transpose=True), rtol=1e-5, atol=1e-3)


def test_a_local_slice_starts_at_row_start():
    sizes = [10, 20, 30]
    lhs, dout = _operands(200, 64, 128, seed=3)
    out = _interpret(SPLIT_N, lhs, dout, sizes, row_start=13)
    np.testing.assert_allclose(out, _expected(lhs, dout, sizes, row_start=13), rtol=1e-5, atol=1e-3)
    # ... and agrees with the op's reference, where the rows before the slice are zeroed into group 0.
    before = jnp.arange(200)[:, None] < 13
    ref = reference(
        jnp.where(before, 0, lhs), dout, jnp.asarray([23, 20, 30], jnp.int32), transpose_rhs=False
    )
    np.testing.assert_allclose(out, np.asarray(ref), rtol=1e-4, atol=1e-2)


def _lower(config, m, k, n, g, transpose=False, out_dtype=jnp.bfloat16):
    args = (
        jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
        jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
        jax.ShapeDtypeStruct((g,), jnp.int32),
    )
    fn = functools.partial(
        kernel_drhs.grouped_matmul_drhs,
        config=config,
        num_sms=132,
        transpose_rhs=transpose,
        out_dtype=out_dtype,
    )
    return jax.export.export(jax.jit(fn), platforms=["cuda"])(*args)


# Development shapes of the weight gradient: (m, k, n, g) of Mixtral-8x7B, DeepSeek-V3 and Qwen3-30B-A3B.
SHAPES = {
    "mixtral_gate_up": (8192, 4096, 28672, 8),
    "deepseek_v3_down": (32768, 2048, 7168, 256),
    "qwen3_gate_up": (32768, 2048, 1536, 128),
}


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_heuristic_config_lowers_for_hopper(shape, transpose):
    m, k, n, g = SHAPES[shape]
    problem = Problem("grouped_matmul_drhs", m, k, n, g, transpose_rhs=transpose)
    config = BACKEND.heuristic(problem, H200)
    assert space.fixed_fields_at_defaults(problem, config, H200) is None
    assert "mosaic_gpu" in _lower(config, m, k, n, g, transpose).mlir_module()


def test_smem_model_is_not_below_what_mosaic_allocates(monkeypatch):
    from jax.experimental.mosaic.gpu import core as mosaic_core

    config = C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=3, wg_split="n")
    problem = Problem("grouped_matmul_drhs", 1024, 1024, 512, 8)
    monkeypatch.setattr(mosaic_core, "_SMEM_SIZE_BOUND", 1)
    with pytest.raises(ValueError, match="exceeds available shared memory") as info:
        _lower(config, 1024, 1024, 512, 8)
    actual = int(str(info.value).split("smem_bytes=")[1].split()[0])
    assert actual <= tiling.drhs_smem_bytes(problem, config) <= actual + tiling.SMEM_OVERHEAD_BYTES


def test_space_fixes_the_fields_the_kernel_does_not_read_and_build_refuses_them():
    problem = Problem("grouped_matmul_drhs", 4096, 1024, 512, 8)
    configs, _ = BACKEND.search_space(problem, H200).enumerate(problem, H200)
    assert configs and all(
        c.split_k == 1 and c.tile_schedule == "walk" and c.wg_split != "m" for c in configs
    )
    reason = space.fixed_fields_at_defaults(problem, C(epi_tile_n=128, split_k=2), H200)
    assert "epi_tile_n=128, split_k=2" in reason
    assert "one after another" in space.kernel_shape_supported(problem, C(grid_minor_dim="expert"), H200)
    # N = 192 in 256-column CTA tiles: a partial tile, valid (the kernel zero-fills and clips).
    partial = Problem("grouped_matmul_drhs", 64, 64, 192, 2)
    wide = dataclasses.replace(SPLIT_N, block_n=128)
    assert all(c(partial, wide, H200) is None for c in space.VALIDITY_CONSTRAINTS)


# gpt-oss's K = N = 2880 is 22.5 tiles of 128, scaled down: K = 192 (1.5 tiles of 128 along P) and
# N = 320 (2.5 CTA tiles of 128 along Q, so the last one's second consumer lies wholly past N).
@pytest.mark.parametrize(
    "config, transpose",
    [
        (dataclasses.replace(SPLIT_N, block_k=128), False),
        pytest.param(dataclasses.replace(PLAIN, block_k=128, block_n=128), True, marks=pytest.mark.slow),
    ],
)
def test_interpreted_partial_last_output_tiles(config, transpose):
    sizes = [70, 0, 50]
    lhs, dout = _operands(128, 192, 320)
    out = _interpret(config, lhs, dout, sizes, transpose=transpose)
    assert np.isfinite(out).all(), "the interpreter's NaN-filled output was not fully overwritten"
    np.testing.assert_allclose(out, _expected(lhs, dout, sizes, transpose), rtol=1e-5, atol=1e-3)
    assert not out[1].any()


def test_interpreted_sides_of_half_and_quarter_swizzle_width():
    # K = 96 (1.5 tiles of 64: 64-byte swizzled operand tiles, as 1440) and N = 176 (11 x 16: 32-byte).
    sizes = [70, 0, 50]
    lhs, dout = _operands(128, 96, 176)
    out = _interpret(dataclasses.replace(SPLIT_N, block_k=64), lhs, dout, sizes)
    assert np.isfinite(out).all(), "the interpreter's NaN-filled output was not fully overwritten"
    np.testing.assert_allclose(out, _expected(lhs, dout, sizes), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize(
    "k, n, transpose",
    [
        (2880, 5760, False),
        pytest.param(2880, 5760, True, marks=pytest.mark.slow),
        (1440, 2880, False),
        pytest.param(2880, 1440, True, marks=pytest.mark.slow),
    ],
)
def test_heuristic_partial_tiles_lower_for_hopper_at_gpt_oss_shapes(k, n, transpose):
    # gpt-oss-120b's weight gradients (128 experts, T=4096 at top-4): gate_up's (K = 2880, 2F = 5760: no
    # 128-wide tile divides 2880) and at TP=2 down's and gate_up's (1440 = 22.5 x 64: 64-byte swizzles).
    problem = Problem("grouped_matmul_drhs", 16384, k, n, 128, transpose_rhs=transpose)
    config = BACKEND.heuristic(problem, H200)
    t = tiling.drhs_tiles(problem.k, problem.n, transpose, config)
    assert t.p % t.tile_p or t.q % t.cta_q
    kernel = functools.partial(
        kernel_drhs.grouped_matmul_drhs, config=config, num_sms=132, transpose_rhs=transpose
    )
    args = [
        jax.ShapeDtypeStruct((problem.m, problem.k), jnp.bfloat16),
        jax.ShapeDtypeStruct((problem.m, problem.n), jnp.bfloat16),
        jax.ShapeDtypeStruct((problem.g,), jnp.int32),
    ]
    assert "mosaic_gpu" in jax.export.export(jax.jit(kernel), platforms=["cuda"])(*args).mlir_module()


def test_the_tile_order_streams_the_wide_operand_once():
    # Mixtral-8x7B's gate_up gradient at T=4096: 1024 rows per expert, dout 58 MB per expert (past half the
    # L2). Strips along K would stream it once per strip; strips along N stream it once.
    problem = Problem("grouped_matmul_drhs", 8192, 4096, 28672, 8)
    config = C(block_m=64, block_n=128, block_k=128, max_concurrent_steps=3, wg_split="n", grid_tile_width=1)
    along_k = space.operand_traffic(problem, config, H200)
    along_n = space.operand_traffic(problem, dataclasses.replace(config, grid_minor_dim="n"), H200)
    assert along_n * 10 < along_k
    assert (
        BACKEND.heuristic(problem, H200).grid_minor_dim == "n"
        or BACKEND.heuristic(problem, H200).grid_tile_width > 1
    )


def test_the_cost_model_prefers_a_shorter_step_for_few_rows_per_expert():
    few = BACKEND.heuristic(Problem("grouped_matmul_drhs", 4096, 2048, 1536, 128), H200)  # 32 rows each
    assert few.block_m == 64
    estimate = lambda p, c: space.estimate(p, c, H200).seconds  # noqa: E731
    p = Problem("grouped_matmul_drhs", 4096, 2048, 1536, 128)
    assert estimate(p, few) < estimate(p, C(block_m=128, block_n=128, block_k=128, wg_split="n"))


@pytest.mark.parametrize(
    "m, k, n, g", [(8192, 4096, 28672, 8), (32768, 1024, 2048, 64), (2048, 512, 768, 16)]
)
def test_among_estimates_within_the_model_s_resolution_the_largest_tile_ranks_first(m, k, n, g):
    ranked = space.ranking(Problem("grouped_matmul_drhs", m, k, n, g), H200)
    best = min(e.seconds for _, e in ranked)
    size = lambda c: c.block_k * c.block_n * c.consumers  # noqa: E731
    near = [c for c, e in ranked if e.seconds <= best * (1 + space.TIE)]
    first = ranked[0][0]
    assert ranked[0][1].seconds <= best * (1 + space.TIE) and size(first) == max(map(size, near))


def test_a_chained_item_is_bound_by_its_shared_memory_traffic_and_two_stages_leave_no_lookahead():
    # 256 experts of 128 rows each: two or three steps an item, where the tensor cores are not the bound.
    problem = Problem("grouped_matmul_drhs", 32768, 7168, 4096, 256)
    three = C(block_m=64, block_n=128, block_k=128, max_concurrent_steps=3, wg_split="n")
    two = dataclasses.replace(three, max_concurrent_steps=2)
    assert space.estimate(problem, two, H200).seconds > space.estimate(problem, three, H200).seconds
    # The a tile read once per consumer, the b tile once per 64-row slice: [64, 128] and [64, 2 x 128].
    per_step = 64 * (128 + 256) + 2 * 64 * (128 + 2 * 128)
    assert space.smem_bytes_per_item(problem, three) > space.expected_steps(problem, three) * per_step * 2
    facts = hardware.facts(H200.compute_capability)
    port = facts.smem_bytes_per_clock * facts.sustained_clock_hz
    bound = space.smem_bytes_per_item(problem, three) / port
    waves = math.ceil(space.estimate(problem, three, H200).items / H200.core_count)
    assert space.estimate(problem, three, H200).compute_s >= waves * bound


def test_problems_the_kernel_cannot_tile_are_declined():
    with pytest.raises(Unsupported, match="multiples of 16"):
        BACKEND.check(Problem("grouped_matmul_drhs", 64, 1416, 128, 2))
    BACKEND.check(Problem("grouped_matmul_drhs", 64, 1440, 1424, 2))  # 22.5 x 64, 89 x 16
    with pytest.raises(Unsupported, match="bfloat16 or float16"):
        BACKEND.check(
            Problem("grouped_matmul_drhs", 64, 128, 128, 2, lhs_dtype="float32", rhs_dtype="float32")
        )
    assert BACKEND.takes_group_offset("grouped_matmul_drhs") and BACKEND.takes_group_offset("grouped_matmul")
    assert BACKEND.takes_group_offset("grouped_matmul_fp8")
