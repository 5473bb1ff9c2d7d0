"""The one-kernel routing (Pallas Triton) on a CPU: Pallas's interpreter against moe.route and
moe.sort_by_expert, the MoE layer with it, where it applies, and its lowering to Triton for an H200."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.lookup import LOOKUP
from moetune.kernels.moe import layer as moe
from moetune.kernels.moe import routing_kernel

pytestmark = pytest.mark.slow  # the second tier: seconds per case on a CPU


@pytest.fixture(autouse=True)
def no_database():
    with LOOKUP.using_db(None):
        yield


def _xla(logits, top_k, renormalize):
    routing = moe.route(logits, top_k, renormalize)
    rows = moe.sort_by_expert(routing.expert_ids, logits.shape[1])
    return routing.expert_ids, routing.weights, rows.row_token, rows.slot_row, rows.group_sizes


def _assert_same(kernel, xla):
    names = ("expert_ids", "weights", "row_token", "slot_row", "group_sizes")
    for name, got, want in zip(names, kernel, xla, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype, name
        if name == "weights":
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7, err_msg=name)
        else:
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=name)


@pytest.mark.parametrize(
    "tokens, experts, top_k",
    [(1, 8, 2), (5, 8, 2), (32, 8, 2), (3, 6, 3), (7, 16, 1), (21, 3, 3), (64, 4, 1)],
)
@pytest.mark.parametrize("renormalize", [True, False])
def test_interpreted_kernel_equals_the_xla_routing(tokens, experts, top_k, renormalize):
    for seed in range(3):
        logits = jax.random.normal(jax.random.key(seed), (tokens, experts))
        if seed == 2:
            logits = jnp.round(logits * 2) / 2  # many ties: lower expert first, then earlier slot
        kernel = routing_kernel.route_and_sort(logits, top_k, renormalize, interpret=True)
        _assert_same(kernel, _xla(logits, top_k, renormalize))


def test_signed_zeros_infinities_and_nans_order_as_lax_top_k():
    logits = jnp.array(
        [
            [0.0, -0.0, -1.0, 1.0],
            [-0.0, 0.0, -jnp.inf, -jnp.inf],
            [jnp.inf, 1.0, jnp.inf, -1.0],
            [jnp.nan, 1.0, 2.0, -jnp.nan],
        ],
        jnp.float32,
    )
    kernel = routing_kernel.route_and_sort(logits, 2, True, interpret=True)
    xla = _xla(logits, 2, True)
    np.testing.assert_array_equal(np.asarray(kernel[0]), np.asarray(jax.lax.top_k(logits, 2)[1]))
    for got, want in zip(kernel[2:], xla[2:], strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_batches_beyond_one_program_are_refused_and_left_to_xla():
    assert routing_kernel.fits(32, 8, 2) and not routing_kernel.fits(33, 8, 2)
    assert not routing_kernel.fits(1, 32, 2)
    with pytest.raises(ValueError, match="33 tokens x top_k 2 over 8 experts"):
        routing_kernel.route_and_sort(jnp.zeros((33, 8)), 2, True, interpret=True)


def test_moe_layer_routes_through_the_kernel_where_it_fits_and_its_mode_allows(monkeypatch):
    calls = []
    real = routing_kernel.route_and_sort
    monkeypatch.setattr(
        routing_kernel, "route_and_sort", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k)
    )
    ks = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(ks[0], (40, 64), jnp.float32)
    logits = jax.random.normal(ks[1], (40, 8))
    w_gate_up = jax.random.normal(ks[2], (8, 64, 96), jnp.float32) * 0.1
    w_down = jax.random.normal(ks[3], (8, 48, 64), jnp.float32) * 0.1
    outputs = {}
    for mode in ("xla", "interpret", "auto"):
        outputs[mode] = [
            moe.moe_mlp(x[:t], logits[:t], w_gate_up, w_down, top_k=2, routing_mode=mode) for t in (1, 32, 40)
        ]
    # Routing is exact either way, so the layer's outputs are the same bits.
    for mode in ("interpret", "auto"):
        for a, b in zip(outputs["xla"], outputs[mode], strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # 40 tokens x 2 rows is more than one program compares; "auto" on a CPU is XLA's ops.
    assert calls == [(1, 8), (32, 8)] * (2 if jax.default_backend() == "gpu" else 1)


def test_the_routing_mode_is_an_argument_checked_by_name():
    logits = jnp.zeros((2, 8))
    with pytest.raises(
        ConfigInvalid, match="routing_mode='fast'; expected one of auto, kernel, xla, interpret"
    ):
        moe.route_rows(logits, 2, True, routing_mode="fast")
    # "kernel" where the batch does not fit the kernel is XLA's ops, as "auto" is.
    routing, rows = moe.route_rows(jnp.zeros((40, 8)), 2, True, routing_mode="kernel")
    assert rows.group_sizes.shape == (8,) and int(rows.group_sizes.sum()) == 80


def test_kernel_lowers_to_triton_for_an_h200(triton_lowering_for_h200):
    for tokens in (1, 32):
        logits = jax.ShapeDtypeStruct((tokens, 8), jnp.float32)
        route = jax.jit(lambda x: routing_kernel.route_and_sort(x, 2, True))
        text = route.trace(logits).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == 1 and "moetune_routing" in text
