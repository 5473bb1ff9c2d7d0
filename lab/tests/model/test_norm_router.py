"""The MoE block's RMSNorm + router kernel (Pallas Triton) on a CPU: Pallas's interpreter against the
model's XLA ops, the model's decode with it, and its lowering to Triton for an H200."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.lookup import LOOKUP
from moetune.kernels.moe import layer as moe
from moetune_lab.model import mixtral, norm_router


@pytest.fixture(autouse=True)
def no_database():
    with LOOKUP.using_db(None):
        yield


def _inputs(tokens, hidden, experts, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    x = (jax.random.normal(ks[0], (tokens, hidden)) * 3).astype(dtype)
    weight = (1 + 0.1 * jax.random.normal(ks[1], (hidden,))).astype(dtype)
    router = (jax.random.normal(ks[2], (hidden, experts)) * hidden**-0.5).astype(dtype)
    return x, weight, router


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tokens, hidden, experts", [(1, 64, 8), (5, 96, 6), (64, 128, 16)])
def test_interpreted_kernel_equals_the_model_ops(dtype, tokens, hidden, experts):
    x, weight, router = _inputs(tokens, hidden, experts, jnp.dtype(dtype))
    h, logits = norm_router.norm_and_router(x, weight, router, 1e-5, interpret=True)
    want_h = mixtral.rms_norm(x, weight, 1e-5)
    want_logits = jnp.dot(want_h, router, preferred_element_type=jnp.float32)
    assert h.dtype == x.dtype and logits.dtype == jnp.float32
    # The normed rows round to the same values but for a last-bit flip where the float32 sums' orders
    # differ; the logits are float32 dots of those rows.
    np.testing.assert_allclose(
        np.asarray(h, np.float32), np.asarray(want_h, np.float32), rtol=1e-2 if dtype == "bfloat16" else 1e-6
    )
    tolerance = 2e-2 if dtype == "bfloat16" else 1e-5
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want_logits), rtol=tolerance, atol=tolerance)


def test_a_float32_stream_leaves_in_the_weights_dtype_with_the_rounded_rows_logits():
    """out_dtype: the rows the fused decode block takes from a float32 residual stream, as norm_route_gather
    gives them (the norm in float32, rounded once; the logits of the rounded row)."""
    x, weight, router = _inputs(3, 64, 8, jnp.float32)
    h, logits = norm_router.norm_and_router(x, weight, router, 1e-5, out_dtype=jnp.bfloat16, interpret=True)
    want_h = mixtral.rms_norm(x, weight, 1e-5).astype(jnp.bfloat16)
    assert h.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(h, np.float32), np.asarray(want_h, np.float32), rtol=1e-2)
    want_logits = jnp.dot(h.astype(jnp.float32), router, precision="highest")
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want_logits), rtol=1e-5, atol=1e-5)


def test_bad_shapes_and_prefill_batches_are_refused():
    x, weight, router = _inputs(65, 64, 8, jnp.float32)
    assert norm_router.fits(64, 8) and not norm_router.fits(65, 8)
    assert not norm_router.fits(1, norm_router.MAX_EXPERTS + 1)  # a router too wide for one program
    with pytest.raises(ValueError, match=r"x \(65, 64\)"):
        norm_router.norm_and_router(x, weight, router, 1e-5, interpret=True)
    with pytest.raises(ValueError, match=r"router \(32, 8\)"):
        norm_router.norm_and_router(x[:1], weight, router[:32], 1e-5, interpret=True)


def test_model_decoding_with_the_interpreted_kernel_matches_the_xla_ops(assert_decode_same_across_modes):
    assert_decode_same_across_modes("norm_router", ("xla", "interpret"))


def test_mixtral_shapes_lower_to_triton_for_an_h200(triton_lowering_for_h200):
    spec, bf16 = jax.ShapeDtypeStruct, jnp.bfloat16
    fn = jax.jit(lambda x, w, r: norm_router.norm_and_router(x, w, r, 1e-5))
    for tokens in (1, 32):
        args = (spec((tokens, 4096), bf16), spec((4096,), bf16), spec((4096, 8), bf16))
        text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == 1 and "moetune_norm_router" in text


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tokens, hidden, experts, top_k", [(1, 64, 8, 2), (3, 96, 6, 2), (8, 128, 16, 1)])
def test_interpreted_gather_kernel_equals_the_kernels_and_ops_it_replaces(
    dtype, tokens, hidden, experts, top_k
):
    """norm_and_router, then moe.route_rows and the gather of the normed rows in expert order."""
    x, weight, router = _inputs(tokens, hidden, experts, jnp.dtype(dtype), seed=tokens)
    rows = tokens * top_k
    permuted, ids, weights, row_token, slot_row, sizes = norm_router.norm_route_gather(
        x, weight, router, 1e-5, top_k=top_k, renormalize=True, rows_out=rows + 5, interpret=True
    )
    h, logits = norm_router.norm_and_router(x, weight, router, 1e-5, interpret=True)
    routing, sorted_rows = moe.route_rows(logits, top_k, True)
    assert permuted.shape == (rows + 5, hidden) and permuted.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(permuted[:rows]), np.asarray(h[sorted_rows.row_token]))
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(routing.expert_ids))
    np.testing.assert_allclose(np.asarray(weights), np.asarray(routing.weights), rtol=1e-6)
    for got, want in ((row_token, sorted_rows.row_token), (slot_row, sorted_rows.slot_row)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(sizes), np.asarray(sorted_rows.group_sizes))


def test_the_gather_kernel_refuses_what_one_program_cannot_hold():
    x, weight, router = _inputs(5, 64, 8, jnp.float32)
    assert norm_router.fits_gather(4, 8, 2) and not norm_router.fits_gather(5, 8, 2)
    assert not norm_router.fits_gather(1, 32, 2)  # beyond routing_kernel's experts
    kw = dict(top_k=2, renormalize=True, interpret=True)
    with pytest.raises(ValueError, match=r"x \(5, 64\)"):
        norm_router.norm_route_gather(x, weight, router, 1e-5, rows_out=16, **kw)
    with pytest.raises(ValueError, match="rows_out=1 is fewer than the 2 rows"):
        norm_router.norm_route_gather(x[:1], weight, router, 1e-5, rows_out=1, **kw)


def test_model_decoding_with_the_interpreted_gather_kernel_matches_the_xla_ops(
    assert_decode_same_across_modes,
):
    assert_decode_same_across_modes("norm_route_gather", ("xla", "interpret"))


def test_the_gather_kernel_lowers_to_triton_for_an_h200_at_mixtral_shapes(triton_lowering_for_h200):
    spec, bf16 = jax.ShapeDtypeStruct, jnp.bfloat16
    fn = jax.jit(
        lambda x, w, r: norm_router.norm_route_gather(
            x, w, r, 1e-5, top_k=2, renormalize=True, rows_out=moe.permuted_rows(2)
        )
    )
    for tokens in (1, 4):
        args = (spec((tokens, 4096), bf16), spec((4096,), bf16), spec((4096, 8), bf16))
        text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == 1 and "moetune_norm_route_gather" in text
