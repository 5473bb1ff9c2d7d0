"""Every xla strategy against jax.lax.ragged_dot in float32 (kernels/reference.py), on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moetune.kernels.backends.xla import BACKEND, XlaConfig
from moetune.kernels.backends.xla.config import STRATEGIES
from moetune.kernels.problem import Problem
from moetune.kernels.reference import reference_grouped_matmul, relative_error, tolerance

pytestmark = pytest.mark.slow  # the second tier: seconds per case on a CPU

# Per strategy, the configs exercised: chunked with chunks smaller than, near and larger than M, and
# steps of one item, a few, and more than there are.
CONFIGS = {
    "ragged_dot": [XlaConfig(strategy="ragged_dot")],
    "dense_masked": [XlaConfig(strategy="dense_masked")],
    "segments": [XlaConfig(strategy="segments")],
    "chunked": [
        XlaConfig(strategy="chunked", chunk_m=8, items_per_step=1),
        XlaConfig(strategy="chunked", chunk_m=16, items_per_step=3),
        XlaConfig(strategy="chunked", chunk_m=128, items_per_step=64),
    ],
}
ALL_CONFIGS = [c for configs in CONFIGS.values() for c in configs]


def test_every_strategy_is_exercised():
    assert set(CONFIGS) == set(STRATEGIES)


def _operands(problem: Problem, seed: int):
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.standard_normal((problem.m, problem.k)), problem.lhs_dtype)
    shape = (problem.g, problem.n, problem.k) if problem.transpose_rhs else (problem.g, problem.k, problem.n)
    rhs = jnp.asarray(rng.standard_normal(shape), problem.rhs_dtype)
    return lhs, rhs


def _check(problem: Problem, config: XlaConfig, sizes: list[int], seed: int = 0) -> None:
    lhs, rhs = _operands(problem, seed)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    out = jax.jit(BACKEND.build(problem, config))(lhs, rhs, group_sizes)
    ref = reference_grouped_matmul(lhs, rhs, group_sizes, transpose_rhs=problem.transpose_rhs)
    assert out.shape == (problem.m, problem.n)
    assert out.dtype == jnp.dtype(problem.out_dtype)
    error = relative_error(out, ref)
    assert error < tolerance(problem.out_dtype), f"{config}: relative error {error} for sizes {sizes}"
    # Rows past the last group are exactly zero, as ragged_dot makes them.
    assert not np.any(np.asarray(out[min(sum(sizes), problem.m) :], np.float32))


@st.composite
def cases(draw):
    g = draw(st.sampled_from([1, 2, 3, 8, 64]))
    m = draw(st.sampled_from([1, 5, 37, 130]))  # none a multiple of the chunk sizes above but 1
    dtype = draw(st.sampled_from(["bfloat16", "float16", "float32"]))
    out_dtype = draw(st.sampled_from([dtype, "float32"]))
    problem = Problem(
        "grouped_matmul",
        m=m,
        k=draw(st.sampled_from([8, 24])),
        n=draw(st.sampled_from([8, 16])),
        g=g,
        lhs_dtype=dtype,
        rhs_dtype=dtype,
        out_dtype=out_dtype,
        transpose_rhs=draw(st.booleans()),
    )
    layout = draw(st.sampled_from(["fill", "below_m", "one_group", "empty"]))
    sizes = [0] * g
    if layout == "one_group":
        sizes[draw(st.integers(0, g - 1))] = m
    elif layout != "empty":
        total = m if layout == "fill" else draw(st.integers(0, m - 1))
        cuts = sorted(draw(st.lists(st.integers(0, total), min_size=g - 1, max_size=g - 1)))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
    return problem, sizes, draw(st.integers(0, 2**16))


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), pick=st.integers(0, 2))
def test_strategy_matches_ragged_dot(strategy, case, pick):
    problem, sizes, seed = case
    configs = CONFIGS[strategy]
    _check(problem, configs[pick % len(configs)], sizes, seed)


def _problem(m: int, g: int, *, transpose: bool = False, dtype: str = "float32") -> Problem:
    return Problem(
        "grouped_matmul",
        m=m,
        k=8,
        n=8,
        g=g,
        lhs_dtype=dtype,
        rhs_dtype=dtype,
        out_dtype=dtype,
        transpose_rhs=transpose,
    )


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=str)
@pytest.mark.parametrize(
    "sizes",
    [[37, 0, 0], [0, 37, 0], [0, 0, 37], [0, 0, 0], [5, 0, 20], [30, 30, 30]],
    ids=["all-first", "all-middle", "all-last", "all-empty", "below-m", "past-m-clipped"],
)
def test_group_layouts(config, sizes):
    _check(_problem(37, 3), config, sizes)


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=str)
def test_sixty_four_experts_transposed(config):
    sizes = [0] * 64
    sizes[3], sizes[10], sizes[63] = 9, 1, 20
    _check(_problem(37, 64, transpose=True, dtype="bfloat16"), config, sizes)


def test_mixed_input_dtypes_promote_like_ragged_dot():
    problem = Problem(
        "grouped_matmul", m=9, k=8, n=8, g=2, lhs_dtype="bfloat16", rhs_dtype="float32", out_dtype="float32"
    )
    for config in ALL_CONFIGS:
        _check(problem, config, [4, 5])
