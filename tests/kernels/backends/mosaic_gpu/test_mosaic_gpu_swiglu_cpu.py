"""The Hopper kernel's SwiGLU epilogue (op "grouped_matmul_swiglu") on a CPU: Pallas's GPU interpreter
against the float32 reference, lowering to Mosaic GPU for every pipeline and layout, and the search
space's rules for two accumulators. Real hardware is tests/gpu/test_mosaic_gpu_swiglu.py's job.
"""

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
    space,  # noqa: E402
    tiling,
)
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C  # noqa: E402
from moetune.kernels.device import DeviceFingerprint  # noqa: E402
from moetune.kernels.errors import Unsupported  # noqa: E402
from moetune.kernels.problem import Problem  # noqa: E402
from moetune.kernels.reference import reference_of, relative_error  # noqa: E402

HOPPER = DeviceFingerprint("NVIDIA H200", "gpu", 132, 0, "9.0", "", "", "", "")
PLAIN = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, warp_specialized=False, wg_split="none")
WS_N = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="n")
WS_M = C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=2, wg_split="m")
# Mixtral-8x7B's gate_up: H=4096, 2F=28672.
MIXTRAL = Problem("grouped_matmul_swiglu", m=8192, k=4096, n=28672, g=8)


def _problem(m, k, n, g, transpose=False):
    return Problem("grouped_matmul_swiglu", m=m, k=k, n=n, g=g, transpose_rhs=transpose)


def _interpret(config, m, k, n, sizes, transpose=False):
    g = len(sizes)
    key_l, key_r = jax.random.split(jax.random.key(m + n + g))
    lhs = jax.random.normal(key_l, (m, k), jnp.bfloat16)
    rhs = jax.random.normal(key_r, (g, n, k) if transpose else (g, k, n), jnp.bfloat16)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        out = kernel_sm90.grouped_matmul_swiglu(
            lhs, rhs, group_sizes, config=config, num_sms=3, transpose_rhs=transpose
        )
    assert out.shape == (m, n // 2) and out.dtype == jnp.bfloat16
    out = np.asarray(out.astype(jnp.float32))
    assert np.isfinite(out).all(), "the interpreter's NaN-filled output was not fully overwritten"
    ref = np.asarray(reference_of(_problem(m, k, n, g, transpose))(lhs, rhs, group_sizes))
    assert relative_error(out, ref) < 1e-2
    assert not out[min(sum(sizes), m) :].any()


def test_interpreted_plain_pipeline_with_ragged_tail_and_empty_expert():
    # Two column tiles of F=128: the up tile of column tile c is tile c + 2 of rhs's 256 columns.
    _interpret(PLAIN, 70, 128, 256, [20, 0, 30, 15])


def test_interpreted_warp_specialized_split_n_transposed():
    _interpret(WS_N, 130, 128, 256, [60, 0, 30, 15], transpose=True)


def test_interpreted_warp_specialized_split_m_rows_below_the_tile():
    _interpret(WS_M, 5, 128, 256, [2, 0, 3, 0])


def test_interpreted_every_row_in_one_expert_transposed_plain():
    _interpret(PLAIN, 64, 64, 128, [0, 64], transpose=True)


# F no whole number of CTA tiles (gpt-oss: F = 2880 is 22.5 x 128) and K no whole number of steps (2880
# is 22.5 x 128, 1440 11.25 x 128), scaled down: the gate tile of the last column tile reaches into the
# up columns (products the clipped stores drop), the up tile past 2F (zero-filled).
@pytest.mark.parametrize(
    "config, k, f, transpose",
    [
        (dataclasses.replace(PLAIN, block_n=128), 160, 192, False),  # F = 1.5 tiles; K = 2.5 steps of 64
        pytest.param(WS_N, 96, 320, True, marks=pytest.mark.slow),  # F = 2.5 CTA tiles of 128
        # F = 96 (1.5 x 64, as 1440): 64-byte swizzled output and [K, 2F] weight tiles, the up tile 96
        # columns on
        pytest.param(dataclasses.replace(PLAIN, block_n=64), 160, 96, False, marks=pytest.mark.slow),
    ],
)
def test_interpreted_partial_last_column_tile_and_k_step(config, k, f, transpose):
    assert f % config.cta_n and k % config.block_k
    _interpret(config, 40, k, 2 * f, [17, 0, 13], transpose=transpose)


@pytest.mark.parametrize("tokens", [4096, pytest.param(16384, marks=pytest.mark.slow)])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("f", [2880, 1440])
def test_heuristic_tail_configs_lower_for_hopper_at_gpt_oss_gate_up(tokens, transpose, f):
    # gpt-oss-120b's gate_up: 128 experts, top-4, H = F = 2880; at TP=2 F = 1440 (22.5 x 64).
    problem = _problem(tokens * 4, 2880, 2 * f, 128, transpose)
    config = space.heuristic(problem, HOPPER)
    assert "mosaic_gpu" in _lower(config, problem.m, 2880, 2 * f, 128, transpose).mlir_module()


def _lower(config, m, k, n, g, transpose=False):
    lhs = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((g, n, k) if transpose else (g, k, n), jnp.bfloat16)
    sizes = jax.ShapeDtypeStruct((g,), jnp.int32)
    fn = functools.partial(
        kernel_sm90.grouped_matmul_swiglu, config=config, num_sms=132, transpose_rhs=transpose
    )
    return jax.export.export(jax.jit(fn), platforms=["cuda"])(lhs, rhs, sizes)


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("m", [16, 8192])
def test_heuristic_configs_lower_for_hopper_at_mixtral_shapes(m, transpose):
    problem = dataclasses.replace(MIXTRAL, m=m, transpose_rhs=transpose)
    config = space.heuristic(problem, HOPPER)
    exported = _lower(config, m, 4096, 28672, 8, transpose)
    assert "mosaic_gpu" in exported.mlir_module()
    assert exported.out_avals[0].shape == (m, 14336)


@pytest.mark.parametrize(
    "config",
    [PLAIN, WS_N, WS_M, C(block_m=128, block_n=64, block_k=128, max_concurrent_steps=2, wg_split="none")],
    ids=["plain", "ws_n", "ws_m", "ws_one"],
)
def test_every_pipeline_lowers(config):
    assert "mosaic_gpu" in _lower(config, 300, 256, 512, 4).mlir_module()


def test_smem_model_counts_both_weight_tiles(monkeypatch):
    """With Mosaic's limit forced to 1 byte, its error reports the bytes the kernel really needs."""
    from jax.experimental.mosaic.gpu import core as mosaic_core

    config = C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=3, wg_split="m")
    monkeypatch.setattr(mosaic_core, "_SMEM_SIZE_BOUND", 1)
    with pytest.raises(ValueError, match="exceeds available shared memory") as info:
        _lower(config, 1024, 1024, 512, 8)
    actual = int(str(info.value).split("smem_bytes=")[1].split()[0])
    problem = _problem(1024, 1024, 512, 8)
    assert actual <= tiling.smem_bytes(problem, config) <= actual + tiling.SMEM_OVERHEAD_BYTES
    plain_gemm = dataclasses.replace(problem, op="grouped_matmul")
    assert tiling.smem_bytes(problem, config) > tiling.smem_bytes(plain_gemm, config)


def test_kernel_name_tags_the_op():
    assert kernel_sm90.kernel_name(WS_N, "grouped_matmul_swiglu").startswith("moetune_gmm_swiglu_m64n64k64")


def test_output_columns_are_half_of_n():
    assert MIXTRAL.out_n == 14336 and dataclasses.replace(MIXTRAL, op="grouped_matmul").out_n == 28672
    assert tiling.geometry(MIXTRAL, WS_N).col_tiles == 14336 // 128


def test_constraints_see_two_accumulators_and_no_split_k():
    # 128x128 per consumer fits one accumulator beside a producer but not two.
    big = C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=2, wg_split="n")
    plain_gemm = dataclasses.replace(MIXTRAL, op="grouped_matmul")
    assert space.accumulator_fits_registers(plain_gemm, big, HOPPER) is None
    assert "2 128x128 accumulator(s)" in space.accumulator_fits_registers(MIXTRAL, big, HOPPER)
    split = dataclasses.replace(WS_N, split_k=2)
    assert "swiglu epilogue" in space.split_k_linear(MIXTRAL, split, HOPPER)
    assert space.split_k_linear(plain_gemm, split, HOPPER) is None
    # F=192 in 128-column CTA tiles: the last one partial, its up tile F columns after its gate.
    odd_f = dataclasses.replace(MIXTRAL, n=384)
    assert space.n_tiles_fit(odd_f, WS_N, HOPPER) is None


def test_space_has_no_split_k_and_heuristic_is_valid():
    for m in (1, 16, 512, 8192):
        problem = dataclasses.replace(MIXTRAL, m=m)
        assert space.space(problem, HOPPER).domains["split_k"] == (1,)
        config = space.heuristic(problem, HOPPER)
        assert all(c(problem, config, HOPPER) is None for c in space.VALIDITY_CONSTRAINTS), config


def test_check_problem_needs_f_a_multiple_of_64():
    with pytest.raises(Unsupported, match="F=1448"):
        space.check_problem(dataclasses.replace(MIXTRAL, n=2896))
    space.check_problem(dataclasses.replace(MIXTRAL, n=2 * 2880))


def test_interpreted_configs_sampled_from_the_space():
    """A few valid configs of a small problem (epilogue tiles, grid orders, pipelines drawn at random)."""
    problem = _problem(96, 128, 512, 4)
    valid, _ = space.space(problem, HOPPER).enumerate(problem, HOPPER)
    rng = random.Random(3)
    for config in rng.sample(valid, 3):
        _interpret(config, 96, 128, 512, [30, 0, 41, 20], transpose=rng.random() < 0.5)
