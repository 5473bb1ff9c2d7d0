"""jax.lax.ragged_dot's group_offset (a local slice of experts, expert parallelism) on the xla backend:
the grouped GEMM, the weight gradient and moe_mlp with their gradients against the whole computation,
on every xla strategy; backends that cannot serve a slice decline. The shard_map test on a 4-device CPU
mesh runs in a fresh interpreter (the device count is fixed before jax is imported)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels import call_op, grouped_matmul, moe_mlp
from moetune.kernels.backends.xla.config import XlaConfig
from moetune.kernels.errors import Unsupported
from tests.kernels.test_kernels_subprocess import run_python

pytestmark = pytest.mark.slow  # the second tier: seconds per case on a CPU

G, LOCAL, OFFSET = 6, 2, 3  # the slice holds experts 3 and 4 of 6
SIZES = jnp.asarray([4, 0, 7, 5, 0, 6], jnp.int32)  # 22 real rows; expert 4 is empty
M, K, N = 26, 8, 12  # 4 rows past the groups
CONFIGS = [
    XlaConfig("ragged_dot"),
    XlaConfig("dense_masked"),
    XlaConfig("segments"),
    XlaConfig("chunked", chunk_m=8, items_per_step=2),
]
HIGHEST = jax.lax.Precision.HIGHEST


def _operands(transpose_rhs=False):
    keys = jax.random.split(jax.random.key(0), 3)
    lhs = jax.random.normal(keys[0], (M, K), jnp.float32)
    rhs = jax.random.normal(keys[1], (G, N, K) if transpose_rhs else (G, K, N), jnp.float32) / 3
    dout = jax.random.normal(keys[2], (M, N), jnp.float32)
    return lhs, rhs, dout


def _whole(lhs, rhs, transpose_rhs):
    weights = rhs.transpose(0, 2, 1) if transpose_rhs else rhs
    return jax.lax.ragged_dot(lhs, weights, SIZES, precision=HIGHEST)


def _local_reference(lhs, local_rhs, transpose_rhs):
    """The whole computation with every expert outside the slice zero: what the slice must give."""
    full = jnp.zeros((G, *local_rhs.shape[1:]), local_rhs.dtype).at[OFFSET : OFFSET + LOCAL].set(local_rhs)
    return _whole(lhs, full, transpose_rhs)


@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["kn", "nk"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.strategy)
def test_a_local_slice_of_experts_and_its_gradients_match_the_whole(config, transpose_rhs):
    lhs, rhs, dout = _operands(transpose_rhs)
    local = rhs[OFFSET : OFFSET + LOCAL]
    offset = jnp.asarray([OFFSET], jnp.int32)

    def sliced(a, b):
        return grouped_matmul(a, b, SIZES, transpose_rhs=transpose_rhs, config=config, group_offset=offset)

    out, vjp = jax.vjp(jax.jit(sliced), lhs, local)  # jitted: one program, not one per op
    want, want_vjp = jax.vjp(lambda a, b: _local_reference(a, b, transpose_rhs), lhs, local)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert not np.asarray(out)[:4].any() and not np.asarray(out)[16:].any()  # other experts' rows, tail
    for got, expected in zip(vjp(dout), want_vjp(dout), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    drhs = vjp(dout)[1]
    assert not np.asarray(drhs)[1].any()  # the slice's empty expert gets exactly zero

    # The weight gradient called directly: the slice's experts of the whole weight gradient.
    direct = call_op(
        "grouped_matmul_drhs", lhs, dout, SIZES, transpose_rhs, jnp.float32, config=config,
        group_offset=offset, experts=LOCAL,
    )  # fmt: skip
    _, whole_vjp = jax.vjp(lambda b: _whole(lhs, b, transpose_rhs), rhs)
    np.testing.assert_allclose(direct, whole_vjp(dout)[0][OFFSET : OFFSET + LOCAL], rtol=1e-5, atol=1e-5)


def test_bad_slices_are_refused_with_a_reason():
    lhs, rhs, dout = _operands()
    with pytest.raises(ValueError, match="needs experts="):
        call_op("grouped_matmul_drhs", lhs, dout, SIZES, group_offset=jnp.asarray([1], jnp.int32))
    with pytest.raises(ValueError, match=r"\(1,\) array"):
        grouped_matmul(lhs, rhs[:2], SIZES, group_offset=jnp.asarray([1, 2], jnp.int32))
    with pytest.raises(ValueError, match="G_total >= the 6 local experts"):
        grouped_matmul(lhs, rhs, SIZES[:3], group_offset=jnp.asarray([0], jnp.int32))


def test_a_backend_that_cannot_serve_a_slice_declines_and_the_call_falls_through(probe_backends):
    probe = probe_backends("no_offset", priority=10)
    lhs, rhs, _ = _operands()
    offset = jnp.asarray([OFFSET], jnp.int32)
    local = rhs[OFFSET : OFFSET + LOCAL]
    with pytest.raises(Unsupported, match="takes no group_offset"):
        grouped_matmul(lhs, local, SIZES, backend="no_offset", group_offset=offset)
    out = grouped_matmul(lhs, local, SIZES, group_offset=offset)  # the default chain: on to xla
    np.testing.assert_allclose(out, _local_reference(lhs, local, False), rtol=1e-5, atol=1e-5)
    assert probe.built == []
    grouped_matmul(lhs, rhs, SIZES)  # without a slice the probe serves the call
    assert len(probe.built) == 1


def test_moe_mlp_on_a_slice_of_experts_sums_to_the_whole_layer():
    tokens, hidden, ffn, experts = 10, 8, 6, 4
    keys = jax.random.split(jax.random.key(1), 4)
    x = jax.random.normal(keys[0], (tokens, hidden), jnp.float32)
    logits = jax.random.normal(keys[1], (tokens, experts), jnp.float32)
    w_gate_up = jax.random.normal(keys[2], (experts, hidden, 2 * ffn), jnp.float32) / 3
    w_down = jax.random.normal(keys[3], (experts, ffn, hidden), jnp.float32) / 3

    def layer(w1, w2, offset=None):
        return moe_mlp(x, logits, w1, w2, top_k=2, routing_mode="xla", group_offset=offset)

    def halves(w1, w2):
        return sum(
            layer(w1[e : e + 2], w2[e : e + 2], jnp.asarray([e], jnp.int32)) for e in range(0, experts, 2)
        )

    def out_and_grads(f):
        grads = jax.grad(lambda w1, w2: (f(w1, w2) ** 2).sum(), (0, 1))
        return jax.jit(lambda w1, w2: (f(w1, w2), *grads(w1, w2)))(w_gate_up, w_down)

    for got, want in zip(out_and_grads(halves), out_and_grads(layer), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


EXPERT_PARALLEL = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import moetune.kernels as mk

assert jax.device_count() == 4, jax.devices()
mesh = jax.make_mesh((4,), ("ep",))
G, LOCAL, M, K, N = 8, 2, 64, 16, 8
rng = np.random.default_rng(0)
lhs = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
rhs = jnp.asarray(rng.standard_normal((G, K, N)) / 4, jnp.float32)
# A static receive buffer of 64 rows holding 50 real ones; experts 1 and 5 receive none.
sizes = jnp.asarray([5, 0, 9, 3, 11, 0, 7, 15], jnp.int32)


def sharded(lhs, rhs, sizes):
    def body(lhs, rhs, sizes):
        offset = (jax.lax.axis_index("ep") * LOCAL).reshape(1)
        return jax.lax.psum(mk.grouped_matmul(lhs, rhs, sizes, group_offset=offset), "ep")

    specs = (P(), P("ep"), P())
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=True)(lhs, rhs, sizes)


def whole(lhs, rhs, sizes):
    return jax.lax.ragged_dot(lhs, rhs, sizes, precision=jax.lax.Precision.HIGHEST)


def loss(f, sizes):
    return lambda a, b: (f(a, b, sizes) ** 2).sum()


want, want_grads = whole(lhs, rhs, sizes), jax.grad(loss(whole, sizes), (0, 1))(lhs, rhs)
put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
lhs_s, rhs_s, sizes_s = put(lhs, P()), put(rhs, P("ep")), put(sizes, P())
np.testing.assert_allclose(jax.jit(sharded)(lhs_s, rhs_s, sizes_s), want, rtol=1e-5, atol=1e-5)
grads = jax.jit(jax.grad(loss(sharded, sizes_s), (0, 1)))(lhs_s, rhs_s)
for got, expected in zip(grads, want_grads):
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
print("expert parallel ok")
"""


def test_expert_parallel_shard_map_matches_the_unsharded_computation(tmp_path):
    output = run_python(EXPERT_PARALLEL, tmp_path, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert "expert parallel ok" in output
