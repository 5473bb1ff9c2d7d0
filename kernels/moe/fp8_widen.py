"""How the FP8 decode block's dots read their float8 weight tiles inside its Pallas Triton kernels.

The FP8 block streams its weights at a byte a value and multiplies each tile by a few 16-row x tiles in
registers, where the tile must first become a type the tensor cores take with x. Three ways (the block's
`widen_up` / `widen_down` fields), each exact: the dot multiplies the very values the weights and x
stand for, and only float32 accumulation order may differ.

  convert  the tile to x's dtype by `astype`: Triton's conversion, for bf16 an F2FP unpacking two e4m3
           values to f16 and an F2F per value to bf16 (the compiled SASS), 1.5 conversion instructions a
           value, on a pipe the CUDA guide rates at 16 results per clock per SM on compute capability 9.0.
  bits     the tile to bf16 by integer operations on four values at once (E4M3_TO_BF16, below), then one
           bf16 multiply-add per pair: no conversion instruction.
  f16      the tile to f16 (the F2FP alone: every e4m3 and e5m2 value is an f16 value) and x's tile to
           f16 too, each row first multiplied by the power of two that brings its largest magnitude into
           [2^14, 2^15); the dot's rows are multiplied back after. A 16-bit x value is an f16 value once
           scaled so (f16 keeps 11 significant bits, bf16 8; values more than 2^28 below their row's
           largest become f16 subnormals, far under the output's rounding): 0.5 conversions a weight
           value, plus x's few.

The bits sequence: e4m3's sign, exponent and mantissa bits placed where bf16 keeps them make a bf16 of the
value times 2^-120 (exponent biases 7 and 127; a subnormal e4m3 lands on a subnormal bf16 of the same
mantissa), and a multiply by 2^120 restores it exactly. e4m3fn's NaN codes (all seven low bits set) would
land on 480: their lanes get a NaN addend instead. Per 32-bit word of four codes b0..b3:
  a0, a1 = the codes (b0, b1) and (b2, b3) each in the high byte of a 16-bit lane (two prmt)
  t = (a & 0x7f007f00) >> 4 | (a & 0x80008000)  the bf16 bits of value * 2^-120
  n = (a & 0x7f007f00) + 0x01000100             bit 15 of a lane set where its code is NaN
  c = n's bit 15 copied over its lane (prmt)    0xffff (a bf16 NaN) or +0
  out = t * 2^120 + c                           fma.rn.bf16x2: exact, NaN where the code is NaN
Seven instructions a pair, six on the integer pipe (64 results a clock per SM); a negative zero widens to
+0, which no dot can tell apart (its float32 accumulator starts at +0).

Which is fastest is the GPU's to say; cost_model_decode.py weighs each by its instructions' pipe.
Pallas's interpreter runs no PTX: there `bits` widens by astype (the same values), and
tests/kernels/test_fp8_widen.py executes the PTX text itself, on every code in every byte of a word, with
a small model of its instructions.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.pallas import triton as pltriton

Array = Any
MODES = ("convert", "bits", "f16")
# 2^120 in bfloat16 (exponent 247), twice over: one per 16-bit lane.
BF16_2_POW_120 = 0x7B807B80
E4M3_TO_BF16 = f"""{{
.reg .b32 a0, a1, m0, m1, t0, t1, n0, n1, c0, c1, k;
mov.b32 k, {BF16_2_POW_120:#x};
prmt.b32 a0, $2, 0, 0x1404;
prmt.b32 a1, $2, 0, 0x3424;
and.b32 m0, a0, 0x7f007f00;
and.b32 m1, a1, 0x7f007f00;
shr.b32 t0, m0, 4;
shr.b32 t1, m1, 4;
lop3.b32 t0, t0, a0, 0x80008000, 0xf8;
lop3.b32 t1, t1, a1, 0x80008000, 0xf8;
add.u32 n0, m0, 0x01000100;
add.u32 n1, m1, 0x01000100;
prmt.b32 c0, n0, 0, 0xbb99;
prmt.b32 c1, n1, 0, 0xbb99;
fma.rn.bf16x2 $0, t0, k, c0;
fma.rn.bf16x2 $1, t1, k, c1;
}}"""


def unfit_reason(mode: str, weights_dtype: Any, dtype: Any) -> str | None:
    """None where `mode` reads `weights_dtype` tiles with x in `dtype`, else a short reason."""
    if mode not in MODES:
        return f"widen={mode!r} is not one of {MODES}"
    weights, x = jnp.dtype(weights_dtype), jnp.dtype(dtype)
    if mode == "bits" and (weights != jnp.float8_e4m3fn or x != jnp.bfloat16):
        return f"widen='bits' reads float8_e4m3fn weights with bfloat16 x, not {weights} with {x}"
    if mode == "f16" and (weights.itemsize != 1 or x.itemsize != 2):
        return f"widen='f16' reads float8 weights with 16-bit x, not {weights} with {x}"
    return None


def operands(rows_in: Array, w: Array, mode: str, interpret: bool) -> tuple[Array, Array, Array | None]:
    """(x tile, weight tile, per-row factor or None) for the dot by `mode` (unfit_reason checked): the dot
    of the two, each row times its factor, is rows_in @ w's values."""
    if mode == "f16":
        rows, factor = _rows_to_f16(rows_in)
        return rows, w.astype(jnp.float16), factor
    return rows_in, widen(w, rows_in.dtype, mode, interpret), None


def widen(w: Array, dtype: Any, mode: str, interpret: bool) -> Array:
    """The tile `w` in `dtype`, widened by `mode` ("convert" or "bits")."""
    if mode == "convert" or interpret:  # the interpreter runs no PTX: the same values by astype
        return w.astype(dtype)
    (out,) = pltriton.elementwise_inline_asm(
        E4M3_TO_BF16, args=[w], constraints="=r,=r,r", pack=4,
        result_shape_dtypes=[jax.ShapeDtypeStruct(w.shape, jnp.bfloat16)],
    )  # fmt: skip
    return out


def _rows_to_f16(rows: Array) -> tuple[Array, Array]:
    """Each row of a 16-bit [R, K] tile times 2^p in f16, p bringing its largest magnitude into
    [2^14, 2^15) (clipped to float32's normal powers), and 2^-p per row as float32. Powers of two are
    built from their exponent bits: exact, and no division. A NaN row stays NaN."""
    values = rows.astype(jnp.float32)
    largest = jnp.max(jnp.abs(values), axis=1)
    exponent = (jax.lax.bitcast_convert_type(largest, jnp.int32) >> 23) & 0xFF  # 127 + floor(log2)
    p = jnp.clip(127 + 14 - exponent, -126, 126)
    up = jax.lax.bitcast_convert_type((p + 127) << 23, jnp.float32)
    down = jax.lax.bitcast_convert_type((127 - p) << 23, jnp.float32)
    return (values * up[:, None]).astype(jnp.float16), down
