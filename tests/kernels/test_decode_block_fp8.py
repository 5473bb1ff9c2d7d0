"""The fused decode block on FP8 expert weights on a CPU: Pallas's interpreter against the float32
reference on the weights the FP8 values and scales stand for, each widening, dims the tiles do not
divide, the scales' checks, and moe_mlp's choice of the FP8 block."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe import decode_block as db
from moetune.kernels.moe.reference import moe_mlp_reference
from tests.kernels.test_decode_block import SMALL, _inputs
from tests.tiers import each_value_fast


@pytest.mark.parametrize(
    *each_value_fast(
        {
            "layout": ["tensor", "row_channel", "block_1x128_128x128"],
            "k_major": {"kn": False, "k_major": True},
            "up_programs": {"per_tile": 0, "shares": 3},
        }
    )
)
def test_fp8_weights_are_widened_on_chip_and_scaled_per_block(layout, k_major, up_programs):
    x, logits, w_gate_up, w_down = _inputs(3, 4, 128, 64 if layout != "block_1x128_128x128" else 128, seed=5)
    config = db.DecodeConfig(
        block_f=16, block_k=32, block_h=32, block_fd=32, up_split=1 if up_programs else 2, down_split=2,
        up_programs=up_programs,
    )  # fmt: skip
    assert _fp8_block_error(x, logits, w_gate_up, w_down, layout, k_major, config) < 1e-2


def _fp8_block_error(x, logits, w_gate_up, w_down, layout, k_major, config) -> float:
    """The FP8 block's relative error (bf16 x, the weights quantized in `layout`) against the reference on
    the weights the FP8 values and scales stand for: the hidden rows and out are rounded to bf16 once
    each, within 1e-2."""
    out, want = _fp8_block_and_reference(x, logits, w_gate_up, w_down, layout, k_major, config)
    return float(
        np.linalg.norm(np.asarray(out, np.float32) - np.asarray(want)) / np.linalg.norm(np.asarray(want))
    )


@functools.partial(jax.jit, static_argnums=(4, 5, 6))  # one program to compile, not one per operation
def _fp8_block_and_reference(x, logits, w_gate_up, w_down, layout, k_major, config):
    from moetune.kernels.moe.fp8 import quantize_weights
    from moetune.kernels.ops.fp8_scales import expand

    quantized = [quantize_weights(w, layout, transpose=k_major) for w in (w_gate_up, w_down)]
    out = db.decode_block(
        x.astype(jnp.bfloat16), logits, quantized[0][0], quantized[1][0], top_k=2, config=config,
        transpose_weights=k_major, w_gate_up_scale=quantized[0][1], w_down_scale=quantized[1][1],
        interpret=True,
    )  # fmt: skip
    dequantized = []
    for values, scale in quantized:
        w = values.astype(jnp.float32) * expand(scale, values.shape)
        dequantized.append(jnp.swapaxes(w, 1, 2) if k_major else w)
    want = moe_mlp_reference(x.astype(jnp.bfloat16).astype(jnp.float32), logits, *dequantized, top_k=2)
    return out, want


@pytest.mark.parametrize(
    "layout, hidden, inter, config",
    [
        pytest.param(
            "row_channel", 80, 48,
            db.DecodeConfig(block_f=32, block_k=32, block_h=64, block_fd=32, up_split=2),
            marks=pytest.mark.slow,
        ),
        (
            "row_channel", 80, 48,
            db.DecodeConfig(
                block_f=32, block_k=32, block_h=64, block_fd=32, up_programs=3, widen_up="f16",
                widen_down="f16", swap_ab_up=True, swap_ab_down=True,
            ),
        ),
        # H = 3 scale blocks: the last H tile of 256 runs past it, and two K splits of 128-row steps
        # leave shares a step past H, whose scales' index stays inside their array.
        (
            "block_1x128_128x128", 384, 128,
            db.DecodeConfig(
                block_f=16, block_k=128, block_h=256, block_fd=64, up_split=2, up_programs=3, swap_ab_up=True,
            ),
        ),
    ],
    ids=["row_channel", "row_channel_f16_swap_ab", "block_swap_ab"],
)  # fmt: skip
def test_fp8_tiles_past_a_dim_s_end_read_zeros_and_the_last_scales(layout, hidden, inter, config):
    x, logits, w_gate_up, w_down = _inputs(3, 4, hidden, inter, seed=8)
    assert _fp8_block_error(x, logits, w_gate_up, w_down, layout, True, config) < 1e-2


@pytest.mark.parametrize("layout", ["row_channel", "block_1x128_128x128"])
def test_fp8_weights_read_as_f16_with_x_scaled_per_row_give_the_same_block(layout):
    """widen="f16": the weights to f16, each x row to f16 times a power of two; the same products, so
    the same block as widening to bf16, but for float32 accumulation order. x's rows span 2^-30 to 2^20
    in magnitude: f16 alone would flush the one and overflow the other."""
    from moetune.kernels.moe.fp8 import quantize_weights

    x, logits, w_gate_up, w_down = _inputs(3, 4, 128, 128, seed=6)
    x = (x * jnp.array([2.0**-30, 1.0, 2.0**20])[:, None]).astype(jnp.bfloat16)
    quantized = [quantize_weights(w, layout, transpose=True) for w in (w_gate_up, w_down)]
    base = db.DecodeConfig(block_f=16, block_k=32, block_h=32, block_fd=32, down_split=2, up_programs=3)
    scales = dict(w_gate_up_scale=quantized[0][1], w_down_scale=quantized[1][1])
    block = jax.jit(  # one program to compile, not one per operation
        lambda config: db.decode_block(
            x, logits, quantized[0][0], quantized[1][0], top_k=2, transpose_weights=True, interpret=True,
            config=config, **scales,
        ),
        static_argnums=0,
    )  # fmt: skip
    outs = [
        np.asarray(block(dataclasses.replace(base, widen_up=mode, widen_down=mode)), np.float32)
        for mode in ("convert", "f16")
    ]
    for row in range(3):
        error = np.linalg.norm(outs[1][row] - outs[0][row]) / np.linalg.norm(outs[0][row])
        assert error < 1e-3, (row, error)


def test_fp8_scales_are_checked_by_name():
    from moetune.kernels.moe.fp8 import quantize_weights

    x, logits, w_gate_up, w_down = _inputs(1, 4, 256, 128)
    (qg, sg), (qd, sd) = (quantize_weights(w, "block_1x128_128x128") for w in (w_gate_up, w_down))
    call = lambda config=SMALL, **kw: db.decode_block(  # noqa: E731
        x, logits, qg, qd, top_k=2, config=config, interpret=True, **kw
    )
    with pytest.raises(ConfigInvalid, match="both weight scales"):
        call(w_gate_up_scale=sg)
    with pytest.raises(ConfigInvalid, match="straddles"):
        call(
            config=db.DecodeConfig(block_f=16, block_k=256, block_h=16, block_fd=16),
            w_gate_up_scale=sg,
            w_down_scale=sd,
        )
    with pytest.raises(ConfigInvalid, match="does not divide"):
        call(w_gate_up_scale=jnp.concatenate([sg, sg[:, :, :1]], axis=2), w_down_scale=sd)
    with pytest.raises(ConfigInvalid, match="does not divide"):
        call(w_gate_up_scale=sg[:, 0], w_down_scale=sd)  # a rank-2 scale


def test_moe_mlp_takes_the_fp8_block_when_asked_and_says_why_not_otherwise():
    from moetune.kernels.moe import layer
    from moetune.kernels.moe.fp8 import quantize_weights

    x, logits, w_gate_up, w_down = _inputs(2, 8, 256, 128, seed=6)
    x = x.astype(jnp.bfloat16)
    layout = "block_1x128_128x128"
    (qg, sg), (qd, sd) = (quantize_weights(w, layout, transpose=True) for w in (w_gate_up, w_down))
    call = dict(top_k=2, w_gate_up_scale=sg, w_down_scale=sd, scale_layout=layout, transpose_weights=True)
    choose = lambda mode: layer.decode_choice(  # noqa: E731
        x, logits, qg, 2, decode_mode=mode, scale_layout=layout, transpose_weights=True
    )
    assert choose("auto").reason == "not on a GPU" and choose("auto").kernel is None
    assert choose("interpret").kernel is not None
    from moetune.kernels.api import recording

    with recording() as calls:
        fused = layer.moe_mlp(x, logits, qg, qd, decode_mode="interpret", **call)
    assert [c.problem.op for c in calls] == ["moe_decode_block_fp8"]
    assert calls[0].problem.scale_layout == layout and calls[0].problem.transpose_rhs
    # Under jit: one program to compile rather than one per operation of the unfused path.
    unfused = jax.jit(lambda x: layer.moe_mlp(x, logits, qg, qd, decode_mode="xla", **call))(x)
    # The unfused path quantizes x and the hidden rows to FP8 as well; the block keeps them in bf16.
    error = np.linalg.norm(np.asarray(fused, np.float32) - np.asarray(unfused, np.float32))
    assert error / np.linalg.norm(np.asarray(unfused, np.float32)) < 0.1
