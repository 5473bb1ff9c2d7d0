"""The fused MoE decode block on FP8 expert weights: moe_decode_block's routing, gate_up, SwiGLU, down and
combine in one call, on the weights that FP8 values and their float32 scales stand for.

Operands in call order: x [T, H], router_logits [T, E] float32, w_gate_up [E, H, 2F] in float8_e4m3fn,
w_gate_up_scale, w_down [E, F, H] in float8_e4m3fn, w_down_scale; with `transpose_rhs` (t=1) the weights
are K-major, [E, 2F, H] and [E, H, F], the layout FP8 checkpoints store. Each scale covers its weight in
the Problem's `scale_layout` as kernels/ops/fp8_scales.py lays out a grouped GEMM's rhs scale, w_gate_up
as the rhs of a K=H, N=2F GEMM and w_down of a K=F, N=H one: row_channel [E, 1, N] (K-major [E, N, 1]),
block_1x128_128x128 [E, K/128, N/128] (K-major [E, N/128, K/128]), tensor [E, 1, 1]. Example: Qwen3-30B-A3B
at 8 tokens on block-scaled K-major experts is ``moe_decode_block_fp8/m=8,k=2048,n=1536,g=128,lhs=bfloat16,
rhs=float8_e4m3fn,out=bfloat16,t=1,s=block_1x128_128x128,top_k=8/v3``.

Why an op of its own rather than a dtype of moe_decode_block: its call has two more operands (the scales),
and a key must say how they cover the weights, which is what the Problem's `scale_layout` is for; as with
grouped_matmul_fp8 (its docstring), one op serves every layout, each layout tuned and looked up apart.

x and the output share one 16- or 32-bit dtype: the block widens each weight tile on chip (to x's dtype,
or to f16 beside x's tile scaled into f16 by powers of two: kernels/moe/fp8_widen.py, both exact) and
scales its product, so x is never quantized and the weights cross HBM once at one byte per value
(`touched_bytes`). The reference is moe_decode_block's on the dequantized weights (fp8_scales.dequantize),
x as it is.

Tolerance: the block's own error is a bf16 block's (1e-2: its hidden rows and output rounded once each),
but the op's baseline, the unfused FP8 path `moe_mlp` takes without the block (kernels/moe/fp8.py), also
quantizes x and the hidden rows to e4m3 in the same layout. e4m3 keeps 3 mantissa bits, so each of those
values is off by up to 2^-4 of itself, and a row of the output by about that much per quantization; two of
them make TOLERANCE's 2^-3 (0.125), which that path must meet to be timed. A wrong expert, token or scale
block is off by the size of the output itself.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from moetune.kernels.ops import fp8_scales
from moetune.kernels.ops import moe_decode_block as block
from moetune.kernels.ops.spec import Operand, OpSpec
from moetune.kernels.problem import DTYPES, Problem

if TYPE_CHECKING:
    import jax

NAME = "moe_decode_block_fp8"
WEIGHT_DTYPE = "float8_e4m3fn"
# The layouts the block's kernels scale (kernels/moe/decode_block.py): one scale per expert, per output
# channel, or per 128x128 block, each constant over a K tile.
LAYOUTS = ("tensor", "row_channel", "block_1x128_128x128")
TOLERANCE = {"bfloat16": 0.125, "float16": 0.125, "float32": 0.125}


def weight_k_n(problem: Problem, name: str) -> tuple[int, int]:
    """(K, N) of weight `name` as a GEMM's rhs: w_gate_up (H, 2F), w_down (F, H)."""
    return (problem.k, problem.n) if name == "w_gate_up" else (problem.n // 2, problem.k)


def weight_block(problem: Problem, name: str) -> tuple[int, int, int]:
    """The block of weight `name` one scale covers, in the weight's own layout (fp8_scales.BLOCKS)."""
    return fp8_scales.weight_block(*weight_k_n(problem, name), problem.scale_layout, problem.transpose_rhs)


def scale_shape(problem: Problem, name: str) -> tuple[int, ...]:
    """The shape of weight `name`'s scale: the weight's shape divided by its block, axis by axis."""
    return fp8_scales.blocks_of(block.SPEC.operand(name).shape(problem), weight_block(problem, name))


def _scale(name: str) -> Operand:
    return Operand(
        f"{name}_scale",
        lambda p: scale_shape(p, name),
        lambda p: fp8_scales.SCALE_DTYPE,
        kind="scale",
        scales=name,
        layout="by_problem",
    )


def reference(
    x: jax.Array,
    router_logits: jax.Array,
    w_gate_up: jax.Array,
    w_gate_up_scale: jax.Array,
    w_down: jax.Array,
    w_down_scale: jax.Array,
    *,
    transpose_rhs: bool,
    top_k: int,
    scale_layout: str,
) -> jax.Array:
    """moe_decode_block's float32 reference on the dequantized weights; x as it is."""
    weights = fp8_scales.dequantize(w_gate_up, w_gate_up_scale), fp8_scales.dequantize(w_down, w_down_scale)
    return block.reference(x, router_logits, *weights, transpose_rhs=transpose_rhs, top_k=top_k)


def problem_of(
    x: Any, router_logits: Any, w_gate_up: Any, *, top_k: int, transpose_rhs: bool, scale_layout: str
) -> Problem:
    """The Problem of a call of the FP8 block on these operands (arrays or jax.ShapeDtypeStructs): the
    output in x's dtype. ValueError (ConfigInvalid for the op's rules) naming the first misfit."""
    m, k, n, g = block.dims_of(x, router_logits, w_gate_up, transpose_rhs)
    dtype = np.dtype(x.dtype).name
    return Problem(
        NAME, m, k, n, g, dtype, np.dtype(w_gate_up.dtype).name, dtype, transpose_rhs, scale_layout, top_k
    )


def _dtypes(problem: Problem) -> str | None:
    if problem.rhs_dtype != WEIGHT_DTYPE:
        return f"takes {WEIGHT_DTYPE} weights; got rhs={problem.rhs_dtype}"
    if problem.lhs_dtype not in DTYPES or problem.out_dtype != problem.lhs_dtype:
        return (
            f"takes x and the output in one 16- or 32-bit dtype; got lhs={problem.lhs_dtype}, "
            f"out={problem.out_dtype}"
        )
    return None


def _kernel_layout(problem: Problem) -> str | None:
    if problem.scale_layout not in LAYOUTS:
        return f"scales weights in {', '.join(LAYOUTS)}; got scale_layout={problem.scale_layout}"
    return None


def _whole_blocks(problem: Problem) -> str | None:
    """Block scales need H and F in whole 128-blocks: both weights' K and N."""
    if problem.scale_layout != "block_1x128_128x128":
        return None
    hidden, inter = problem.k, problem.n // 2
    if hidden % fp8_scales.BLOCK or inter % fp8_scales.BLOCK:
        return (
            f"with scale_layout={problem.scale_layout} needs H and F multiples of {fp8_scales.BLOCK}; "
            f"got H={hidden}, F={inter}"
        )
    return None


@dataclasses.dataclass(frozen=True)
class QuantizedBlockSpec(OpSpec):
    """The block's spec on FP8 weights: `draw` of a weight gives (values, scale), quantized from one
    float32 draw (fp8_scales.draw_quantized), and the kernels and the reference take the layout."""

    def draw(self, problem: Problem, name: str, key: Any) -> Any:
        operand = self.operand(name)
        if not operand.weights:
            return super().draw(problem, name, key)
        # Output channels differ in loudness (draw_quantized): the weight's N axis.
        return fp8_scales.draw_quantized(
            key,
            operand.shape(problem),
            weight_block(problem, name),
            operand.dtype(problem),
            float(operand.stddev(problem)),
            1 if problem.transpose_rhs else 2,
        )

    def options(self, problem: Problem) -> dict[str, Any]:
        return {**super().options(problem), "scale_layout": problem.scale_layout}


SPEC = QuantizedBlockSpec(
    name=NAME,
    summary="out[T, H] = the routed MoE MLP block of x[T, H] on FP8 expert weights with float32 scales",
    operands=(
        block.X,
        block.ROUTER_LOGITS,
        block.W_GATE_UP,
        _scale("w_gate_up"),
        block.W_DOWN,
        _scale("w_down"),
    ),
    out_shape=lambda p: (p.m, p.k),
    reference=reference,
    dims_of=block.dims_of,
    flops=block.flops,
    checks=(_dtypes, block._even_n, _kernel_layout, _whole_blocks),
    tolerance=TOLERANCE,
    out_columns="H",
    routed=True,
    touched_bytes=block.touched_bytes,
)
