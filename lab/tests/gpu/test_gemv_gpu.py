"""The decode projections' GEMV kernel compiled by Triton on a Hopper GPU, at Mixtral-8x7B's wqkv and wo
shapes with the model's tilings, against XLA's ops; and the model's decode with it against decode without.

Skipped without one (tests/gpu/conftest.py). On the GPU machine:
    python3 -m pytest tests/gpu/test_gemv_gpu.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.lookup import LOOKUP
from moetune_lab.model import gemv, mixtral
from moetune_lab.model.config import model_config

pytestmark = pytest.mark.gpu

MIXTRAL = model_config("mixtral_8x7b")
Q, KV = MIXTRAL.heads * MIXTRAL.head_dim, MIXTRAL.kv_heads * MIXTRAL.head_dim


@pytest.fixture(autouse=True)
def packs_only():
    with LOOKUP.using_db(None):
        yield


@pytest.mark.parametrize("rows", [1, 2, gemv.MAX_ROWS])
@pytest.mark.parametrize(
    "k, n, norm", [(MIXTRAL.hidden, Q + 2 * KV, True), (Q, MIXTRAL.hidden, False)], ids=["wqkv", "wo"]
)
def test_compiled_kernel_matches_xla_at_mixtral_shapes(rows, k, n, norm):
    ks = jax.random.split(jax.random.key(rows), 3)
    x = (jax.random.normal(ks[0], (rows, k)) * 3).astype(jnp.bfloat16)
    w = (jax.random.normal(ks[1], (k, n)) * k**-0.5).astype(jnp.bfloat16)
    norm_weight = (1 + 0.1 * jax.random.normal(ks[2], (k,))).astype(jnp.bfloat16)
    tiling = gemv.tiling_for(k, n)
    if norm:
        got = jax.jit(lambda x, w, nw: gemv.project(x, w, norm=(nw, 1e-5), tiling=tiling))(x, w, norm_weight)
        h = mixtral.rms_norm(x, norm_weight, 1e-5)
    else:
        got = jax.jit(lambda x, w, nw: gemv.project(x, w, tiling=tiling))(x, w, norm_weight)
        h = x
    want = jnp.dot(h.astype(jnp.float32), w.astype(jnp.float32), precision="highest")
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)
    parts = jax.jit(lambda x, w: gemv.partial_sums(x, w, tiling=tiling))(h, w)
    np.testing.assert_allclose(np.asarray(parts.sum(0)), np.asarray(want), rtol=1e-4, atol=1e-3)


def test_model_decode_with_the_kernel_matches_decode_without(assert_decode_same_across_modes, monkeypatch):
    tiny = model_config("tiny")
    q, kv = tiny.heads * tiny.head_dim, tiny.kv_heads * tiny.head_dim
    small = gemv.Tiling(block_n=64, block_k=16, split_k=2)
    monkeypatch.setattr(gemv, "TILINGS", {(tiny.hidden, q + 2 * kv): small, (q, tiny.hidden): small})
    assert_decode_same_across_modes("gemv", ("xla", "kernel"))


@pytest.mark.parametrize("rows", [1, 2, gemv.MAX_ROWS])
def test_wo_adds_into_the_float32_stream_with_atomics(rows):
    ks = jax.random.split(jax.random.key(rows + 10), 3)
    x = (jax.random.normal(ks[0], (rows, Q)) * 3).astype(jnp.bfloat16)
    w = (jax.random.normal(ks[1], (Q, MIXTRAL.hidden)) * Q**-0.5).astype(jnp.bfloat16)
    stream = jax.random.normal(ks[2], (rows, MIXTRAL.hidden), jnp.float32)
    want = stream + jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32), precision="highest")
    tiling = gemv.tiling_for(Q, MIXTRAL.hidden)
    add = jax.jit(lambda x, w, s: gemv.accumulate(x, w, s, tiling=tiling))
    for _ in range(3):  # the atomic adds land in another order each time: only the last bits may move
        np.testing.assert_allclose(np.asarray(add(x, w, stream)), np.asarray(want), rtol=1e-4, atol=1e-3)


def test_model_decode_carrying_a_float32_residual_matches_the_two_adds(
    assert_decode_same_across_modes, monkeypatch
):
    from moetune_lab.model.kernel_choices import KernelChoices

    tiny = model_config("tiny")
    q, kv = tiny.heads * tiny.head_dim, tiny.kv_heads * tiny.head_dim
    small = gemv.Tiling(block_n=64, block_k=16, split_k=2)
    monkeypatch.setattr(gemv, "TILINGS", {(tiny.hidden, q + 2 * kv): small, (q, tiny.hidden): small})
    every_kernel = KernelChoices(gemv="kernel", decode_attention="kernel", norm_route_gather="kernel")
    assert_decode_same_across_modes("decode_residual", ("add", "accumulate"), every_kernel)
