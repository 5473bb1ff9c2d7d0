"""The Hopper FP8 kernel on a CPU: Pallas's GPU interpreter for the scales applied in the epilogue,
lowering to Mosaic GPU for every layout, and the search space's FP8 rules.

The interpreter runs the kernel's jaxpr (TMA copies, wgmma on e4m3 operands, the scale loads) on the CPU.
It cannot run the block-scaled path, whose per-step accumulators are stored to (jax 0.11.2's interpreter
fails on stores into a wgmma accumulator); that path is lowered here through jax.export for the cuda
platform (Mosaic GPU's layout inference and checks, short of PTX) and checked numerically on the H200
by tests/gpu/test_mosaic_gpu_fp8.py.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from tests.requires import require

jax = require("jax")
jnp = jax.numpy
plgpu = require("jax.experimental.pallas.mosaic_gpu")

from moetune.kernels import ops  # noqa: E402
from moetune.kernels.backends.mosaic_gpu import cost_model as cost  # noqa: E402
from moetune.kernels.backends.mosaic_gpu import (  # noqa: E402
    kernel_sm90,
    space,  # noqa: E402
    tiling,
)
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C  # noqa: E402
from moetune.kernels.device import DeviceFingerprint  # noqa: E402
from moetune.kernels.ops import fp8_scales  # noqa: E402
from moetune.kernels.problem import Problem  # noqa: E402
from moetune.kernels.reference import relative_error  # noqa: E402

HOPPER = DeviceFingerprint("NVIDIA H200", "gpu", 132, 0, "9.0", "", "", "", "")
FP8 = "float8_e4m3fn"
WS = C(block_m=64, block_n=64, block_k=128, max_concurrent_steps=2, wg_split="n")
PLAIN = C(
    block_m=64, block_n=64, block_k=128, max_concurrent_steps=2, warp_specialized=False, wg_split="none"
)
SWAB = C(block_m=16, block_n=64, block_k=128, max_concurrent_steps=2, wg_split="n")
# Two scale blocks per K step (block scales promote the first while the second multiplies).
TWO_BLOCKS = {
    "ws-k256": dataclasses.replace(WS, block_k=256),
    "ws_m-k256": C(block_m=64, block_n=64, block_k=256, max_concurrent_steps=2, wg_split="m"),
    "plain-k256": dataclasses.replace(PLAIN, block_k=256),
    "swap_ab-k256": dataclasses.replace(SWAB, block_k=256),
}
# The consumers taking turns at the tensor cores (each promotes while the other's wgmmas run).
STAGGERED = {
    "ws-stagger": dataclasses.replace(WS, stagger_consumers=True),
    "ws_m-k256-stagger": dataclasses.replace(TWO_BLOCKS["ws_m-k256"], stagger_consumers=True),
    "swap_ab-k256-stagger": dataclasses.replace(TWO_BLOCKS["swap_ab-k256"], stagger_consumers=True),
}
# Experts starting at rows 0, 13, 14, 64 and 64; 16 rows past the groups.
SIZES = [13, 1, 50, 0]


def _problem(op: str, layout: str, m: int = 80, k: int = 256, n: int = 256, g: int = len(SIZES)) -> Problem:
    return Problem(op, m, k, n, g, FP8, FP8, "bfloat16", transpose_rhs=True, scale_layout=layout)


def _kernel(problem: Problem, config: C, num_sms: int):
    fn = kernel_sm90.grouped_matmul_swiglu_fp8 if problem.spec.epilogue else kernel_sm90.grouped_matmul_fp8
    return functools.partial(fn, config=config, num_sms=num_sms, scale_layout=problem.scale_layout)


def _inputs(problem: Problem):
    spec = ops.get(problem.op)
    key_l, key_r = jax.random.split(jax.random.key(problem.m + problem.n))
    lhs, lhs_scale = spec.draw(problem, "lhs", key_l)
    rhs, rhs_scale = spec.draw(problem, "rhs", key_r)
    return lhs, lhs_scale, rhs, rhs_scale, jnp.asarray(SIZES, jnp.int32)


@pytest.mark.parametrize(
    "op, layout, config",
    [
        ("grouped_matmul_fp8", "row_channel", WS),
        ("grouped_matmul_swiglu_fp8", "row_channel", SWAB),
        ("grouped_matmul_swiglu_fp8", "tensor", PLAIN),
    ],
    ids=["row_channel-ws", "row_channel-swiglu-swap_ab", "tensor-swiglu-plain"],
)
def test_interpreted_scales_in_the_epilogue_match_the_dequantized_reference(op, layout, config):
    problem = _problem(op, layout)
    args = _inputs(problem)
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        out = _kernel(problem, config, num_sms=3)(*args)
    out = np.asarray(out.astype(jnp.float32))
    ref = np.asarray(ops.get(op).reference(*args, transpose_rhs=True))
    assert relative_error(out, ref) < ops.get(op).tolerance["bfloat16"]
    assert not out[sum(SIZES) :].any()
    # A wrong channel scale is far outside the tolerance: the check can fail.
    lhs, lhs_scale, rhs, rhs_scale, sizes = args
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        wrong = _kernel(problem, config, num_sms=3)(lhs, lhs_scale, rhs, rhs_scale[::-1], sizes)
    assert relative_error(np.asarray(wrong.astype(jnp.float32)), ref) > 0.1


@pytest.mark.parametrize(
    "op, layout, config",
    [("grouped_matmul_fp8", "row_channel", WS), ("grouped_matmul_swiglu_fp8", "tensor", PLAIN)],
    ids=["row_channel-ws", "tensor-swiglu-plain"],
)
def test_interpreted_local_slice_of_experts_matches_the_whole_on_its_rows(op, layout, config):
    # Expert parallelism: the weights and their scales of experts 1 and 2 only, whose rows start at row
    # 13; the rows of the other experts and past the groups come out zero.
    problem = _problem(op, layout)
    lhs, lhs_scale, rhs, rhs_scale, sizes = _inputs(problem)
    per_expert = rhs_scale.shape[0] == rhs.shape[0]
    local_scale = rhs_scale[1:3] if per_expert else rhs_scale
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        whole = _kernel(problem, config, num_sms=3)(lhs, lhs_scale, rhs, rhs_scale, sizes)
        local = _kernel(problem, config, num_sms=3)(
            lhs, lhs_scale, rhs[1:3], local_scale, sizes[1:3], row_start=jnp.int32(SIZES[0])
        )
    whole, local = np.asarray(whole.astype(jnp.float32)), np.asarray(local.astype(jnp.float32))
    mine = slice(SIZES[0], sum(SIZES[:3]))
    np.testing.assert_array_equal(local[mine], whole[mine])
    assert np.abs(local[mine]).max() > 0.1
    assert not local[: SIZES[0]].any() and not local[mine.stop :].any()


@pytest.mark.parametrize(
    "config",
    [WS, PLAIN, SWAB, *TWO_BLOCKS.values(), *STAGGERED.values()],
    ids=["ws", "plain", "swap_ab", *TWO_BLOCKS, *STAGGERED],
)
@pytest.mark.parametrize("op", ["grouped_matmul_fp8", "grouped_matmul_swiglu_fp8"])
def test_block_scales_lower_for_hopper(op, config):
    problem = _problem(op, "block_1x128_128x128", m=300, k=512, n=512)
    args = [
        jax.ShapeDtypeStruct((problem.m, problem.k), jnp.float8_e4m3fn),
        jax.ShapeDtypeStruct(fp8_scales.scale_shape(problem, "lhs"), jnp.float32),
        jax.ShapeDtypeStruct(problem.rhs_shape, jnp.float8_e4m3fn),
        jax.ShapeDtypeStruct(fp8_scales.scale_shape(problem, "rhs"), jnp.float32),
        jax.ShapeDtypeStruct((problem.g,), jnp.int32),
    ]
    exported = jax.export.export(jax.jit(_kernel(problem, config, 132)), platforms=["cuda"])(*args)
    assert "moetune_gmm_" in exported.mlir_module()


@pytest.mark.slow
@pytest.mark.parametrize(
    "op, layout, config, k, n",
    [
        # 1.25 K steps of 128 (a 32-byte swizzle: K = 160); 2.5 CTA tiles of 128 columns
        ("grouped_matmul_fp8", "row_channel", WS, 160, 320),
        # F = 192: 1.5 CTA tiles, the channel scales padded past the up columns
        ("grouped_matmul_swiglu_fp8", "row_channel", SWAB, 160, 384),
        ("grouped_matmul_swiglu_fp8", "tensor", PLAIN, 224, 384),  # 1.75 K steps (64-byte swizzle)
    ],
)
def test_interpreted_partial_last_k_step_and_column_tile(op, layout, config, k, n):
    problem = _problem(op, layout, k=k, n=n)
    assert k % config.block_k  # and, but for the last case, a partial last column tile
    args = _inputs(problem)
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        out = np.asarray(_kernel(problem, config, num_sms=3)(*args).astype(jnp.float32))
    assert np.isfinite(out).all(), "the interpreter's NaN-filled output was not fully overwritten"
    ref = np.asarray(ops.get(op).reference(*args, transpose_rhs=True))
    assert relative_error(out, ref) < ops.get(op).tolerance["bfloat16"]
    assert not out[sum(SIZES) :].any()


@pytest.mark.parametrize("tokens", [4096, pytest.param(16384, marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "op, k, n",
    [
        ("grouped_matmul_fp8", 2880, 2880),
        ("grouped_matmul_fp8", 1440, 2880),
        ("grouped_matmul_swiglu_fp8", 2880, 5760),
        ("grouped_matmul_fp8", 2880, 1440),  # TP=2's N and F: 22.5 x 64
        ("grouped_matmul_swiglu_fp8", 2880, 2880),
    ],
)
def test_heuristic_tail_configs_lower_for_hopper_at_gpt_oss_shapes(op, k, n, tokens):
    # gpt-oss-120b (128 experts, top-4, H = F = 2880) in FP8 with per-token x per-channel scales.
    problem = _problem(op, "row_channel", m=4 * tokens, k=k, n=n, g=128)
    config = space.heuristic(problem, HOPPER)
    assert k % config.block_k or problem.out_n % config.cta_n
    args = [
        jax.ShapeDtypeStruct((problem.m, problem.k), jnp.float8_e4m3fn),
        jax.ShapeDtypeStruct(fp8_scales.scale_shape(problem, "lhs"), jnp.float32),
        jax.ShapeDtypeStruct(problem.rhs_shape, jnp.float8_e4m3fn),
        jax.ShapeDtypeStruct(fp8_scales.scale_shape(problem, "rhs"), jnp.float32),
        jax.ShapeDtypeStruct((problem.g,), jnp.int32),
    ]
    exported = jax.export.export(jax.jit(_kernel(problem, config, 132)), platforms=["cuda"])(*args)
    assert "moetune_gmm_" in exported.mlir_module()


def test_fp8_operands_must_be_k_major_and_ocp():
    problem = _problem("grouped_matmul_fp8", "row_channel")
    lhs, lhs_scale, rhs, rhs_scale, sizes = _inputs(problem)
    fn = functools.partial(kernel_sm90.grouped_matmul_fp8, config=WS, num_sms=3, scale_layout="row_channel")
    with pytest.raises(ValueError, match="8-bit wgmma takes K-major weights only"):
        fn(lhs, lhs_scale, jnp.swapaxes(rhs, 1, 2), rhs_scale, sizes, transpose_rhs=False)
    with pytest.raises(ValueError, match="must be float8_e4m3fn or float8_e5m2"):
        fn(lhs.astype(jnp.float8_e4m3fnuz), lhs_scale, rhs, rhs_scale, sizes)


def test_block_scales_need_whole_scale_blocks_per_k_step():
    problem = _problem("grouped_matmul_fp8", "block_1x128_128x128", k=1024, n=1024)
    assert space.block_scale_steps(problem, dataclasses.replace(WS, block_k=64), HOPPER)
    assert space.block_scale_steps(problem, dataclasses.replace(WS, block_n=256), HOPPER)
    assert space.block_scale_steps(problem, WS, HOPPER) is None
    assert space.block_scale_steps(problem, dataclasses.replace(WS, block_k=256), HOPPER) is None
    assert space.block_scale_steps(_problem("grouped_matmul_fp8", "row_channel"), WS, HOPPER) is None
    domains = space.domains(problem, HOPPER)
    assert domains["block_k"] == (128, 256) and max(domains["block_n"]) == 128


def test_block_scales_count_a_second_accumulator_against_the_registers():
    wide = C(block_m=128, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="n")
    assert (
        space.accumulator_fits_registers(_problem("grouped_matmul_fp8", "row_channel"), wide, HOPPER) is None
    )
    block = _problem("grouped_matmul_fp8", "block_1x128_128x128")
    assert "2 128x128 accumulator(s) need ~296 registers" in space.accumulator_fits_registers(
        block, wide, HOPPER
    )
    # Two scale blocks per step: a set of step accumulators each. A gated 64x64 tile still fits.
    two = C(block_m=64, block_n=128, block_k=256, max_concurrent_steps=2, wg_split="n")
    assert space.accumulator_fits_registers(block, two, HOPPER) is None
    gated = _problem("grouped_matmul_swiglu_fp8", "block_1x128_128x128")
    assert "6 64x128 accumulator(s)" in space.accumulator_fits_registers(gated, two, HOPPER)
    assert space.accumulator_fits_registers(gated, dataclasses.replace(two, block_n=64), HOPPER) is None


@pytest.mark.parametrize("layout", ["tensor", "row_channel", "block_1x128_128x128"])
def test_the_heuristic_picks_a_config_its_space_admits_at_deepseek_v3_shapes(layout):
    for op, k, n in (("grouped_matmul_swiglu_fp8", 7168, 4096), ("grouped_matmul_fp8", 2048, 7168)):
        for m in (8, 1024, 32768):
            problem = _problem(op, layout, m=m, k=k, n=n, g=256)
            config = space.heuristic(problem, HOPPER)
            assert space.space(problem, HOPPER).violation(problem, config, HOPPER) is None, (problem, config)
            assert config.block_k in (128, 256)


def test_the_cost_model_plans_fp8_at_twice_the_tensor_rate():
    # A compute-bound shape (Mixtral's gate_up at 4096 tokens): FP8 moves half the bytes and runs the
    # tensor cores at twice the rate, so the same tiles take about half as long; block scales pay for
    # their per-step promotion.
    config = C(block_m=128, block_n=128, block_k=128, max_concurrent_steps=3, wg_split="n")
    bf16 = Problem("grouped_matmul", 8192, 4096, 28672, 8)
    fp8 = _problem("grouped_matmul_fp8", "row_channel", m=8192, k=4096, n=28672, g=8)
    ratio = cost.estimate(fp8, config, HOPPER).seconds / cost.estimate(bf16, config, HOPPER).seconds
    assert 0.45 < ratio < 0.6
    block = dataclasses.replace(fp8, scale_layout="block_1x128_128x128")
    assert cost.estimate(block, config, HOPPER).seconds > cost.estimate(fp8, config, HOPPER).seconds
    # Two scale blocks per step wait for the tensor cores half as often.
    two = dataclasses.replace(config, block_k=256, max_concurrent_steps=2)
    assert cost.estimate(block, two, HOPPER).seconds < cost.estimate(block, config, HOPPER).seconds


def test_block_scales_cost_a_promotion_of_every_accumulator_value_that_the_tensor_cores_wait_for():
    # Mixtral's down at 4096 tokens, compute-bound. Measured on an H200 (docs/fp8.md): the same 64x128
    # consumers took 1.27x as long under block scales as under per-token x per-channel scales, and two
    # 128x64 consumers 1.21x as long as two 64x128 ones, though per-channel scales favour the taller.
    down = dict(m=8192, k=14336, n=4096, g=8)
    block = _problem("grouped_matmul_fp8", "block_1x128_128x128", **down)
    channel = dataclasses.replace(block, scale_layout="row_channel")
    wide = C(block_m=64, block_n=128, block_k=256, max_concurrent_steps=2, wg_split="n")
    tall = dataclasses.replace(wide, block_m=128, block_n=64)

    def seconds(problem, config):
        return cost.estimate(problem, config, HOPPER).seconds

    assert seconds(block, wide) > 1.15 * seconds(channel, wide)
    assert seconds(channel, tall) < seconds(channel, wide)
    assert seconds(block, tall) > 1.1 * seconds(block, wide)
    assert space.heuristic(block, HOPPER).block_m == 64
    # A tile promotes its padding rows too: at decode a swapped tile of 8 token rows promotes an eighth of
    # the values a 64-row tile does (its accumulator's 128 weight columns are two wgmma row tiles, so
    # each costs TALL_PROMOTION's share more); the step waits are the same.
    decode = _problem("grouped_matmul_fp8", "block_1x128_128x128", m=16, k=2048, n=7168, g=256)
    swapped = dataclasses.replace(wide, block_m=8)

    def promotion(config):
        geo = tiling.geometry(decode, config)
        return cost.promotion_s(decode, config, geo, 1.5e9) - geo.k_steps * cost.STEP_WAIT_S

    assert promotion(swapped) == pytest.approx(promotion(wide) / 8 * cost.TALL_PROMOTION)
