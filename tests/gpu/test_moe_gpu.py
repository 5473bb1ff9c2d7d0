"""The routed MoE layer on a Hopper GPU at Mixtral-8x7B's expert shapes, against the float32 dense reference.

Skipped without one (tests/gpu/conftest.py). On the GPU machine: python3 -m pytest tests/gpu/test_moe_gpu.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.api import explain
from moetune.kernels.lookup import LOOKUP
from moetune.kernels.moe import moe_mlp, moe_mlp_using, moe_problems
from moetune.kernels.moe.reference import moe_mlp_reference

pytestmark = pytest.mark.gpu

HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 4096, 14336, 8, 2


@pytest.fixture(autouse=True)
def packs_only():
    # The GPU machine has no database; winners come from the shipped config packs.
    with LOOKUP.using_db(None):
        yield


@pytest.fixture(scope="module")
def weights():
    k1, k2 = jax.random.split(jax.random.key(0))
    w_gate_up = jax.random.normal(k1, (EXPERTS, HIDDEN, 2 * INTERMEDIATE), jnp.bfloat16) * HIDDEN**-0.5
    w_down = jax.random.normal(k2, (EXPERTS, INTERMEDIATE, HIDDEN), jnp.bfloat16) * INTERMEDIATE**-0.5
    return w_gate_up, w_down


def _rel_l2(value, reference) -> float:
    value, reference = np.asarray(value, np.float64), np.asarray(reference, np.float64)
    return float(np.linalg.norm(value - reference) / np.linalg.norm(reference))


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("tokens, renormalize", [(1, True), (7, False), (256, True), (4096, True)])
def test_moe_mlp_matches_float32_reference(weights, tokens, renormalize, fuse):
    w_gate_up, w_down = weights
    k1, k2 = jax.random.split(jax.random.key(tokens))
    x = jax.random.normal(k1, (tokens, HIDDEN), jnp.bfloat16)
    logits = jax.random.normal(k2, (tokens, EXPERTS), jnp.float32)
    routed = jax.jit(lambda *a: moe_mlp(*a, top_k=TOP_K, renormalize=renormalize, fuse=fuse))
    ragged = jax.jit(lambda *a: moe_mlp_using(jax.lax.ragged_dot, *a, top_k=TOP_K, renormalize=renormalize))
    reference = jax.jit(lambda *a: moe_mlp_reference(*a, top_k=TOP_K, renormalize=renormalize))
    out = routed(x, logits, w_gate_up, w_down)
    f32 = reference(*(a.astype(jnp.float32) for a in (x, logits, w_gate_up, w_down)))
    assert out.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(out)))
    assert _rel_l2(out, f32) < 2e-2
    assert _rel_l2(out, ragged(x, logits, w_gate_up, w_down)) < 2e-2


def test_hopper_dispatches_both_gemms_to_a_gpu_kernel():
    # tests/gpu/conftest.py runs this only on a Hopper GPU, where mosaic_gpu must take both GEMMs,
    # the fused gate_up + SwiGLU op included.
    for tokens in (1, 4096):
        for fused in (True, False):
            for problem in moe_problems(tokens, HIDDEN, INTERMEDIATE, EXPERTS, TOP_K, fuse=fused):
                chosen = explain(problem)
                assert chosen.backend != "xla", str(chosen)
                assert not chosen.declined, str(chosen)


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("tokens", [1, 2, 4])
def test_rows_gathered_elsewhere_with_nan_padding_give_the_same_layer(weights, tokens, fuse):
    """moe_mlp_sorted on an lhs with NaN in every row past T*k (as norm_route_gather leaves them): mosaic_gpu
    takes the buffer as it is (no pad copy where pad_lhs is set) and no NaN reaches the result."""
    from moetune.kernels.moe.layer import _permute, moe_mlp_sorted, permuted_rows, route_rows

    w_gate_up, w_down = weights
    k1, k2 = jax.random.split(jax.random.key(tokens + 100))
    x = jax.random.normal(k1, (tokens, HIDDEN), jnp.bfloat16)
    logits = jax.random.normal(k2, (tokens, EXPERTS), jnp.float32)

    def sorted_layer(x, logits, w_gate_up, w_down):
        routing, rows = route_rows(logits, TOP_K, True)
        permuted = _permute(x, rows)
        padding = jnp.full((permuted_rows(tokens * TOP_K) - tokens * TOP_K, HIDDEN), jnp.nan, x.dtype)
        permuted = jnp.concatenate([permuted, padding])
        return moe_mlp_sorted(permuted, routing, rows, w_gate_up, w_down, fuse=fuse)

    got = jax.jit(sorted_layer)(x, logits, w_gate_up, w_down)
    want = jax.jit(lambda *a: moe_mlp(*a, top_k=TOP_K, fuse=fuse))(x, logits, w_gate_up, w_down)
    assert bool(jnp.all(jnp.isfinite(got)))
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("tokens", [1, 5, 64])
def test_group_offset_shard_sums_its_local_experts_against_the_reference(weights, tokens):
    # The unfused expert-parallel forward: each shard's result is the layer's with the other experts
    # zeroed, and the shards add up to the whole layer.
    w_gate_up, w_down = weights
    k1, k2 = jax.random.split(jax.random.key(100 + tokens))
    x = jax.random.normal(k1, (tokens, HIDDEN), jnp.bfloat16)
    logits = jax.random.normal(k2, (tokens, EXPERTS), jnp.float32)
    half = EXPERTS // 2
    shard = jax.jit(lambda x, g, a, b, o: moe_mlp(x, g, a, b, top_k=TOP_K, group_offset=o, decode_mode="xla"))
    reference = jax.jit(lambda *a: moe_mlp_reference(*a, top_k=TOP_K))
    f32 = [a.astype(jnp.float32) for a in (x, logits, w_gate_up, w_down)]
    total = 0
    for start in (0, half):
        offset = jnp.array([start], jnp.int32)
        out = shard(x, logits, w_gate_up[start : start + half], w_down[start : start + half], offset)
        keep = (jnp.arange(EXPERTS) >= start) & (jnp.arange(EXPERTS) < start + half)
        masked = [jnp.where(keep[:, None, None], w, 0) for w in f32[2:]]
        want = reference(f32[0], f32[1], *masked)
        assert _rel_l2(out, want) < 2e-2
        total = total + out.astype(jnp.float32)
    assert _rel_l2(total, reference(*f32)) < 2e-2
