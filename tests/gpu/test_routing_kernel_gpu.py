"""The one-kernel routing compiled by Triton on a Hopper GPU, against the XLA routing it replaces.

Skipped without one (tests/gpu/conftest.py). On the GPU machine:
    python3 -m pytest tests/gpu/test_routing_kernel_gpu.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.moe import layer as moe
from moetune.kernels.moe import routing_kernel

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tokens, experts, top_k", [(1, 8, 2), (4, 8, 2), (32, 8, 2), (7, 16, 1), (21, 3, 3)])
@pytest.mark.parametrize("renormalize", [True, False])
def test_compiled_kernel_equals_the_xla_routing(tokens, experts, top_k, renormalize):
    kernel = jax.jit(routing_kernel.route_and_sort, static_argnums=(1, 2))
    for seed in range(3):
        logits = jax.random.normal(jax.random.key(seed), (tokens, experts))
        if seed == 2:
            logits = jnp.round(logits * 2) / 2  # ties
        ids, weights, row_token, slot_row, sizes = kernel(logits, top_k, renormalize)
        routing = moe.route(logits, top_k, renormalize)
        rows = moe.sort_by_expert(routing.expert_ids, experts)
        np.testing.assert_array_equal(np.asarray(ids), np.asarray(routing.expert_ids))
        np.testing.assert_allclose(np.asarray(weights), np.asarray(routing.weights), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(row_token), np.asarray(rows.row_token))
        np.testing.assert_array_equal(np.asarray(slot_row), np.asarray(rows.slot_row))
        np.testing.assert_array_equal(np.asarray(sizes), np.asarray(rows.group_sizes))


def test_model_decode_with_the_kernel_matches_decode_without(assert_decode_same_across_modes):
    assert_decode_same_across_modes("routing", ("xla", "kernel"))
