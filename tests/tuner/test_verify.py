"""The candidate check: poisoned output buffers, zero rows past the groups, NaN, tolerance by dtype."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.errors import WrongResult
from moetune.kernels.problem import Problem
from moetune.kernels.reference import reference_grouped_matmul
from moetune.tuner import input_cache, verify
from moetune.tuner.input_cache import InputCache, Inputs, Reference

PROBLEM = Problem(
    "grouped_matmul", m=32, k=64, n=48, g=4, lhs_dtype="bf16", rhs_dtype="bf16", out_dtype="bf16"
)
SIZES = (10, 0, 12, 6)  # 28 rows assigned, 4 rows of padding


@pytest.fixture(scope="module")
def inputs():
    return Inputs.make(PROBLEM, seed=0)


def ragged(lhs, rhs, sizes):
    return jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.bfloat16)


def test_inputs_rotate_and_are_never_zero(inputs):
    assert len(inputs.sets) >= 2
    (lhs0, rhs0), (lhs1, _) = inputs.sets[:2]
    assert lhs0.shape == (32, 64) and rhs0.shape == (4, 64, 48) and lhs0.dtype == jnp.bfloat16
    assert not np.array_equal(np.asarray(lhs0), np.asarray(lhs1))
    assert np.count_nonzero(np.asarray(lhs0, np.float32)) > 0.99 * lhs0.size
    transposed = Problem("grouped_matmul", m=8, k=16, n=24, g=2, transpose_rhs=True)
    assert [s.shape for s in verify.shape_dtypes(transposed)] == [(8, 16), (2, 24, 16), (2,)]


def test_a_correct_kernel_passes(inputs):
    cache = InputCache()
    error = verify.verify(ragged, inputs, cache, [SIZES, (8, 8, 8, 8)])
    assert 0 <= error < 1e-2


def test_nonzero_rows_past_the_groups_fail(inputs):
    lhs, rhs, gs = InputCache().verify_args(inputs, SIZES)
    good = ragged(lhs, rhs, gs)
    ref = reference_grouped_matmul(lhs, rhs, gs)
    assert verify.check_output(good, Reference.whole(ref), SIZES, PROBLEM) < 1e-2
    with pytest.raises(WrongResult, match="rows past sum"):
        verify.check_output(good.at[30].set(1), Reference.whole(ref), SIZES, PROBLEM)
    with pytest.raises(WrongResult, match="rows past sum"):
        verify.check_output(good.at[31, 2].set(jnp.nan), Reference.whole(ref), SIZES, PROBLEM)


def test_nan_never_passes_and_errors_beyond_tolerance_fail(inputs):
    lhs, rhs, gs = InputCache().verify_args(inputs, SIZES)
    good = ragged(lhs, rhs, gs)
    ref = reference_grouped_matmul(lhs, rhs, gs)
    with pytest.raises(WrongResult, match="NaN"):
        verify.check_output(good.at[3, 3].set(jnp.nan), Reference.whole(ref), SIZES, PROBLEM)
    with pytest.raises(WrongResult, match="exceeds the bfloat16 tolerance"):
        verify.check_output(good * 1.05, Reference.whole(ref), SIZES, PROBLEM)
    with pytest.raises(WrongResult, match="relative error inf"):
        verify.check_output(good.at[3, 3].set(jnp.inf), Reference.whole(ref), SIZES, PROBLEM)
    # Huge finite garbage must not overflow into a pass (or into NaN that would read as "not a number").
    with pytest.raises(WrongResult, match="relative error inf"):
        verify.check_output(good.at[3].set(3e38), Reference.whole(ref), SIZES, PROBLEM)
    with pytest.raises(WrongResult, match="shape"):
        verify.check_output(good[:16], Reference.whole(ref), SIZES, PROBLEM)
    with pytest.raises(WrongResult, match="dtype"):
        verify.check_output(good.astype(jnp.float32), Reference.whole(ref), SIZES, PROBLEM)


def test_a_kernel_that_skips_rows_is_caught_on_some_draw(inputs):
    # Forgets the last expert's rows entirely (leaves them zero): wrong on any draw where it has rows.
    def skips_last_group(lhs, rhs, sizes):
        return ragged(lhs, rhs, sizes.at[-1].set(0))

    with pytest.raises(WrongResult):
        verify.verify(skips_last_group, inputs, InputCache(), [SIZES])


def test_poisoned_call_returns_the_kernels_output():
    out = verify.poisoned_call(lambda x: x + 1, (jnp.zeros(4),), (4,), jnp.float32)
    assert out.tolist() == [1, 1, 1, 1]


def test_the_error_is_relative_over_the_assigned_rows_only():
    out = jnp.zeros((4, 2), jnp.float32).at[0].set(jnp.array([3.0, 4.5]))
    ref = jnp.zeros((4, 2), jnp.float32).at[0].set(jnp.array([3.0, 4.0]))
    problem = Problem("grouped_matmul", m=4, k=8, n=2, g=2, lhs_dtype="f32", rhs_dtype="f32", out_dtype="f32")
    with pytest.raises(WrongResult, match=r"relative error 0.1 \(worst row\) exceeds"):
        verify.check_output(out, Reference.whole(ref), (1, 0), problem)
    assert verify.check_output(ref, Reference.whole(ref), (1, 0), problem) == 0.0
    # Every group empty: a zero reference, and only an all-zero output passes.
    assert (
        verify.check_output(
            jnp.zeros((4, 2), jnp.float32), Reference.whole(jnp.zeros((4, 2))), (0, 0), problem
        )
        == 0.0
    )


def test_relative_error_from_squares_matches_the_reference_semantics():
    assert verify.relative_error_from_squares(0.25, 25.0) == pytest.approx(0.1)
    assert verify.relative_error_from_squares(0.0, 0.0) == 0.0
    assert verify.relative_error_from_squares(1e-30, 0.0) == float("inf")
    assert verify.relative_error_from_squares(float("nan"), 1.0) == float("inf")


def test_one_wrong_tile_of_a_large_output_fails_although_the_whole_norm_would_pass():
    # 1 row in 256 wrong by 10%: the error over the whole output is 0.1 / sqrt(256) ~ 0.006, inside
    # bf16's 1e-2, but that row's own error is 0.1.
    problem = Problem(
        "grouped_matmul", m=256, k=8, n=64, g=1, lhs_dtype="f32", rhs_dtype="f32", out_dtype="bf16"
    )
    ref = jax.random.normal(jax.random.key(0), (256, 64), jnp.float32)
    out = ref.at[100].multiply(1.1).astype(jnp.bfloat16)
    whole_norm_error = float(jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
    assert whole_norm_error < 1e-2  # what the old whole-output norm would have let through
    with pytest.raises(WrongResult, match="worst row"):
        verify.check_output(out, Reference.whole(ref), (256,), problem)


def test_large_outputs_are_checked_on_a_sample_of_rows_that_holds_every_group_edge(monkeypatch):
    monkeypatch.setattr(input_cache, "REFERENCE_MAX_BYTES", 24 * 48 * 4)  # room for 24 of 32 rows
    inputs = Inputs.make(PROBLEM, seed=0)
    cache = InputCache()
    ref = cache.reference(inputs, SIZES)
    rows = ref.rows.tolist()
    assert len(rows) == 24 and rows == sorted(set(rows)) and max(rows) < sum(SIZES)
    assert {0, 9, 10, 21, 22, 27} <= set(rows)  # first and last row of each non-empty group
    lhs, rhs, gs = cache.verify_args(inputs, SIZES)
    full = reference_grouped_matmul(lhs, rhs, gs)
    np.testing.assert_allclose(np.asarray(ref.values), np.asarray(full)[rows], rtol=1e-6, atol=1e-6)
    assert verify.verify(ragged, inputs, cache, [SIZES]) < 1e-2

    # A wrong row that the sample holds fails.
    def wrong_edge_row(lhs, rhs, sizes):
        return ragged(lhs, rhs, sizes).at[21].multiply(2.0)

    with pytest.raises(WrongResult, match="worst row"):
        verify.verify(wrong_edge_row, inputs, cache, [SIZES])


def test_every_draw_of_a_problem_has_one_reference_shape(monkeypatch):
    # One shape per problem: the reference and the check compile once, not once per draw.
    monkeypatch.setattr(input_cache, "REFERENCE_MAX_BYTES", 24 * 48 * 4)
    cache = InputCache()
    inputs = Inputs.make(PROBLEM, seed=0)
    draws = [SIZES, (8, 8, 8, 8), (0, 0, 3, 2), (32, 0, 0, 0)]
    shapes = {cache.reference(inputs, sizes).values.shape for sizes in draws}
    assert shapes == {(24, 48)}
    small = cache.reference(inputs, (0, 0, 3, 2)).rows.tolist()
    assert small == list(range(24))  # the first rows hold every assigned row
    for sizes in draws:
        assert verify.verify(ragged, inputs, cache, [sizes]) < 1e-2
