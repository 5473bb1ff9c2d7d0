"""moe_mlp on FP8 expert weights against the bf16 layer on the same weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe import moe_mlp, quantize_weights

pytestmark = pytest.mark.slow  # the second tier: seconds per case on a CPU

T, H, F, E, TOP_K = 16, 256, 128, 4, 2
# Relative Frobenius error ||fp8 - bf16|| / ||bf16|| of the layer's output. e4m3 keeps 4 significant
# bits: each quantized value is off by at most 2^-4 relative, about 2^-4/sqrt(3) = 3.6% RMS. Each GEMM's
# output then carries about sqrt(2) * 3.6% = 5.1% from its two operands (x and w_gate_up, then the
# re-quantized hidden rows and w_down), and the down GEMM's adds to the one it inherits: about
# sqrt(2) * 5.1% = 7.2% in all. The bound is 10%; a wrong scale, expert or block is off by tens of
# percent. The floor says the FP8 path really quantized: the bf16 layer against itself in float32 is
# below 1%.
BOUND, FLOOR = 0.10, 0.02


@pytest.fixture(scope="module")
def layer_inputs():
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (T, H)).astype(jnp.bfloat16)
    logits = jax.random.normal(keys[1], (T, E))
    w_gate_up = jax.random.normal(keys[2], (E, H, 2 * F)) / np.sqrt(H)
    w_down = jax.random.normal(keys[3], (E, F, H)) / np.sqrt(F)
    layer = jax.jit(lambda *a: moe_mlp(*a, top_k=TOP_K))  # one program to compile, not one per op
    bf16 = layer(x, logits, w_gate_up.astype(jnp.bfloat16), w_down.astype(jnp.bfloat16))
    return x, logits, w_gate_up, w_down, np.asarray(bf16, np.float64)


def frobenius_error(out, ref):
    return np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize(
    ("layout", "fuse"), [("row_channel", True), ("block_1x128_128x128", True), ("tensor", False)]
)
def test_fp8_layer_is_close_to_the_bf16_layer(layer_inputs, layout, fuse):
    x, logits, w_gate_up, w_down, bf16 = layer_inputs
    (q_gate_up, s_gate_up), (q_down, s_down) = (quantize_weights(w, layout) for w in (w_gate_up, w_down))

    @jax.jit
    def layer(x, logits, q_gate_up, s_gate_up, q_down, s_down):
        return moe_mlp(
            x, logits, q_gate_up, q_down, w_gate_up_scale=s_gate_up, w_down_scale=s_down, top_k=TOP_K,
            scale_layout=layout, fuse=fuse,
        )  # fmt: skip

    out = layer(x, logits, q_gate_up, s_gate_up, q_down, s_down)
    assert out.shape == (T, H) and out.dtype == jnp.bfloat16
    assert FLOOR < frobenius_error(out, bf16) < BOUND


def test_fp8_layer_names_a_scale_or_weight_that_does_not_fit(layer_inputs):
    x, logits, w_gate_up, w_down, _ = layer_inputs
    (q_gate_up, s_gate_up), (q_down, s_down) = (
        quantize_weights(w, "row_channel") for w in (w_gate_up, w_down)
    )
    call = lambda gu, sgu, d, sd: moe_mlp(  # noqa: E731
        x, logits, gu, d, w_gate_up_scale=sgu, w_down_scale=sd, top_k=TOP_K, scale_layout="row_channel"
    )
    with pytest.raises(
        ConfigInvalid, match=r"w_down_scale must be float32 \[4, 1, 256\] .* got float32 \[4, 256\]"
    ):
        call(q_gate_up, s_gate_up, q_down, s_down[:, 0])
    with pytest.raises(ConfigInvalid, match="FP8 weights must share one dtype .* got w_gate_up bfloat16"):
        call(w_gate_up.astype(jnp.bfloat16), s_gate_up, q_down, s_down)


@pytest.mark.parametrize("layout", ["row_channel", "block_1x128_128x128"])
def test_k_major_fp8_weights_give_the_same_layer(layer_inputs, layout):
    # [E, 2F, H] and [E, H, F]: the layout Hopper's FP8 kernel reads. Same values, same scales, so the
    # same output as the [E, K, N] layer up to float32 summation order.
    x, logits, w_gate_up, w_down, bf16 = layer_inputs
    kn = [quantize_weights(w, layout) for w in (w_gate_up, w_down)]
    nk = [quantize_weights(w, layout, transpose=True) for w in (w_gate_up, w_down)]
    assert nk[0][0].shape == (E, 2 * F, H) and nk[1][0].shape == (E, H, F)
    np.testing.assert_array_equal(
        np.asarray(nk[0][0].astype(jnp.float32)), np.swapaxes(kn[0][0].astype(jnp.float32), 1, 2)
    )

    def layer(weights, transpose):
        (gu, sgu), (d, sd) = weights
        return moe_mlp(
            x, logits, gu, d, w_gate_up_scale=sgu, w_down_scale=sd, top_k=TOP_K, scale_layout=layout,
            transpose_weights=transpose,
        )  # fmt: skip

    out_kn, out_nk = layer(kn, False), layer(nk, True)
    assert frobenius_error(out_nk, np.asarray(out_kn, np.float64)) < 1e-2
    assert FLOOR < frobenius_error(out_nk, bf16) < BOUND
    # [E, K, N] weights passed as K-major are refused by shape, as the transposes they are read as.
    with pytest.raises(ConfigInvalid, match=r"w_down must be \[E=4, F=128, H=256\]; got \(4, 256, 128\)"):
        layer(kn, True)
    # 16-bit K-major weights run the same layer too, as the grouped GEMMs' t=1 problems.
    k_major = [jnp.swapaxes(w, 1, 2) for w in (w_gate_up, w_down)]
    out = moe_mlp(x, logits, *k_major, top_k=TOP_K, transpose_weights=True)
    want = moe_mlp(x, logits, w_gate_up, w_down, top_k=TOP_K)
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(want, np.float32), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("layout", ["row_channel", "block_1x128_128x128"])
@pytest.mark.parametrize("transpose", [False, True])
def test_fp8_experts_split_over_shards_sum_to_the_whole_layer(layer_inputs, layout, transpose):
    # Expert parallelism: each shard holds two of the four experts' FP8 weights and scales
    # (group_offset) and sums over those only. The activations' scales are per token and block here, so
    # each shard quantizes every row as the whole layer does: the halves add up to it but for float32
    # summation order and one bf16 rounding per half.
    x, logits, w_gate_up, w_down, bf16 = layer_inputs
    (gu, sgu), (d, sd) = (quantize_weights(w, layout, transpose=transpose) for w in (w_gate_up, w_down))

    def layer(gu, sgu, d, sd, offset=None):
        return moe_mlp(
            x, logits, gu, d, w_gate_up_scale=sgu, w_down_scale=sd, top_k=TOP_K, scale_layout=layout,
            transpose_weights=transpose, group_offset=offset,
        )  # fmt: skip

    whole = np.asarray(jax.jit(layer)(gu, sgu, d, sd), np.float64)
    local = lambda e: (gu[e : e + 2], sgu[e : e + 2], d[e : e + 2], sd[e : e + 2])  # noqa: E731
    halves = [jax.jit(layer)(*local(e), jnp.asarray([e], jnp.int32)) for e in (0, 2)]
    summed = np.asarray(halves[0], np.float64) + np.asarray(halves[1], np.float64)
    assert frobenius_error(summed, whole) < 1e-2
    assert frobenius_error(halves[0], whole) > 0.2  # one half alone is not the layer
    assert FLOOR < frobenius_error(summed, bf16) < BOUND
