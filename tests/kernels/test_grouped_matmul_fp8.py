"""The FP8 ops: scales per layout, the xla kernels against the float32 reference of the dequantized
operands, the public API's trace-time checks, and backends that decline a layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import moetune.kernels as mk
from moetune.kernels import registry
from moetune.kernels.api import explain
from moetune.kernels.backends.xla.config import STRATEGIES, XlaConfig
from moetune.kernels.errors import ConfigInvalid, Unsupported, WrongResult
from moetune.kernels.ops import fp8_scales
from moetune.kernels.problem import SCALE_LAYOUTS, Problem
from moetune.kernels.reference import reference_of, relative_error
from moetune.tuner import verify
from moetune.tuner.input_cache import InputCache, Reference

pytestmark = pytest.mark.slow  # the second tier: seconds per case on a CPU

LAYOUTS = SCALE_LAYOUTS[1:]
FP8 = "float8_e4m3fn"
SIZES = [10, 0, 17, 5]  # 32 of 40 rows: the last 8 belong to no group


def fp8_problem(op="grouped_matmul_fp8", layout="row_channel", transpose_rhs=False, dtype=FP8, **dims):
    dims = {"m": 40, "k": 256, "n": 256, "g": 4} | dims
    return Problem(
        op, **dims, lhs_dtype=dtype, rhs_dtype=dtype, transpose_rhs=transpose_rhs, scale_layout=layout
    )


def operands(problem, seed=0):
    keys = jax.random.split(jax.random.key(seed))
    (lhs, lhs_scale), (rhs, rhs_scale) = (
        problem.spec.draw(problem, side, k) for side, k in zip(("lhs", "rhs"), keys, strict=True)
    )
    return lhs, lhs_scale, rhs, rhs_scale, jnp.asarray(SIZES, jnp.int32)


def test_scale_shapes_follow_the_operands_layout():
    shapes = {
        layout: [
            fp8_scales.scale_shape(fp8_problem(layout=layout, transpose_rhs=t), s)
            for t in (0, 1)
            for s in ("lhs", "rhs")
        ]
        for layout in LAYOUTS
    }
    assert shapes == {
        "tensor": [(1, 1), (4, 1, 1), (1, 1), (4, 1, 1)],
        "row_channel": [(40, 1), (4, 1, 256), (40, 1), (4, 256, 1)],
        "block_1x128_128x128": [(40, 2), (4, 2, 2), (40, 2), (4, 2, 2)],
    }
    problem = fp8_problem(layout="block_1x128_128x128", n=384, transpose_rhs=True)
    assert fp8_scales.scale_shape(problem, "rhs") == (4, 3, 2)  # [g, n/128, k/128]


def test_draws_are_fp8_with_real_scales_that_dequantize_to_the_draw():
    problem = fp8_problem(layout="block_1x128_128x128")
    lhs, lhs_scale, rhs, rhs_scale, _ = operands(problem)
    assert (lhs.dtype, rhs.dtype, lhs_scale.dtype) == (jnp.float8_e4m3fn, jnp.float8_e4m3fn, jnp.float32)
    # Each block's largest value sits at e4m3's largest finite value, so the scale is the block's amax/448.
    per_block = jnp.abs(lhs.astype(jnp.float32)).reshape(40, 2, 128).max(axis=2)
    np.testing.assert_array_equal(per_block, 448.0)
    assert float(jnp.std(jnp.log(lhs_scale))) > 0.5  # scales differ across rows, as real ones do
    x = jax.random.normal(jax.random.key(3), (8, 256)) * 3
    q, s = fp8_scales.quantize(x, (1, 128), FP8)
    assert relative_error(fp8_scales.dequantize(q, s), x) < 2**-4  # e4m3: 3 mantissa bits


@pytest.mark.parametrize(
    ("op", "layout"),
    [("grouped_matmul_fp8", layout) for layout in LAYOUTS] + [("grouped_matmul_swiglu_fp8", LAYOUTS[-1])],
)
def test_xla_matches_the_dequantized_reference(op, layout):
    transpose_rhs = layout == "row_channel"  # each layout once, one of them with rhs [g, n, k]
    problem = fp8_problem(op, layout, transpose_rhs)
    args = operands(problem)
    ref = reference_of(problem)(*args)
    out = mk.call_scaled_op(op, *args, scale_layout=layout, transpose_rhs=transpose_rhs, backend="xla")
    assert out.shape == problem.out_shape and out.dtype == jnp.bfloat16
    assert relative_error(out, ref) <= problem.spec.tolerance_for("bfloat16")
    assert not np.asarray(out[32:]).any()  # rows past the groups are zero


@pytest.mark.parametrize("layout", ["tensor", "block_1x128_128x128"])  # scale after the sum; inside the dot
def test_every_xla_strategy_computes_the_same(layout):
    problem = fp8_problem(layout=layout)
    args = operands(problem)
    ref = reference_of(problem)(*args)
    backend = registry.get("xla")
    for strategy in STRATEGIES:
        out = jax.jit(backend.build(problem, XlaConfig(strategy=strategy, chunk_m=16)))(*args)
        assert relative_error(out, ref) <= problem.spec.tolerance_for("bfloat16"), strategy


def test_an_lhs_with_rows_past_m_carries_its_per_row_scales_along():
    problem = fp8_problem(layout="row_channel")
    lhs, lhs_scale, rhs, rhs_scale, sizes = operands(problem)
    padded = jnp.concatenate([lhs, jnp.full((8, 256), jnp.nan, lhs.dtype)])
    padded_scale = jnp.concatenate([lhs_scale, jnp.full((8, 1), jnp.nan)])
    out = registry.get("xla").build(problem, XlaConfig())(padded, padded_scale, rhs, rhs_scale, sizes)
    assert relative_error(out, reference_of(problem)(lhs, lhs_scale, rhs, rhs_scale, sizes)) <= 8e-3


def test_the_tuners_check_passes_the_kernel_and_fails_a_wrong_scale():
    """The tolerance separates a right result from one with a single expert's scales wrong."""
    problem = fp8_problem(layout="row_channel", m=64)
    cache = InputCache()
    inputs = cache.inputs(problem, seed=0)
    right = registry.get("xla").build(problem, XlaConfig())
    sizes = [16, 16, 16, 16]
    assert verify.verify(right, inputs, cache, [sizes]) <= 8e-3

    def expert_1_scaled_as_expert_0(lhs, lhs_scale, rhs, rhs_scale, group_sizes):
        return right(lhs, lhs_scale, rhs, rhs_scale.at[1].set(rhs_scale[0]), group_sizes)

    with pytest.raises(WrongResult, match="exceeds the bfloat16 tolerance 0.008"):
        verify.verify(expert_1_scaled_as_expert_0, inputs, cache, [sizes])
    assert isinstance(cache.reference(inputs, sizes), Reference)


def test_wrong_scales_and_operands_raise_at_trace_time_naming_them():
    problem = fp8_problem(layout="block_1x128_128x128")
    lhs, lhs_scale, rhs, rhs_scale, sizes = operands(problem)
    call = lambda *a, layout="block_1x128_128x128": mk.grouped_matmul_fp8(*a, scale_layout=layout)  # noqa: E731
    with pytest.raises(
        ConfigInvalid,
        match=r"rhs_scale must be float32 \[4, 2, 2\] for scale_layout=block.*got float32 \[4, 1, 256\]",
    ):
        call(lhs, lhs_scale, rhs, jnp.ones((4, 1, 256)), sizes)
    with pytest.raises(ConfigInvalid, match=r"lhs_scale must be float32 \[40, 2\].*got bfloat16 \[40, 2\]"):
        jax.jit(call)(lhs, lhs_scale.astype(jnp.bfloat16), rhs, rhs_scale, sizes)
    with pytest.raises(ConfigInvalid, match="scale_layout='per_row' is not one of"):
        call(lhs, lhs_scale, rhs, rhs_scale, sizes, layout="per_row")
    with pytest.raises(ConfigInvalid, match="takes lhs dtypes float8_e4m3fn, .* not bfloat16"):
        call(lhs.astype(jnp.bfloat16), lhs_scale, rhs, rhs_scale, sizes)
    with pytest.raises(ConfigInvalid, match="needs k and n multiples of 128"):
        call(lhs[:, :200], lhs_scale, rhs[:, :200], rhs_scale, sizes)


def test_backends_without_a_kernel_for_a_layout_decline_and_the_call_falls_through(probe_backends):
    problem = fp8_problem(layout="row_channel")
    mosaic = registry.get("mosaic_gpu")
    # Hopper's 8-bit wgmma reads both operands K-major: weights [G, K, N] fall through, [G, N, K] are served.
    with pytest.raises(Unsupported, match=r"FP8 weights must be \[G, N, K\] \(transpose_rhs=True"):
        mosaic.check(problem)
    for layout in ("tensor", "row_channel", "block_1x128_128x128"):
        mosaic.check(fp8_problem(layout=layout, transpose_rhs=True))
        mosaic.check(fp8_problem(op="grouped_matmul_swiglu_fp8", layout=layout, transpose_rhs=True))
    with pytest.raises(Unsupported, match="takes float8_e4m3fn or float8_e5m2, not lhs=float8_e4m3fnuz"):
        mosaic.check(fp8_problem(dtype="float8_e4m3fnuz", transpose_rhs=True))
    # Block-scaled SwiGLU whose F = 192 is not whole scale blocks: the up columns start inside one.
    with pytest.raises(Unsupported, match="F=192 is not a multiple of 128"):
        mosaic.check(fp8_problem("grouped_matmul_swiglu_fp8", "block_1x128_128x128", True, n=384))
    flydsl = registry.get("flydsl")
    with pytest.raises(
        Unsupported, match="no per-row or block scales, only per-tensor: not scale_layout=row_channel"
    ):
        flydsl.check(problem)
    flydsl.check(fp8_problem(layout="tensor"))  # its FP8 kernel is the GEMM of a per-tensor-scaled op
    with pytest.raises(Unsupported, match="takes no scale operands yet"):
        flydsl.build(fp8_problem(layout="tensor"), flydsl.heuristic(problem, flydsl.target_device("gfx950")))
    # A backend ahead of xla that does not serve the op: dispatch passes the call on, saying why.
    probe_backends("probe", priority=50)
    chosen = explain(problem)
    assert chosen.backend == "xla"
    assert any(
        d.startswith("probe: probe serves op=grouped_matmul, not op='grouped_matmul_fp8'")
        for d in chosen.declined
    )
    args = operands(problem)
    out = mk.grouped_matmul_fp8(*args, scale_layout="row_channel")
    assert relative_error(out, reference_of(problem)(*args)) <= 8e-3
