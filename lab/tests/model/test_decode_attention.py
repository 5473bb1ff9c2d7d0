"""The decode attention kernels (Pallas Triton) on a CPU: Pallas's interpreter against the model's einsum
path, the cache write, the model's decode with them, and their lowering to Triton for an H200."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.lookup import LOOKUP
from moetune_lab.model import decode_attention as da
from moetune_lab.model import mixtral
from moetune_lab.model.config import ModelConfig, model_config


@pytest.fixture(autouse=True)
def no_database():
    with LOOKUP.using_db(None):
        yield


def _inputs(batch, heads, kv_heads, dim, length, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    normal = lambda k, shape: jax.random.normal(k, shape, jnp.float32).astype(dtype)
    return (
        normal(ks[0], (batch, (heads + 2 * kv_heads) * dim)),
        normal(ks[1], (batch, kv_heads, length, dim)) * 3 + 50,  # junk past pos is large: it must be masked
        normal(ks[2], (batch, kv_heads, length, dim)),
    )


def _config(heads, kv_heads, dim, dtype):
    tiny = model_config("tiny")
    return dataclasses.replace(
        tiny, heads=heads, kv_heads=kv_heads, head_dim=dim, dtype=dtype, rope_theta=1e4
    )


def _reference(config: ModelConfig, qkv, keys, values, pos, qk_norm=None):
    """The model's einsum path: (q/k norm,) rope, the cache written at pos, masked softmax attention."""
    out, (keys, values) = mixtral.einsum_attention(
        config, qkv[:, None], jnp.asarray([pos]), (keys, values), qk_norm
    )
    return out.reshape(qkv.shape[0], -1), keys, values


def _rel_l2(value, reference):
    value, reference = np.asarray(value, np.float64), np.asarray(reference, np.float64)
    return float(np.linalg.norm(value - reference) / np.linalg.norm(reference))


@pytest.mark.parametrize(
    "dtype, batch, heads, kv_heads, dim, length, block_k, splits, positions",
    [
        # float32: the only difference from the einsums is the order of the softmax's sums.
        ("float32", 2, 8, 2, 32, 100, 16, 4, (0, 5, 15, 16, 63, 64, 99)),
        # Mixtral's group of 4 query heads per kv head, a length no block divides, more splits than blocks.
        ("bfloat16", 1, 8, 2, 64, 70, 32, 8, (0, 31, 32, 69)),
        ("bfloat16", 2, 4, 4, 16, 40, 16, 2, (3, 39)),
        # One block per split: most splits hold no block up to pos and add nothing.
        ("bfloat16", 2, 8, 2, 64, 200, 32, 8, (0, 31, 150, 199)),
    ],
)
def test_interpreted_kernels_equal_the_einsum_path(
    dtype, batch, heads, kv_heads, dim, length, block_k, splits, positions
):
    config = _config(heads, kv_heads, dim, dtype)
    qkv, keys, values = _inputs(batch, heads, kv_heads, dim, length, jnp.dtype(dtype))
    tolerance = 1e-5 if dtype == "float32" else 1e-2
    for pos in positions:
        want_out, want_keys, want_values = _reference(config, qkv, keys, values, pos)
        cos, sin = mixtral.rotation(jnp.asarray([pos]), dim // 2, config.rope_theta)
        out, new_keys, new_values = da.decode_attention(
            qkv,
            keys,
            values,
            pos,
            cos[0],
            sin[0],
            heads=heads,
            tiling=da.Tiling(block_k=block_k, splits=splits),
            interpret=True,
        )
        assert out.shape == (batch, heads * dim) and out.dtype == qkv.dtype
        assert _rel_l2(out, want_out) < tolerance, f"pos {pos}"
        # The cache gets the roped key and the value at pos (the key to rounding: RoPE's float32 products
        # may round differently in Triton), and every other row stays as it was.
        others = np.arange(length) != pos
        for new, want, old in ((new_keys, want_keys, keys), (new_values, want_values, values)):
            new, want, old = (np.asarray(a, np.float32) for a in (new, want, old))
            np.testing.assert_array_equal(new[:, :, others], old[:, :, others])
            tol = 1e-6 if dtype == "float32" else 8e-3
            np.testing.assert_allclose(new[:, :, pos], want[:, :, pos], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_partial_sums_of_the_projection_attend_as_their_rounded_sum(dtype):
    """gemv.py's split-K partial sums in, added and rounded to the cache's dtype as the kernel reads them:
    the same outputs and cache as the projection itself, summed by XLA and rounded, gives."""
    qkv, keys, values = _inputs(2, 8, 2, 16, 40, jnp.dtype(dtype))
    parts = jax.random.normal(jax.random.key(7), (4, *qkv.shape), jnp.float32)
    rounded = parts.sum(0).astype(keys.dtype)
    cos, sin = mixtral.rotation(jnp.asarray([33]), 8, 1e4)
    attend = functools.partial(
        da.decode_attention,
        keys=keys,
        values=values,
        pos=33,
        cos=cos[0],
        sin=sin[0],
        heads=8,
        tiling=da.Tiling(block_k=16),
    )
    got, want = attend(parts, interpret=True), attend(rounded, interpret=True)
    assert got[0].dtype == keys.dtype
    tolerance = 1e-6 if dtype == "float32" else 1e-2  # float32: the sums' order differs
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tolerance, atol=tolerance
        )
    with pytest.raises(ValueError, match="must be float32"):
        attend(parts.astype(jnp.bfloat16), interpret=True)


def test_a_position_past_the_cache_clamps_to_its_last_row_as_the_einsum_paths_write_does():
    # dynamic_update_slice clamps its start, so the einsum path writes row L-1 and attends to every row;
    # an unclamped kernel would write past the cache's end.
    qkv, keys, values = _inputs(1, 4, 2, 16, 32, jnp.float32)
    cos, sin = mixtral.rotation(jnp.asarray([31]), 8, 1e4)
    at = lambda pos: da.decode_attention(
        qkv, keys, values, pos, cos[0], sin[0], heads=4, tiling=da.Tiling(block_k=16), interpret=True
    )
    for got, want in zip(at(40), at(31), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_bad_shapes_and_tilings_are_refused():
    qkv, keys, values = _inputs(1, 4, 2, 16, 32, jnp.float32)
    cos = sin = jnp.ones((8,), jnp.float32)
    attend = functools.partial(da.decode_attention, qkv, keys, values, 0, cos, sin, interpret=True)
    with pytest.raises(ConfigInvalid, match="splits=3 must be a power of two"):
        da.Tiling(splits=3)
    with pytest.raises(ConfigInvalid, match="block_k=48 must be a power of two"):
        da.Tiling(block_k=48)
    with pytest.raises(ConfigInvalid, match="num_stages=0 must be a positive integer"):
        da.Tiling(num_stages=0)
    with pytest.raises(ValueError, match=r"qkv \(1, 128\) does not hold 6 query and 2x2 kv heads of 16"):
        attend(heads=6)
    wide = jnp.zeros((1, (64 + 4) * 16), jnp.float32)
    with pytest.raises(ValueError, match="group=32"):
        da.decode_attention(wide, keys, values, 0, cos, sin, heads=64, interpret=True)
    with pytest.raises(ValueError, match=r"qk_norm weights \(8,\), \(16,\) for head_dim 16"):
        attend(heads=4, qk_norm=(jnp.ones((8,)), jnp.ones((16,)), 1e-6))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_interpreted_kernels_with_qk_norm_equal_the_einsum_path(dtype):
    """Qwen3's RMSNorm of each query and key head before RoPE, in the kernel as in the einsums; distinct q
    and k weights, so that swapping them would show."""
    batch, heads, kv_heads, dim, length = 2, 8, 2, 32, 40
    config = dataclasses.replace(_config(heads, kv_heads, dim, dtype), norm_eps=1e-6)
    qkv, keys, values = _inputs(batch, heads, kv_heads, dim, length, jnp.dtype(dtype), seed=3)
    qkv = qkv * 4  # the norm's scale matters: rows far from unit RMS
    ks = jax.random.split(jax.random.key(9), 2)
    q_weight, k_weight = ((1 + 0.5 * jax.random.normal(k, (dim,))).astype(dtype) for k in ks)
    tolerance = 1e-5 if dtype == "float32" else 2e-2
    for pos in (0, 17, 39):
        want = _reference(config, qkv, keys, values, pos, (q_weight, k_weight))
        unnormed = _reference(config, qkv, keys, values, pos)
        cos, sin = mixtral.rotation(jnp.asarray([pos]), dim // 2, config.rope_theta)
        got = da.decode_attention(
            qkv,
            keys,
            values,
            pos,
            cos[0],
            sin[0],
            heads=heads,
            tiling=da.Tiling(block_k=16, splits=2),
            qk_norm=(q_weight, k_weight, config.norm_eps),
            interpret=True,
        )
        assert _rel_l2(got[0], want[0]) < tolerance, f"pos {pos}"
        assert _rel_l2(got[1][:, :, pos], want[1][:, :, pos]) < tolerance  # the normed, roped key
        if pos:  # with one key (pos 0) the output is that key's value, norm or none
            assert _rel_l2(got[0], unnormed[0]) > 10 * tolerance


def test_model_decoding_with_the_interpreted_kernels_matches_the_einsum_path(assert_decode_same_across_modes):
    assert_decode_same_across_modes("decode_attention", ("xla", "interpret"))


def test_a_tiling_choice_reaches_the_kernel(assert_decode_same_across_modes, monkeypatch):
    from moetune_lab.model.kernel_choices import KernelChoices

    tilings = []
    attend = da.decode_attention
    monkeypatch.setattr(
        da, "decode_attention", lambda *a, **kw: tilings.append(kw["tiling"]) or attend(*a, **kw)
    )
    small = KernelChoices(decode_attention_tiling=da.Tiling(block_k=4, splits=2))
    assert_decode_same_across_modes("decode_attention", ("xla", "interpret"), small)
    assert tilings and set(tilings) == {da.Tiling(block_k=4, splits=2)}


def test_mixtral_shapes_lower_to_triton_for_an_h200(triton_lowering_for_h200):
    spec = jax.ShapeDtypeStruct
    bf16 = jnp.bfloat16
    args = (
        spec((1, (32 + 2 * 8) * 128), bf16),
        spec((1, 8, 2176, 128), bf16),
        spec((1, 8, 2176, 128), bf16),
        spec((), jnp.int32),
        spec((64,), jnp.float32),
        spec((64,), jnp.float32),
    )
    attend = jax.jit(functools.partial(da.decode_attention, heads=32))
    partial_sums = spec((8, 1, (32 + 2 * 8) * 128), jnp.float32)  # gemv.py's, as the model passes them
    for qkv in (args[0], partial_sums):
        text = attend.trace(qkv, *args[1:]).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == 2
        assert "moetune_decode_attention" in text and "moetune_decode_attention_combine" in text


def test_qwen3_shapes_with_qk_norm_lower_to_triton_for_an_h200(triton_lowering_for_h200):
    spec, bf16 = jax.ShapeDtypeStruct, jnp.bfloat16
    config = model_config("qwen3_30b_a3b")
    heads, kv_heads, dim = config.heads, config.kv_heads, config.head_dim
    cache = spec((1, kv_heads, 2176, dim), bf16)
    half = spec((dim // 2,), jnp.float32)
    attend = jax.jit(
        lambda qkv, k, v, pos, cos, sin, qn, kn: da.decode_attention(
            qkv, k, v, pos, cos, sin, heads=heads, qk_norm=(qn, kn, config.norm_eps)
        )
    )
    args = (spec((8, 1, (heads + 2 * kv_heads) * dim), jnp.float32), cache, cache, spec((), jnp.int32))
    text = attend.trace(*args, half, half, spec((dim,), bf16), spec((dim,), bf16))
    text = text.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 2 and "moetune_decode_attention" in text


def test_the_tiling_parses_from_text_and_prints_back():
    assert da.Tiling.parse("") == da.Tiling()
    assert da.Tiling.parse("block_k=32, splits=64,") == da.Tiling(block_k=32, splits=64)
    assert da.Tiling.parse(str(da.Tiling(num_warps=8, num_stages=3))) == da.Tiling(num_warps=8, num_stages=3)
    for bad in ("block=32", "splits=many", "splits"):
        with pytest.raises(ConfigInvalid, match=f"decode attention tiling '{bad}'"):
            da.Tiling.parse(bad)
