"""The decode projections' GEMV kernel (Pallas Triton) on a CPU: Pallas's interpreter against XLA's dot (and
rms_norm then dot), the model's decode with it, and its lowering to Triton for an H200."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.lookup import LOOKUP
from moetune_lab.model import gemv, mixtral
from moetune_lab.model.config import model_config


@pytest.fixture(autouse=True)
def no_database():
    with LOOKUP.using_db(None):
        yield


def _inputs(rows, k, n, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    x = (jax.random.normal(ks[0], (rows, k)) * 3).astype(dtype)
    w = (jax.random.normal(ks[1], (k, n)) * k**-0.5).astype(dtype)
    norm_weight = (1 + 0.1 * jax.random.normal(ks[2], (k,))).astype(dtype)
    return x, w, norm_weight


def _f32(a):
    return np.asarray(a, np.float32)


TILINGS = [
    gemv.Tiling(block_n=64, block_k=16, split_k=2),
    gemv.Tiling(block_n=128, block_k=32, split_k=4, num_warps=8, num_stages=2),
    gemv.Tiling(block_n=32, block_k=64, split_k=1),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 3, gemv.MAX_ROWS])
@pytest.mark.parametrize("tiling", TILINGS)
def test_interpreted_partial_sums_add_up_to_the_product(dtype, rows, tiling):
    x, w, norm_weight = _inputs(rows, 512, 256, jnp.dtype(dtype))
    parts = gemv.partial_sums(x, w, tiling=tiling, interpret=True)
    assert parts.shape == (tiling.split_k, rows, 256) and parts.dtype == jnp.float32
    want = jnp.dot(x, w, preferred_element_type=jnp.float32, precision="highest")
    np.testing.assert_allclose(_f32(parts.sum(0)), _f32(want), rtol=1e-5, atol=1e-4)
    # Each split sums only its own share of K.
    share = 512 // tiling.split_k
    first = jnp.dot(x[:, :share], w[:share], preferred_element_type=jnp.float32, precision="highest")
    np.testing.assert_allclose(_f32(parts[0]), _f32(first), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 2])
def test_interpreted_norm_then_projection_equals_the_model_ops(dtype, rows):
    x, w, norm_weight = _inputs(rows, 512, 128, jnp.dtype(dtype), seed=rows)
    got = gemv.project(x, w, norm=(norm_weight, 1e-5), tiling=TILINGS[0], interpret=True)
    h = mixtral.rms_norm(x, norm_weight, 1e-5)
    want = jnp.dot(h, w, preferred_element_type=jnp.float32, precision="highest")
    assert got.dtype == x.dtype
    # The normed row rounds to x's dtype in both; a last-bit flip where the sums' orders differ.
    tolerance = 2e-2 if dtype == "bfloat16" else 1e-5
    np.testing.assert_allclose(_f32(got), _f32(want), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 3])
def test_interpreted_accumulate_adds_the_product_into_the_stream(dtype, rows):
    x, w, _ = _inputs(rows, 512, 256, jnp.dtype(dtype), seed=3)
    stream = jax.random.normal(jax.random.key(4), (rows, 256), jnp.float32)
    got = gemv.accumulate(x, w, stream, tiling=TILINGS[1], interpret=True)
    want = stream + jnp.dot(x, w, preferred_element_type=jnp.float32, precision="highest")
    assert got.dtype == jnp.float32 and got.shape == (rows, 256)
    np.testing.assert_allclose(_f32(got), _f32(want), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match=r"bfloat16 \(1, 256\) \+= x \(1, 512\)"):
        gemv.accumulate(x[:1], w, stream[:1].astype(jnp.bfloat16), tiling=TILINGS[1], interpret=True)
    with pytest.raises(ValueError, match=r"float32 \(1, 128\) \+= x"):
        gemv.accumulate(x[:1], w, stream[:1, :128], tiling=TILINGS[1], interpret=True)


def test_shapes_it_cannot_tile_are_refused_with_their_sizes():
    x, w, norm_weight = _inputs(gemv.MAX_ROWS + 1, 512, 256, jnp.float32)
    tiling = TILINGS[0]
    assert gemv.fits(x[:1].shape, w.shape, tiling)
    assert not gemv.fits(x.shape, w.shape, tiling)  # too many rows: XLA's GEMM
    assert not gemv.fits((1, 512), (512, 96), tiling)  # N not a multiple of block_n
    assert not gemv.fits((1, 488), (488, 256), tiling)  # K not a multiple of split_k * block_k
    with pytest.raises(ValueError, match=r"x \(5, 512\) @ w \(512, 256\)"):
        gemv.partial_sums(x, w, tiling=tiling, interpret=True)
    with pytest.raises(ValueError, match=r"norm weight \(256,\)"):
        gemv.partial_sums(x[:1], w, norm=(norm_weight[:256], 1e-5), tiling=tiling, interpret=True)


@pytest.fixture
def tiny_tilings(monkeypatch):
    """Tilings for the tiny model's wqkv [64, 128] and wo [64, 64], which the defaults do not divide."""
    tiny = model_config("tiny")
    q, kv = tiny.heads * tiny.head_dim, tiny.kv_heads * tiny.head_dim
    small = gemv.Tiling(block_n=64, block_k=16, split_k=2)
    monkeypatch.setattr(gemv, "TILINGS", {(tiny.hidden, q + 2 * kv): small, (q, tiny.hidden): small})
    return small


def test_model_projects_through_the_kernel_only_in_decode(tiny_tilings, monkeypatch):
    calls = []
    kernel = gemv.project
    monkeypatch.setattr(gemv, "project", lambda *a, **kw: calls.append(kw["tiling"]) or kernel(*a, **kw))
    w = jnp.ones((64, 64), jnp.float32)
    mixtral.project(jnp.ones((1, 1, 64), jnp.float32), w, gemv_mode="interpret")
    assert calls == [tiny_tilings]
    # More rows than MAX_ROWS: XLA's dot.
    mixtral.project(jnp.ones((1, 8, 64), jnp.float32), w, gemv_mode="interpret")
    mixtral.project(jnp.ones((1, 1, 64), jnp.float32), w, gemv_mode="xla")
    assert calls == [tiny_tilings]
    mixtral.project(jnp.ones((1, 1, 64), jnp.float32), w)  # "auto": XLA's dot on a CPU, the kernel on a GPU
    assert calls == [tiny_tilings] * (2 if jax.default_backend() == "gpu" else 1)


def test_model_decoding_with_the_interpreted_kernel_matches_the_xla_ops(
    tiny_tilings, assert_decode_same_across_modes
):
    assert_decode_same_across_modes("gemv", ("xla", "interpret"))


def test_model_decoding_with_both_kernels_feeds_attention_the_partial_sums(
    tiny_tilings, assert_decode_same_across_modes, monkeypatch
):
    """With the attention kernel on too, the model hands it wqkv's partial sums (no XLA sum between)."""
    from moetune_lab.model import decode_attention
    from moetune_lab.model.kernel_choices import KernelChoices

    fed = []
    attend = decode_attention.decode_attention
    monkeypatch.setattr(
        decode_attention,
        "decode_attention",
        lambda qkv, *a, **kw: fed.append(qkv.shape) or attend(qkv, *a, **kw),
    )
    assert_decode_same_across_modes("gemv", ("xla", "interpret"), KernelChoices(decode_attention="interpret"))
    parts = (tiny_tilings.split_k, 2, 128)  # [S, B, W]: the fixture decodes 2 sequences
    assert (2, 128) in fed and parts in fed


def test_mixtral_projections_lower_to_triton_for_an_h200(triton_lowering_for_h200):
    spec, bf16 = jax.ShapeDtypeStruct, jnp.bfloat16
    config = model_config("mixtral_8x7b")
    q, kv = config.heads * config.head_dim, config.kv_heads * config.head_dim
    shapes = ((config.hidden, q + 2 * kv, True), (q, config.hidden, False))
    for (k, n, norm), rows in itertools.product(shapes, (1, gemv.MAX_ROWS)):
        tiling = gemv.tiling_for(k, n)
        assert gemv.fits((rows, k), (k, n), tiling)
        fn = lambda x, w, nw, norm=norm, tiling=tiling: gemv.project(  # noqa: E731
            x, w, norm=(nw, 1e-5) if norm else None, tiling=tiling
        )
        text = jax.jit(fn).trace(spec((rows, k), bf16), spec((k, n), bf16), spec((k,), bf16))
        text = text.lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == 1 and "moetune_gemv" in text
    # wo adding into the float32 residual stream, in place (the stream aliases the output).
    tiling = gemv.tiling_for(q, config.hidden)
    fn = lambda x, w, stream: gemv.accumulate(x, w, stream, tiling=tiling)  # noqa: E731
    text = jax.jit(fn, donate_argnums=2).trace(
        spec((1, q), bf16), spec((q, config.hidden), bf16), spec((1, config.hidden), jnp.float32)
    )
    text = text.lower(lowering_platforms=("cuda",)).as_text()
    assert "moetune_gemv_accumulate" in text and "output_operand_alias" in text


def test_a_decode_step_with_every_kernel_on_carries_a_float32_residual_through_wo_s_atomic_adds(
    tiny_tilings, assert_decode_same_across_modes, monkeypatch
):
    """wo's GEMV adds into the float32 residual stream (no XLA add between it and norm_route_gather): the
    same tokens, logits and cache as the two adds in the model's dtype."""
    from moetune_lab.model.kernel_choices import KernelChoices

    every_kernel = KernelChoices(
        gemv="interpret", decode_attention="interpret", norm_route_gather="interpret"
    )
    streams = []
    kernel = gemv.accumulate
    monkeypatch.setattr(gemv, "accumulate", lambda *a, **kw: streams.append(a[2].dtype) or kernel(*a, **kw))
    assert_decode_same_across_modes("decode_residual", ("add", "accumulate"), every_kernel)
    assert streams and set(streams) == {jnp.dtype(jnp.float32)}
    with pytest.raises(ConfigInvalid, match=r"decode_residual='sometimes'; expected one of accumulate, add"):
        KernelChoices(decode_residual="sometimes")
