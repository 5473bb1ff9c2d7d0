"""moetune.kernels.recording: the dispatch decisions of a block, as a model's trace makes them."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from moetune.kernels import grouped_matmul, recording


def _operands():
    lhs = jnp.ones((16, 64), jnp.bfloat16)
    rhs = jnp.ones((4, 64, 128), jnp.bfloat16)
    return lhs, rhs, jnp.array([4, 4, 8, 0], jnp.int32)


def test_a_gradient_records_the_forward_and_both_cotangent_ops_in_order():
    lhs, rhs, sizes = _operands()
    step = jax.jit(jax.grad(lambda x, w: grouped_matmul(x, w, sizes).astype(jnp.float32).sum(), (0, 1)))
    with recording() as calls:
        jax.block_until_ready(step(lhs, rhs))
    assert [c.problem.op for c in calls] == ["grouped_matmul", "grouped_matmul", "grouped_matmul_drhs"]
    assert [c.problem.transpose_rhs for c in calls] == [False, True, False]  # dlhs: the other layout
    assert all(c.backend == "xla" for c in calls)  # no GPU here
    with recording() as again:
        jax.block_until_ready(step(lhs, rhs))  # compiled: nothing is dispatched again
    assert again == []


def test_recordings_nest_and_record_nothing_outside_their_block():
    lhs, rhs, sizes = _operands()
    with recording() as outer:
        grouped_matmul(lhs, rhs, sizes)
        with recording() as inner:
            grouped_matmul(lhs[:8], rhs, jnp.array([2, 2, 4, 0], jnp.int32))
    grouped_matmul(lhs, rhs, sizes)
    assert [c.problem.m for c in outer] == [16, 8] and [c.problem.m for c in inner] == [8]
