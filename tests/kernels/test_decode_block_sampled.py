"""The fused decode block on seeded random draws of everything at once: the batch, the expert count and
top_k, H and F the tiles need not divide, renormalized or not, both weight layouts, a slice of the
experts (group_offset), 16-bit or FP8 weights in each scale layout and widening, and every field of
the block's tiling. The other tests take one feature at a time; these take them together, as a sweep's
candidates do, in Pallas's interpreter against the float32 reference."""

from __future__ import annotations

import dataclasses
import random

import jax.numpy as jnp
import numpy as np
import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe import decode_block as db
from moetune.kernels.moe import fp8_widen
from moetune.kernels.moe.fp8 import quantize_weights
from moetune.kernels.moe.reference import moe_mlp_reference
from moetune.kernels.ops.fp8_scales import expand
from tests.kernels.test_decode_block import _inputs

# Every DecodeConfig field, at values that fit small shapes: tiles of 16 and 32 (the dims below are 32
# to 144), and up_programs both below and past the work list of a few experts.
TILING = {
    "block_f": (16, 32),
    "block_k": (16, 32),
    "stages_up": (2, 3),
    "warps_up": (4, 8, 16),
    "block_h": (16, 32),
    "block_fd": (16, 32),
    "stages_down": (2, 3),
    "warps_down": (4, 8),
    "down_split": (1, 2, 3, 4),
    "up_split": (1, 2, 3),
    "up_programs": (0, 1, 3, 5, 7, 64),
    "route_by_rank": (False, True),
    "route_warp_rows": (False, True),
    "widen_up": fp8_widen.MODES,
    "widen_down": fp8_widen.MODES,
    "swap_ab_up": (False, True),
    "swap_ab_down": (False, True),
}
LAYOUTS = ("none", "tensor", "row_channel", "block_1x128_128x128")
SEEDS = range(12)
FAST = 2  # the first draws run in the fast tier, the rest in the slow one


@dataclasses.dataclass(frozen=True)
class Draw:
    tokens: int
    experts: int
    top_k: int
    hidden: int
    inter: int
    renormalize: bool
    k_major: bool
    local: tuple[int, int] | None  # [first, end) of the experts the weights hold, or all of them
    layout: str  # "none": 16-bit weights
    config: db.DecodeConfig


def draw(seed: int) -> Draw:
    """A random case the block takes: redrawn until the config fits the shape and the weights."""
    rng = random.Random(seed)
    while True:
        layout = LAYOUTS[seed % len(LAYOUTS)]  # each layout as often as the others
        tokens = rng.choice((1, 2, 3, 5, 8, 13))
        experts = rng.choice((4, 8, 16, 24))
        top_k = rng.randint(1, min(4, experts))
        # Block scales cover 128 rows: their K dims are multiples of 128 (a last partial block of scales
        # is the tails test's, test_decode_block_fp8.py); the others any multiple of 16, 144 included.
        dims = (128,) if layout == "block_1x128_128x128" else (32, 48, 80, 144)
        hidden, inter = rng.choice(dims), rng.choice(dims)
        values = {name: rng.choice(choices) for name, choices in TILING.items()}
        if layout == "none":  # 16-bit weights take no widening and no swapped operands
            values |= {
                "widen_up": "convert",
                "widen_down": "convert",
                "swap_ab_up": False,
                "swap_ab_down": False,
            }
        elif layout == "block_1x128_128x128":  # a K tile within one block of scales
            values["block_k"] = min(values["block_k"], 128)
        try:
            config = db.DecodeConfig(**values)
        except ConfigInvalid:
            continue
        if db.unfit_reason(tokens, experts, top_k, hidden, inter, config):
            continue
        weights = "bfloat16" if layout == "none" else "float8_e4m3fn"
        dtype = "float32" if layout == "none" else "bfloat16"
        if db.widening_unfit_reason(config, jnp.dtype(weights), jnp.dtype(weights), jnp.dtype(dtype)):
            continue
        first = rng.randint(0, experts // 2)
        local = (first, rng.randint(first + 1, experts)) if rng.random() < 0.3 else None
        renormalize, k_major = rng.random() < 0.5, rng.random() < 0.4
        return Draw(tokens, experts, top_k, hidden, inter, renormalize, k_major, local, layout, config)


def test_every_tiling_field_is_drawn():
    assert set(TILING) == {f.name for f in dataclasses.fields(db.DecodeConfig)}


@pytest.mark.parametrize(
    "seed", [pytest.param(s, marks=() if s < FAST else pytest.mark.slow, id=f"draw{s}") for s in SEEDS]
)
def test_a_random_draw_of_every_feature_equals_the_reference(seed):
    case = draw(seed)
    x, logits, w_gate_up, w_down = _inputs(case.tokens, case.experts, case.hidden, case.inter, seed=seed)
    first, end = case.local or (0, case.experts)
    local = [w[first:end] for w in (w_gate_up, w_down)]
    options = dict(top_k=case.top_k, renormalize=case.renormalize, config=case.config, interpret=True)
    if case.local is not None:
        options["group_offset"] = jnp.array([first], jnp.int32)
    if case.layout == "none":
        x_in = x
        weights = [jnp.swapaxes(w, 1, 2) if case.k_major else w for w in local]
        reference_weights = local
    else:
        x_in = x.astype(jnp.bfloat16)
        quantized = [quantize_weights(w, case.layout, transpose=case.k_major) for w in local]
        weights = [values for values, _ in quantized]
        options |= {"w_gate_up_scale": quantized[0][1], "w_down_scale": quantized[1][1]}
        reference_weights = []
        for values, scale in quantized:  # what the FP8 values and scales stand for
            w = values.astype(jnp.float32) * expand(scale, values.shape)
            reference_weights.append(jnp.swapaxes(w, 1, 2) if case.k_major else w)
    out = db.decode_block(x_in, logits, *weights, transpose_weights=case.k_major, **options)
    # The experts the weights do not hold contribute nothing: the reference takes them as zeros.
    whole = [
        jnp.zeros((case.experts, *w.shape[1:]), jnp.float32).at[first:end].set(w) for w in reference_weights
    ]
    want = moe_mlp_reference(
        x_in.astype(jnp.float32), logits, *whole, top_k=case.top_k, renormalize=case.renormalize
    )
    got, want = np.asarray(out, np.float32), np.asarray(want)
    assert np.all(np.isfinite(got)), case
    if case.layout == "none":
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=str(case))
    else:  # bf16 x and hidden rows, out rounded once: within bf16's rounding
        error = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
        assert error < 1e-2, (error, case)
