"""The decode attention kernels compiled by Triton on a Hopper GPU, at Mixtral-8x7B's attention shapes and
Qwen3-30B-A3B's (q/k RMSNorm), against the model's einsum path in float32; and the model's decode with them
against its decode without them.

Skipped without one (tests/gpu/conftest.py). On the GPU machine:
    python3 -m pytest tests/gpu/test_decode_attention_gpu.py
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.lookup import LOOKUP
from moetune_lab.model import decode_attention as da
from moetune_lab.model import mixtral
from moetune_lab.model.config import model_config

pytestmark = pytest.mark.gpu

MIXTRAL = model_config("mixtral_8x7b")
LENGTH = 2176


@pytest.fixture(autouse=True)
def packs_only():
    with LOOKUP.using_db(None):
        yield


def _einsum_path(qkv, keys, values, pos):
    """The model's einsum path: (out [B, heads * D], keys with the new key at pos)."""
    out, (keys, _) = mixtral.einsum_attention(MIXTRAL, qkv[:, None], jnp.asarray([pos]), (keys, values))
    return out.reshape(qkv.shape[0], -1), keys


@pytest.mark.parametrize(
    "tiling", [da.Tiling(), da.Tiling(block_k=64, splits=64), da.Tiling(block_k=128, splits=8)], ids=str
)
@pytest.mark.parametrize("batch", [1, 3])
def test_kernels_match_the_float32_einsum_path_at_mixtral_shapes(batch, tiling):
    ks = jax.random.split(jax.random.key(batch), 3)
    heads, kv_heads, dim = MIXTRAL.heads, MIXTRAL.kv_heads, MIXTRAL.head_dim
    normal = lambda k, shape: jax.random.normal(k, shape, jnp.float32).astype(jnp.bfloat16)
    qkv = normal(ks[0], (batch, (heads + 2 * kv_heads) * dim))
    keys = normal(ks[1], (batch, kv_heads, LENGTH, dim)) + 20  # junk past pos: large, so a leak shows
    values = normal(ks[2], (batch, kv_heads, LENGTH, dim))
    f32 = lambda a: a.astype(jnp.float32)
    attend = jax.jit(functools.partial(da.decode_attention, heads=heads, tiling=tiling))
    for pos in (0, 63, 64, 2100, LENGTH - 1):
        want, want_keys = _einsum_path(f32(qkv), f32(keys), f32(values), pos)
        cos, sin = mixtral.rotation(jnp.asarray([pos]), dim // 2, MIXTRAL.rope_theta)
        out, new_keys, _ = attend(qkv, keys, values, pos, cos[0], sin[0])
        out, want = np.asarray(out, np.float64), np.asarray(want, np.float64)
        rel_l2 = np.linalg.norm(out - want) / np.linalg.norm(want)
        assert rel_l2 < 1e-2, f"pos {pos}: rel_l2={rel_l2:.3g}"
        np.testing.assert_allclose(
            np.asarray(new_keys[:, :, pos], np.float32),
            np.asarray(want_keys[:, :, pos]),
            rtol=1e-2,
            atol=1e-2,
        )


def test_partial_sums_of_the_projection_attend_as_their_rounded_sum_at_mixtral_shapes():
    """gemv.py's split-K partial sums in (as the model passes them), against their sum rounded to bf16."""
    heads, kv_heads, dim = MIXTRAL.heads, MIXTRAL.kv_heads, MIXTRAL.head_dim
    ks = jax.random.split(jax.random.key(5), 3)
    parts = jax.random.normal(ks[0], (8, 1, (heads + 2 * kv_heads) * dim), jnp.float32) / 3
    keys = jax.random.normal(ks[1], (1, kv_heads, LENGTH, dim), jnp.float32).astype(jnp.bfloat16)
    values = jax.random.normal(ks[2], (1, kv_heads, LENGTH, dim), jnp.float32).astype(jnp.bfloat16)
    cos, sin = mixtral.rotation(jnp.asarray([2100]), dim // 2, MIXTRAL.rope_theta)
    attend = jax.jit(functools.partial(da.decode_attention, heads=heads))
    got = attend(parts, keys, values, 2100, cos[0], sin[0])
    want = attend(parts.sum(0).astype(jnp.bfloat16), keys, values, 2100, cos[0], sin[0])
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-2, atol=1e-2)


def test_model_decode_with_the_kernels_matches_decode_without(assert_decode_same_across_modes):
    assert_decode_same_across_modes("decode_attention", ("xla", "kernel"))


def test_kernels_with_qk_norm_match_the_float32_einsum_path_at_qwen3_shapes():
    qwen3 = model_config("qwen3_30b_a3b")
    heads, kv_heads, dim = qwen3.heads, qwen3.kv_heads, qwen3.head_dim
    ks = jax.random.split(jax.random.key(7), 5)
    normal = lambda k, shape: jax.random.normal(k, shape, jnp.float32).astype(jnp.bfloat16)
    qkv = normal(ks[0], (2, (heads + 2 * kv_heads) * dim)) * 4
    keys = normal(ks[1], (2, kv_heads, LENGTH, dim))
    values = normal(ks[2], (2, kv_heads, LENGTH, dim))
    q_weight, k_weight = (1 + 0.5 * normal(k, (dim,)) for k in ks[3:])
    f32 = lambda a: a.astype(jnp.float32)
    attend = jax.jit(
        lambda *a: da.decode_attention(*a, heads=heads, qk_norm=(q_weight, k_weight, qwen3.norm_eps))
    )
    for pos in (1, 700, LENGTH - 1):
        want, (want_keys, _) = mixtral.einsum_attention(
            qwen3,
            f32(qkv)[:, None],
            jnp.asarray([pos]),
            (f32(keys), f32(values)),
            (f32(q_weight), f32(k_weight)),
        )
        cos, sin = mixtral.rotation(jnp.asarray([pos]), dim // 2, qwen3.rope_theta)
        out, new_keys, _ = attend(qkv, keys, values, pos, cos[0], sin[0])
        out, want = np.asarray(out, np.float64), np.asarray(want.reshape(2, -1), np.float64)
        rel_l2 = np.linalg.norm(out - want) / np.linalg.norm(want)
        assert rel_l2 < 2e-2, f"pos {pos}: rel_l2={rel_l2:.3g}"
        np.testing.assert_allclose(
            np.asarray(new_keys[:, :, pos], np.float32),
            np.asarray(want_keys[:, :, pos]),
            rtol=3e-2,
            atol=3e-2,
        )
