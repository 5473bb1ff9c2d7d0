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

from moetune.tuner.models import mixtral, norm_router

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
    assert_decode_same_across_modes(norm_router.MODE_ENV, ("xla", "kernel"))
