"""The MoE block's RMSNorm + router kernel compiled by Triton on a Hopper GPU, at Mixtral-8x7B's shapes,
against the model's XLA ops.

Skipped without one (tests/gpu/conftest.py). On the GPU machine:
    python3 -m pytest tests/gpu/test_norm_router_gpu.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.moe import layer as moe
from moetune_lab.model import mixtral, norm_router

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tokens", [1, 4, 64])
def test_compiled_kernel_matches_the_model_ops_at_mixtral_shapes(tokens):
    ks = jax.random.split(jax.random.key(tokens), 3)
    x = (jax.random.normal(ks[0], (tokens, 4096)) * 3).astype(jnp.bfloat16)
    weight = (1 + 0.1 * jax.random.normal(ks[1], (4096,))).astype(jnp.bfloat16)
    router = (jax.random.normal(ks[2], (4096, 8)) * 4096**-0.5).astype(jnp.bfloat16)
    h, logits = jax.jit(lambda *a: norm_router.norm_and_router(*a, 1e-5))(x, weight, router)
    want_h = mixtral.rms_norm(x, weight, 1e-5)
    want_logits = jnp.dot(want_h, router, preferred_element_type=jnp.float32)
    np.testing.assert_allclose(np.asarray(h, np.float32), np.asarray(want_h, np.float32), rtol=1e-2)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want_logits), rtol=2e-2, atol=2e-2)


def test_model_decode_with_the_kernel_matches_decode_without(assert_decode_same_across_modes):
    assert_decode_same_across_modes("norm_router", ("xla", "kernel"))


@pytest.mark.parametrize("tokens", [1, 4])
def test_compiled_gather_kernel_matches_the_kernels_and_ops_it_replaces_at_mixtral_shapes(tokens):
    ks = jax.random.split(jax.random.key(tokens + 10), 3)
    x = (jax.random.normal(ks[0], (tokens, 4096)) * 3).astype(jnp.bfloat16)
    weight = (1 + 0.1 * jax.random.normal(ks[1], (4096,))).astype(jnp.bfloat16)
    router = (jax.random.normal(ks[2], (4096, 8)) * 4096**-0.5).astype(jnp.bfloat16)
    rows = 2 * tokens
    gather = jax.jit(
        lambda *a: norm_router.norm_route_gather(
            *a, 1e-5, top_k=2, renormalize=True, rows_out=moe.permuted_rows(rows)
        )
    )
    permuted, ids, weights, row_token, slot_row, sizes = gather(x, weight, router)
    h, logits = jax.jit(lambda *a: norm_router.norm_and_router(*a, 1e-5))(x, weight, router)
    routing, sorted_rows = jax.jit(lambda lg: moe.route_rows(lg, 2, True))(logits)
    np.testing.assert_array_equal(np.asarray(permuted[:rows]), np.asarray(h[sorted_rows.row_token]))
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(routing.expert_ids))
    np.testing.assert_allclose(np.asarray(weights), np.asarray(routing.weights), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(row_token), np.asarray(sorted_rows.row_token))
    np.testing.assert_array_equal(np.asarray(slot_row), np.asarray(sorted_rows.slot_row))
    np.testing.assert_array_equal(np.asarray(sizes), np.asarray(sorted_rows.group_sizes))


def test_model_decode_with_the_gather_kernel_matches_decode_without(assert_decode_same_across_modes):
    assert_decode_same_across_modes("norm_route_gather", ("xla", "kernel"))
