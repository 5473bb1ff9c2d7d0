"""Gradients of the dispatched grouped_matmul and of its gated ops on the CPU (xla backend): their custom
VJP against jax's own gradient of jax.lax.ragged_dot (and the activation), and that each cotangent is its
own Problem, looked up under its own key."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from moetune.kernels import call_op, grouped_matmul, grouped_matmul_swiglu
from moetune.kernels.api import explain
from moetune.kernels.backends.xla.config import STRATEGIES, XlaConfig
from moetune.kernels.errors import Unsupported
from moetune.kernels.moe.reference import gated_activation
from moetune.kernels.ops.spec import TOLERANCE
from moetune.kernels.reference import relative_error

pytestmark = pytest.mark.slow  # the second tier: seconds per case on a CPU

# (m, k, n, group sizes): an empty expert, rows past the groups, one expert holding every row.
SHAPES = [
    (40, 16, 24, [10, 0, 21, 4]),
    (33, 8, 40, [0, 33, 0]),
    (64, 32, 16, [7, 9, 0, 11, 5, 0]),
    (24, 24, 8, [0, 0]),
]


def _operands(m, k, n, g, transpose_rhs, dtype, seed=0):
    key_l, key_r, key_d = jax.random.split(jax.random.key(seed), 3)
    lhs = jax.random.normal(key_l, (m, k), jnp.float32).astype(dtype)
    rhs = (jax.random.normal(key_r, (g, n, k) if transpose_rhs else (g, k, n)) / np.sqrt(k)).astype(dtype)
    dout = jax.random.normal(key_d, (m, n), jnp.float32).astype(dtype)
    return lhs, rhs, dout


def _ragged_dot(lhs, rhs, sizes, transpose_rhs):
    weights = rhs.transpose(0, 2, 1) if transpose_rhs else rhs
    return jax.lax.ragged_dot(lhs, weights, sizes, precision=jax.lax.Precision.HIGHEST)


def _reference_cotangents(lhs, rhs, dout, sizes, transpose_rhs):
    """jax's gradient of ragged_dot in float32."""
    f32 = [x.astype(jnp.float32) for x in (lhs, rhs, dout)]
    _, vjp = jax.vjp(lambda a, b: _ragged_dot(a, b, sizes, transpose_rhs), f32[0], f32[1])
    return vjp(f32[2])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["kn", "nk"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"m{s[0]}k{s[1]}n{s[2]}g{len(s[3])}")
def test_gradients_match_jax_grad_of_ragged_dot(shape, transpose_rhs, dtype):
    m, k, n, group_sizes = shape
    sizes = jnp.asarray(group_sizes, jnp.int32)
    lhs, rhs, dout = _operands(m, k, n, len(group_sizes), transpose_rhs, dtype)
    _, vjp = jax.vjp(lambda a, b: grouped_matmul(a, b, sizes, transpose_rhs=transpose_rhs), lhs, rhs)
    dlhs, drhs = vjp(dout)
    want_dlhs, want_drhs = _reference_cotangents(lhs, rhs, dout, sizes, transpose_rhs)
    for got, want, primal in ((dlhs, want_dlhs, lhs), (drhs, want_drhs, rhs)):
        assert got.shape == primal.shape and got.dtype == primal.dtype
        assert relative_error(got, want) <= TOLERANCE[dtype]
    assigned = min(sum(group_sizes), m)
    assert not np.any(np.asarray(dlhs[assigned:], np.float32)), "rows past the groups get a gradient"
    empty = np.asarray(group_sizes) == 0
    assert not np.any(np.asarray(drhs, np.float32)[empty]), "an expert with no rows gets a gradient"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_xla_strategy_of_the_forward_differentiates_alike(strategy):
    lhs, rhs, dout = _operands(40, 16, 24, 4, False, jnp.float32)
    sizes = jnp.asarray([10, 0, 21, 4], jnp.int32)
    config = XlaConfig(strategy=strategy, chunk_m=16 if strategy == "chunked" else 128)
    _, vjp = jax.vjp(lambda a, b: grouped_matmul(a, b, sizes, config=config), lhs, rhs)
    for got, want in zip(vjp(dout), _reference_cotangents(lhs, rhs, dout, sizes, False), strict=True):
        assert relative_error(got, want) <= TOLERANCE["float32"]


@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["kn", "nk"])
def test_check_grads_reverse_mode(transpose_rhs):
    lhs, rhs, _ = _operands(24, 8, 16, 3, transpose_rhs, jnp.float32, seed=3)
    sizes = jnp.asarray([9, 0, 11], jnp.int32)

    def f(a, b):
        return grouped_matmul(a, b, sizes, transpose_rhs=transpose_rhs, backend="xla")

    check_grads(f, (lhs, rhs), order=1, modes=["rev"], atol=1e-3, rtol=1e-3)


def test_an_expert_with_no_rows_gets_an_exactly_zero_weight_gradient():
    lhs, rhs, _ = _operands(16, 8, 8, 3, False, jnp.bfloat16)
    sizes = jnp.asarray([6, 0, 10], jnp.int32)
    drhs = jax.grad(lambda b: grouped_matmul(lhs, b, sizes).astype(jnp.float32).sum())(rhs)
    assert np.all(np.asarray(drhs[1], np.float32) == 0.0)
    assert np.all(np.asarray(drhs[0], np.float32) != 0.0) and np.all(np.asarray(drhs[2], np.float32) != 0.0)


def test_group_sizes_get_no_gradient_and_jit_traces_the_backward():
    lhs, rhs, dout = _operands(20, 8, 8, 2, False, jnp.float32)
    sizes = jnp.asarray([12, 5], jnp.int32)
    _, vjp = jax.vjp(lambda a, b, s: grouped_matmul(a, b, s), lhs, rhs, sizes)
    _, _, dsizes = vjp(dout)
    assert dsizes.dtype == jax.dtypes.float0 and dsizes.shape == sizes.shape
    loss = jax.jit(jax.grad(lambda a, b: (grouped_matmul(a, b, sizes) ** 2).sum(), argnums=(0, 1)))
    dlhs, _ = loss(lhs, rhs)
    assert not np.any(np.asarray(dlhs[17:])) and np.all(np.any(np.asarray(dlhs[:17]) != 0, axis=1))


def test_lhs_rows_past_m_get_a_zero_gradient():
    # `rows=`: lhs carries padding rows past M that belong to no group (NaN here, and must stay unread).
    lhs, rhs, dout = _operands(20, 8, 8, 2, False, jnp.float32)
    padded = jnp.concatenate([lhs, jnp.full((12, 8), jnp.nan, lhs.dtype)])
    sizes = jnp.asarray([12, 6], jnp.int32)
    _, vjp = jax.vjp(lambda a, b: grouped_matmul(a, b, sizes, rows=20), padded, rhs)
    dlhs, drhs = vjp(dout)
    want_dlhs, want_drhs = _reference_cotangents(lhs, rhs, dout, sizes, False)
    assert dlhs.shape == padded.shape and not np.any(np.asarray(dlhs[18:]))
    assert relative_error(dlhs[:20], want_dlhs) <= TOLERANCE["float32"]
    assert relative_error(drhs, want_drhs) <= TOLERANCE["float32"]


@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["kn", "nk"])
def test_the_backward_looks_up_its_own_problems(caplog, transpose_rhs):
    lhs, rhs, _ = _operands(40, 16, 24, 4, transpose_rhs, jnp.bfloat16)
    sizes = jnp.asarray([10, 0, 21, 4], jnp.int32)
    with caplog.at_level(logging.DEBUG, logger="moetune.kernels.api"):
        jax.grad(lambda a, b: grouped_matmul(a, b, sizes, transpose_rhs=transpose_rhs).sum(), (0, 1))(
            lhs, rhs
        )
    looked_up = [r.args[0] for r in caplog.records if r.name == "moetune.kernels.api"]
    t = int(transpose_rhs)
    dims = "g=4,lhs=bfloat16,rhs=bfloat16,out=bfloat16"
    forward = f"grouped_matmul/m=40,k=16,n=24,{dims},t={t}/v1"
    dlhs = f"grouped_matmul/m=40,k=24,n=16,{dims},t={1 - t}/v1"
    drhs = f"grouped_matmul_drhs/m=40,k=16,n=24,{dims},t={t}/v1"
    assert looked_up == [forward, dlhs, drhs]
    # explain asked of the weight gradient's operands names the same key.
    dout = jax.ShapeDtypeStruct((40, 24), jnp.bfloat16)
    told = explain(lhs, dout, sizes, transpose_rhs=transpose_rhs, op="grouped_matmul_drhs")
    assert told.problem.key == drhs and told.backend == "xla"


def test_a_named_backend_serving_only_the_forward_refuses_the_weight_gradient(probe_backends):
    probe = probe_backends("fwd_only", priority=10)
    # k == n: the probe's ragged_dot ignores the layout, so the dlhs call keeps its shapes.
    lhs, rhs, dout = _operands(16, 8, 8, 2, False, jnp.float32)
    sizes = jnp.asarray([10, 6], jnp.int32)
    with pytest.raises(Unsupported, match="grouped_matmul_drhs"):
        jax.vjp(lambda b: grouped_matmul(lhs, b, sizes, backend="fwd_only"), rhs)[1](dout)
    _, vjp = jax.vjp(lambda b: grouped_matmul(lhs, b, sizes, backend="fwd_only", fallback=True), rhs)
    (drhs,) = vjp(dout)
    assert [p.op for p, _ in probe.built][-2:] == ["grouped_matmul", "grouped_matmul"]
    assert relative_error(drhs, _reference_cotangents(lhs, rhs, dout, sizes, False)[1]) <= 1e-5


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["kn", "nk"])
@pytest.mark.parametrize("op", ["grouped_matmul_swiglu", "grouped_matmul_geglu"])
def test_gated_gradients_match_jax_grad_of_the_unfused_reference(op, transpose_rhs, dtype):
    activation = op.rsplit("_", 1)[1]
    lhs, rhs, _ = _operands(40, 16, 48, 4, transpose_rhs, dtype)
    dout = jax.random.normal(jax.random.key(5), (40, 24), jnp.float32).astype(dtype)
    sizes = jnp.asarray([10, 0, 21, 4], jnp.int32)
    _, vjp = jax.vjp(lambda a, b: call_op(op, a, b, sizes, transpose_rhs), lhs, rhs)
    dlhs, drhs = vjp(dout)

    def reference(a, b):
        return gated_activation(activation, _ragged_dot(a, b, sizes, transpose_rhs))

    f32 = [x.astype(jnp.float32) for x in (lhs, rhs, dout)]
    _, reference_vjp = jax.vjp(reference, f32[0], f32[1])
    for got, want, primal in zip((dlhs, drhs), reference_vjp(f32[2]), (lhs, rhs), strict=True):
        assert got.shape == primal.shape and got.dtype == primal.dtype
        assert relative_error(got, want) <= TOLERANCE[dtype]
    assert not np.any(np.asarray(dlhs[35:], np.float32)) and not np.any(np.asarray(drhs[1], np.float32))


def test_swiglu_backward_recomputes_its_product_as_a_problem_of_its_own(caplog):
    lhs, rhs, _ = _operands(40, 16, 48, 4, False, jnp.bfloat16)
    sizes = jnp.asarray([10, 0, 21, 4], jnp.int32)
    with caplog.at_level(logging.DEBUG, logger="moetune.kernels.api"):
        jax.grad(lambda a, b: grouped_matmul_swiglu(a, b, sizes).astype(jnp.float32).sum(), (0, 1))(lhs, rhs)
    looked_up = [r.args[0] for r in caplog.records if r.name == "moetune.kernels.api"]
    dtypes = "lhs=bfloat16,rhs=bfloat16"
    assert looked_up == [
        f"grouped_matmul_swiglu/m=40,k=16,n=48,g=4,{dtypes},out=bfloat16,t=0/v1",
        f"grouped_matmul/m=40,k=16,n=48,g=4,{dtypes},out=float32,t=0/v1",  # the product h, recomputed
        f"grouped_matmul/m=40,k=48,n=16,g=4,{dtypes},out=bfloat16,t=1/v1",
        f"grouped_matmul_drhs/m=40,k=16,n=48,g=4,{dtypes},out=bfloat16,t=0/v1",
    ]


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_moe_mlp_differentiates_like_its_dense_reference(fuse):
    from moetune.kernels.moe import moe_mlp, moe_mlp_reference

    keys = jax.random.split(jax.random.key(11), 4)
    tokens, hidden, experts, ffn = 24, 16, 4, 8
    x = jax.random.normal(keys[0], (tokens, hidden))
    logits = jax.random.normal(keys[1], (tokens, experts))
    w_gate_up = jax.random.normal(keys[2], (experts, hidden, 2 * ffn)) / 4
    w_down = jax.random.normal(keys[3], (experts, ffn, hidden)) / 3

    def loss(layer, **options):
        return lambda *args: (layer(*args, top_k=2, **options) ** 2).sum()

    arguments = (x, logits, w_gate_up, w_down)
    got = jax.grad(loss(moe_mlp, fuse=fuse), argnums=(0, 1, 2, 3))(*arguments)
    want = jax.grad(loss(moe_mlp_reference), argnums=(0, 1, 2, 3))(*arguments)
    for name, a, b in zip(("x", "router_logits", "w_gate_up", "w_down"), got, want, strict=True):
        assert relative_error(a, b) <= TOLERANCE["float32"], name
