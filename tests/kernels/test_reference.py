"""The float32 reference, the tolerances and the relative error every candidate is judged by."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels import reference
from moetune.kernels.errors import WrongResult
from moetune.kernels.reference import (
    chunked_grouped_matmul,
    reference_grouped_matmul,
    relative_error,
    tolerance,
)


def _operands(dtype=jnp.bfloat16):
    rng = np.random.default_rng(1)
    lhs = jnp.asarray(rng.standard_normal((11, 16)), dtype)
    rhs = jnp.asarray(rng.standard_normal((3, 16, 8)), dtype)
    return lhs, rhs, jnp.asarray([4, 0, 5], jnp.int32)


def test_reference_is_ragged_dot_in_float32():
    lhs, rhs, sizes = _operands()
    ref = reference_grouped_matmul(lhs, rhs, sizes)
    assert ref.dtype == jnp.float32
    expected = np.zeros((11, 8))
    l64, r64 = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    expected[0:4] = l64[0:4] @ r64[0]
    expected[4:9] = l64[4:9] @ r64[2]
    np.testing.assert_allclose(np.asarray(ref), expected, rtol=1e-5, atol=1e-5)
    assert not np.any(np.asarray(ref[9:]))


@pytest.mark.parametrize("seed", range(12))
def test_chunked_reference_matches_ragged_dot(seed):
    """Row chunks that span several groups, empty groups (first, inside, last), rows past the groups, a
    partial last chunk, both weight layouts: the same float32 result as ragged_dot's."""
    rng = np.random.default_rng(seed)
    g, m, chunk = int(rng.integers(1, 9)), int(rng.integers(1, 200)), int(rng.choice([8, 16, 64]))
    sizes = rng.multinomial(int(rng.integers(0, m + 1)), np.ones(g) / g)
    sizes[rng.random(g) < 0.3] = 0
    transpose = bool(seed % 2)
    lhs = jnp.asarray(rng.standard_normal((m, 16)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((g, 24, 16) if transpose else (g, 16, 24)), jnp.float32)
    sizes = jnp.asarray(sizes, jnp.int32)
    expected = reference_grouped_matmul(lhs, rhs, sizes, transpose_rhs=transpose)
    out = chunked_grouped_matmul(
        lhs, rhs, sizes, transpose_rhs=transpose, precision=jax.lax.Precision.HIGHEST, chunk_rows=chunk
    )
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_reference_past_the_dense_expansion_walks_chunks(monkeypatch):
    """Where ragged_dot's [G, M, K] expansion would pass the bound, the reference is the chunked loop
    (a loop in the program: a scan, the fixed-count fori_loop's form), with the same result."""
    lhs, rhs, sizes = _operands()
    dense = reference_grouped_matmul(lhs, rhs, sizes)
    monkeypatch.setattr(reference, "DENSE_EXPANSION_MAX_BYTES", 0)
    # Traced through a function of its own: jax caches a function's traces, and another test jits this one.
    assert " scan[" in str(jax.make_jaxpr(lambda *args: reference_grouped_matmul(*args))(lhs, rhs, sizes))
    np.testing.assert_allclose(
        np.asarray(reference_grouped_matmul(lhs, rhs, sizes)), np.asarray(dense), rtol=1e-6
    )


def test_reference_transposed_weights():
    lhs, rhs, sizes = _operands(jnp.float32)
    ref = reference_grouped_matmul(lhs, rhs, sizes)
    transposed = reference_grouped_matmul(lhs, jnp.swapaxes(rhs, 1, 2), sizes, transpose_rhs=True)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(transposed))


def test_reference_under_jit():
    lhs, rhs, sizes = _operands()
    jitted = jax.jit(reference_grouped_matmul, static_argnames="transpose_rhs")
    np.testing.assert_array_equal(
        np.asarray(jitted(lhs, rhs, sizes)), np.asarray(reference_grouped_matmul(lhs, rhs, sizes))
    )


@pytest.mark.parametrize(
    "dtype, limit",
    [
        ("bf16", 1e-2),
        (jnp.bfloat16, 1e-2),
        ("float16", 1e-3),
        (np.float16, 1e-3),
        ("f32", 1e-5),
        (jnp.float32, 1e-5),
    ],
)
def test_tolerance_by_dtype(dtype, limit):
    assert tolerance(dtype) == limit


def test_bf16_rounding_passes_its_tolerance_and_fails_f32s():
    lhs, rhs, sizes = _operands(jnp.float32)
    ref = reference_grouped_matmul(lhs, rhs, sizes)
    rounded = ref.astype(jnp.bfloat16)
    assert relative_error(rounded, ref) < tolerance("bf16")
    assert relative_error(rounded, ref) > tolerance("f32")


def test_relative_error_values():
    ref = np.array([[3.0, 4.0]])
    assert relative_error(ref, ref) == 0.0
    assert relative_error(np.array([[3.0, 4.5]]), ref) == pytest.approx(0.1)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_output_never_passes(bad):
    ref = np.ones((2, 2))
    out = ref.copy()
    out[1, 1] = bad
    assert relative_error(out, ref) == float("inf")


def test_zero_reference():
    zeros = np.zeros((3, 2))
    assert relative_error(zeros, zeros) == 0.0
    assert relative_error(zeros + 1e-30, zeros) == float("inf")


def test_shape_mismatch_is_a_wrong_result():
    with pytest.raises(WrongResult, match=r"output shape \(2, 3\) != reference shape \(3, 2\)"):
        relative_error(np.zeros((2, 3)), np.zeros((3, 2)))


def test_reference_of_is_one_program_per_shape_whatever_the_problem_object():
    # The input cache asks reference_of(problem) anew for every draw: a fresh closure under jit would
    # compile the reference again each time.
    from moetune.kernels.problem import Problem
    from moetune.kernels.reference import reference_of

    lhs, rhs, sizes = _operands()
    compiles: list[str] = []

    def listener(event: str, duration: float, **kwargs) -> None:
        if "backend_compile" in event:
            compiles.append(event)

    problem = Problem("grouped_matmul", m=11, k=16, n=8, g=3, lhs_dtype="bf16", rhs_dtype="bf16")
    first = reference_of(problem)(lhs, rhs, sizes)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        again = reference_of(dataclasses.replace(problem))(lhs, rhs, sizes)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    assert first.dtype == jnp.float32
    np.testing.assert_array_equal(again, reference_grouped_matmul(lhs, rhs, sizes))


@pytest.mark.parametrize("op", ["grouped_matmul", "grouped_matmul_swiglu"])
def test_rows_reference_program_is_the_reference_of_the_chosen_rows(op):
    from moetune.kernels.problem import Problem
    from moetune.kernels.reference import reference_of, rows_reference_program

    lhs, rhs, sizes = _operands()
    problem = Problem(op, m=11, k=16, n=8, g=3)
    rows = jnp.asarray([0, 3, 4, 8, 10], jnp.int32)  # rows 0-3 in group 0, 4-8 in group 2, 10 assigned none
    program = rows_reference_program(problem, 5)
    assert rows_reference_program(problem, 5) is program  # compiled once per (problem, row count)
    got = program(lhs, rows, rhs, jnp.asarray([2, 0, 2], jnp.int32))
    assert got.shape == (5, problem.out_n) and got.dtype == jnp.float32
    expected = reference_of(problem)(lhs[rows], rhs, jnp.asarray([2, 0, 2], jnp.int32))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    full = np.asarray(reference_of(problem)(lhs, rhs, sizes))
    np.testing.assert_allclose(np.asarray(got)[:4], full[[0, 3, 4, 8]], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_operands_give_the_float32_result(dtype):
    # 16-bit operands skip the cast to float32 (their products are exact in float32): the result must be
    # that of the float32-cast operands, up to float32 summation order.
    rng = np.random.default_rng(3)
    lhs = jnp.asarray(rng.standard_normal((37, 256)), dtype)
    rhs = jnp.asarray(rng.standard_normal((3, 256, 24)), dtype)
    sizes = jnp.asarray([20, 0, 15], jnp.int32)
    got = reference_grouped_matmul(lhs, rhs, sizes)
    assert got.dtype == jnp.float32
    expected = np.zeros((37, 24))
    l64, r64 = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    expected[:20], expected[20:35] = l64[:20] @ r64[0], l64[20:35] @ r64[2]
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-4)
    # Far closer than one rounding to the 16-bit dtype, which a reference computed in it would show.
    rounded = np.asarray(jnp.asarray(expected, dtype), np.float64)
    assert np.abs(np.asarray(got) - expected).max() < 0.01 * np.abs(rounded - expected).max()


@pytest.mark.parametrize("seed", range(8))
def test_chunked_weight_gradient_matches_ragged_dot(seed, monkeypatch):
    """The weight gradient's reference past the dense expansion (row chunks spanning several groups, empty
    groups, rows past the groups, a partial last chunk, both layouts) equals ragged_dot's, and a NaN in a
    row past the groups reaches no expert."""
    from moetune.kernels.ops import grouped_matmul_drhs

    rng = np.random.default_rng(seed)
    g, m = int(rng.integers(1, 9)), int(rng.integers(1, 200))
    sizes = rng.multinomial(int(rng.integers(0, m + 1)), np.ones(g) / g)
    sizes[rng.random(g) < 0.3] = 0
    lhs = np.asarray(rng.standard_normal((m, 16)), np.float32)
    dout = np.asarray(rng.standard_normal((m, 24)), np.float32)
    if sizes.sum() < m:
        dout[-1] = np.nan
    transpose = bool(seed % 2)
    args = (jnp.asarray(lhs), jnp.asarray(dout), jnp.asarray(sizes, jnp.int32))
    dense = np.asarray(grouped_matmul_drhs.reference(*args, transpose_rhs=transpose))
    chunk = int(rng.choice([8, 16, 64]))
    chunked = np.asarray(
        reference.chunked_weight_gradient(*args, precision=jax.lax.Precision.HIGHEST, chunk_rows=chunk)
    )
    assert np.isfinite(chunked).all()
    np.testing.assert_allclose(
        chunked.transpose(0, 2, 1) if transpose else chunked, dense, rtol=1e-5, atol=1e-5
    )
    monkeypatch.setattr(reference, "DENSE_EXPANSION_MAX_BYTES", 0)
    walked = jax.make_jaxpr(lambda *a: grouped_matmul_drhs.reference(*a, transpose_rhs=transpose))(*args)
    assert " scan[" in str(walked)
    np.testing.assert_allclose(
        np.asarray(grouped_matmul_drhs.reference(*args, transpose_rhs=transpose)), dense, rtol=1e-5, atol=1e-5
    )
