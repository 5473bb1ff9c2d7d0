"""The op "grouped_matmul_swiglu" on the CPU: its Problem key, its reference, the xla backend's plain
fallback, and dispatch through the public API (explain, lookup keys)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels import grouped_matmul, grouped_matmul_swiglu
from moetune.kernels.api import explain, problem_of
from moetune.kernels.backends.xla.config import STRATEGIES, XlaConfig
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe.reference import gated_activation
from moetune.kernels.problem import Problem
from moetune.kernels.reference import reference_grouped_matmul, reference_of, relative_error

SIZES = [5, 0, 9, 3]  # an empty expert, and 3 rows past the last group (M = 20)


def _operands(m=20, k=32, n=96, transpose=False, dtype=jnp.float32):
    key_l, key_r = jax.random.split(jax.random.key(m * n))
    lhs = jax.random.normal(key_l, (m, k), dtype)
    g = len(SIZES)
    rhs = jax.random.normal(key_r, (g, n, k) if transpose else (g, k, n), dtype) / np.sqrt(k)
    return lhs, rhs.astype(dtype), jnp.asarray(SIZES, jnp.int32)


def test_problem_output_is_half_of_n_and_n_must_be_even():
    problem = Problem("grouped_matmul_swiglu", m=20, k=32, n=96, g=4)
    assert problem.out_n == 48 and problem.flops == 2 * 20 * 32 * 96
    assert problem.key.startswith("grouped_matmul_swiglu/m=20,k=32,n=96,g=4,")
    assert dataclasses.replace(problem, op="grouped_matmul").out_n == 96
    with pytest.raises(ConfigInvalid, match="even n"):
        Problem("grouped_matmul_swiglu", m=20, k=32, n=95, g=4)


@pytest.mark.parametrize("transpose", [False, True])
def test_reference_is_silu_of_gate_columns_times_up_columns(transpose):
    lhs, rhs, sizes = _operands(transpose=transpose)
    problem = problem_of(lhs, rhs, sizes, transpose_rhs=transpose, op="grouped_matmul_swiglu")
    out = np.asarray(reference_of(problem)(lhs, rhs, sizes))
    product = np.asarray(reference_grouped_matmul(lhs, rhs, sizes, transpose_rhs=transpose))
    gate, up = product[:, :48], product[:, 48:]
    np.testing.assert_allclose(out, gate / (1 + np.exp(-gate)) * up, rtol=1e-5, atol=1e-6)
    assert not out[17:].any()
    plain = dataclasses.replace(problem, op="grouped_matmul")
    np.testing.assert_array_equal(reference_of(plain)(lhs, rhs, sizes), product)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("transpose", [False, True])
def test_xla_fallback_matches_the_reference_for_every_strategy(strategy, transpose):
    lhs, rhs, sizes = _operands(transpose=transpose)
    config = XlaConfig(strategy=strategy, chunk_m=8, items_per_step=2)
    out = jax.jit(
        lambda *a: grouped_matmul_swiglu(*a, transpose_rhs=transpose, backend="xla", config=config)
    )(lhs, rhs, sizes)
    problem = problem_of(lhs, rhs, sizes, transpose_rhs=transpose, op="grouped_matmul_swiglu")
    assert out.shape == (20, 48) and out.dtype == jnp.float32
    assert relative_error(out, reference_of(problem)(lhs, rhs, sizes)) < 1e-5


def test_bf16_fused_op_is_the_unfused_path_within_bf16_rounding():
    lhs, rhs, sizes = _operands(dtype=jnp.bfloat16)
    fused = grouped_matmul_swiglu(lhs, rhs, sizes, backend="xla")
    unfused = gated_activation("swiglu", grouped_matmul(lhs, rhs, sizes, backend="xla"))
    assert fused.dtype == jnp.bfloat16
    assert 0 < relative_error(fused.astype(jnp.float32), unfused.astype(jnp.float32)) < 1e-2


def test_explain_and_dispatch_use_the_op_key():
    lhs, rhs, sizes = _operands()
    explanation = explain(lhs, rhs, sizes, op="grouped_matmul_swiglu", backend="xla")
    assert explanation.problem.op == "grouped_matmul_swiglu"
    assert explanation.to_dict()["problem"].startswith("grouped_matmul_swiglu/m=20,k=32,n=96,")
    assert explanation.backend == "xla" and not explanation.declined
    assert explain(explanation.problem, backend="xla").problem == explanation.problem


def test_odd_n_is_refused_with_the_shape():
    lhs, rhs, sizes = _operands(n=95)
    with pytest.raises(ValueError, match="even n"):
        grouped_matmul_swiglu(lhs, rhs, sizes)
