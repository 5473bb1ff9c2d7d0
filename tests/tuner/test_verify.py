"""The candidate check: poisoned output buffers, zero rows past the groups, NaN, tolerance by dtype."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.errors import WrongResult
from moetune.kernels.problem import Problem
from moetune.kernels.reference import reference_grouped_matmul
from moetune.tuner import verify

PROBLEM = Problem(
    "grouped_matmul", m=32, k=64, n=48, g=4, lhs_dtype="bf16", rhs_dtype="bf16", out_dtype="bf16"
)
SIZES = (10, 0, 12, 6)  # 28 rows assigned, 4 rows of padding


@pytest.fixture(scope="module")
def inputs():
    return verify.Inputs.make(PROBLEM, seed=0)


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
    cache = verify.InputCache()
    error = verify.verify(ragged, inputs, cache, [SIZES, (8, 8, 8, 8)])
    assert 0 <= error < 1e-2


def test_nonzero_rows_past_the_groups_fail(inputs):
    lhs, rhs, gs = inputs.arg_sets(SIZES)[0]
    good = ragged(lhs, rhs, gs)
    ref = reference_grouped_matmul(lhs, rhs, gs)
    assert verify.check_output(good, ref, SIZES, PROBLEM) < 1e-2
    with pytest.raises(WrongResult, match="rows past sum"):
        verify.check_output(good.at[30].set(1), ref, SIZES, PROBLEM)
    with pytest.raises(WrongResult, match="rows past sum"):
        verify.check_output(good.at[31, 2].set(jnp.nan), ref, SIZES, PROBLEM)


def test_nan_never_passes_and_errors_beyond_tolerance_fail(inputs):
    lhs, rhs, gs = inputs.arg_sets(SIZES)[0]
    good = ragged(lhs, rhs, gs)
    ref = reference_grouped_matmul(lhs, rhs, gs)
    with pytest.raises(WrongResult, match="NaN"):
        verify.check_output(good.at[3, 3].set(jnp.nan), ref, SIZES, PROBLEM)
    with pytest.raises(WrongResult, match="exceeds the bfloat16 tolerance"):
        verify.check_output(good * 1.05, ref, SIZES, PROBLEM)
    with pytest.raises(WrongResult, match="shape"):
        verify.check_output(good[:16], ref, SIZES, PROBLEM)
    with pytest.raises(WrongResult, match="dtype"):
        verify.check_output(good.astype(jnp.float32), ref, SIZES, PROBLEM)


def test_a_kernel_that_skips_rows_is_caught_on_some_draw(inputs):
    # Forgets the last expert's rows entirely (leaves them zero): wrong on any draw where it has rows.
    def skips_last_group(lhs, rhs, sizes):
        return ragged(lhs, rhs, sizes.at[-1].set(0))

    with pytest.raises(WrongResult):
        verify.verify(skips_last_group, inputs, verify.InputCache(), [SIZES])


def test_poisoned_call_returns_the_kernels_output():
    out = verify.poisoned_call(lambda x: x + 1, (jnp.zeros(4),), (4,), jnp.float32)
    assert out.tolist() == [1, 1, 1, 1]


def test_input_cache_keeps_one_problem(inputs):
    cache = verify.InputCache()
    a = cache.inputs(PROBLEM, 0)
    assert cache.inputs(PROBLEM, 0) is a
    ref = cache.reference(a, SIZES)
    assert cache.reference(a, SIZES) is ref
    other = Problem("grouped_matmul", m=8, k=64, n=48, g=4)
    assert cache.inputs(other, 0) is not a
    assert cache.inputs(PROBLEM, 0) is not a


def test_input_cache_drops_inputs_over_its_byte_bound():
    small = verify.InputCache()
    a = small.inputs(PROBLEM, 0)
    small.reference(a, SIZES)
    assert 0 < small.nbytes < small.max_bytes
    small.trim()
    assert small.inputs(PROBLEM, 0) is a  # kept
    tight = verify.InputCache(max_bytes=1024)
    b = tight.inputs(PROBLEM, 0)
    tight.trim()
    assert tight.nbytes == 0 and tight.inputs(PROBLEM, 0) is not b
