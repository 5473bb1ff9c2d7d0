"""The weight-gradient kernel on a Hopper GPU: random shapes, routings and configs from its whole space
(both weight layouts, empty experts, half-full buffers, a local slice of experts), and the gradient of
the public grouped_matmul with its weight gradient served by mosaic_gpu."""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels import call_op, explain, grouped_matmul, registry
from moetune.kernels.backends.mosaic_gpu import space_drhs as space
from moetune.kernels.device import current_fingerprint
from moetune.kernels.problem import Problem
from moetune.kernels.reference import relative_error

pytestmark = pytest.mark.gpu
BACKEND = registry.get("mosaic_gpu")


def _expected(lhs, dout, sizes, transpose, row_start=0):
    lhs64, dout64 = np.asarray(lhs, np.float64), np.asarray(dout, np.float64)
    bounds = row_start + np.concatenate([[0], np.cumsum(sizes)])
    out = np.stack([lhs64[a:b].T @ dout64[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    return out.transpose(0, 2, 1) if transpose else out


def _case(seed):
    rng = random.Random(seed)
    g = rng.choice([1, 4, 8, 32, 128])
    k, n = rng.choice([128, 256, 512]), rng.choice([128, 384, 768])
    m = rng.choice([64, 200, 1000, 4096])
    real = rng.choice([m, m // 2, m - 7])  # exact, a half-full buffer, a few rows short
    cuts = sorted(rng.randint(0, real) for _ in range(g - 1))
    sizes = np.diff([0, *cuts, real]).tolist()
    return m, k, n, sizes, rng.random() < 0.5, rng


@pytest.mark.parametrize("seed", range(12))
def test_random_shapes_and_configs_match_each_expert_s_own_rows(seed):
    m, k, n, sizes, transpose, rng = _case(seed)
    problem = Problem(
        "grouped_matmul_drhs", m, k, n, len(sizes), out_dtype="float32", transpose_rhs=transpose
    )
    device = current_fingerprint()
    configs, _ = BACKEND.search_space(problem, device).enumerate(problem, device)
    chosen = [BACKEND.heuristic(problem, device), *rng.sample(configs, min(3, len(configs)))]
    kl, kd = jax.random.split(jax.random.key(seed))
    lhs = jax.random.normal(kl, (m, k), jnp.bfloat16)
    dout = jax.random.normal(kd, (m, n), jnp.bfloat16)
    want = _expected(lhs, dout, sizes, transpose)
    gs = jnp.asarray(sizes, jnp.int32)
    for config in dict.fromkeys(chosen):
        out = np.asarray(jax.jit(BACKEND.build(problem, config))(lhs, dout, gs))
        assert relative_error(out, want) < 1e-4, (problem.key, config)
        assert not out[np.asarray(sizes) == 0].any(), (problem.key, config)


def test_a_local_slice_of_experts_runs_on_mosaic_from_its_first_row():
    m, k, n, total = 1024, 256, 512, [100, 50, 0, 300, 200, 74]
    kl, kd = jax.random.split(jax.random.key(5))
    lhs = jax.random.normal(kl, (m, k), jnp.bfloat16)
    dout = jax.random.normal(kd, (m, n), jnp.bfloat16)
    offset = jnp.asarray([2], jnp.int32)
    out = call_op(
        "grouped_matmul_drhs", lhs, dout, jnp.asarray(total, jnp.int32), group_offset=offset, experts=3,
        backend="mosaic_gpu", preferred_element_type=jnp.float32,
    )  # fmt: skip
    want = _expected(lhs, dout, total[2:5], False, row_start=150)
    assert relative_error(np.asarray(out), want) < 1e-4


def test_the_gradient_of_grouped_matmul_takes_its_weight_gradient_from_mosaic():
    m, k, n, sizes = 2048, 512, 768, [600, 0, 900, 300, 100]
    problem = Problem("grouped_matmul_drhs", m, k, n, len(sizes))
    assert explain(problem).backend == "mosaic_gpu"
    kl, kr = jax.random.split(jax.random.key(9))
    lhs = jax.random.normal(kl, (m, k), jnp.bfloat16)
    rhs = (jax.random.normal(kr, (len(sizes), k, n), jnp.float32) * 0.05).astype(jnp.bfloat16)
    gs = jnp.asarray(sizes, jnp.int32)

    def loss(a, b, f):
        return jnp.sum(f(a, b, gs).astype(jnp.float32) ** 2)

    got = jax.grad(loss, argnums=(0, 1))(lhs, rhs, grouped_matmul)
    ragged = lambda a, b, s: jax.lax.ragged_dot(a, b, s, preferred_element_type=jnp.float32)  # noqa: E731
    want = jax.grad(loss, argnums=(0, 1))(lhs.astype(jnp.float32), rhs.astype(jnp.float32), ragged)
    for name, g, w in zip(("dlhs", "drhs"), got, want, strict=True):
        assert relative_error(g, w) < 2e-2, name
    assert not np.asarray(got[1][1], np.float32).any()  # the expert with no rows


def test_the_cost_model_ranks_the_space_it_is_given():
    problem = Problem("grouped_matmul_drhs", 32768, 2048, 1536, 128)
    ranked = space.ranking(problem, current_fingerprint())
    assert ranked and ranked[0][0] == BACKEND.heuristic(problem, current_fingerprint())
