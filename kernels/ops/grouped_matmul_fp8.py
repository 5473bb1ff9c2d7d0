"""The FP8 grouped GEMM: out[rows of g] = dequant(lhs)[rows of g] @ dequant(rhs[g]), float32 accumulation.

lhs [m, k] and rhs [g, k, n] ([g, n, k] when `transpose_rhs`) in float8_e4m3fn (or e5m2), each with its
float32 scale in the Problem's `scale_layout` (kernels/ops/fp8_scales.py gives the shapes), group sizes
[g] int32 -> out [m, n], bf16 unless asked otherwise. Call order: lhs, lhs_scale, rhs, rhs_scale,
group_sizes. Rows past sum(group_sizes) are zero. Its gated form (`gated_fp8`) is
grouped_matmul_swiglu_fp8.

One op for every layout, the layout in the Problem (and its key), rather than one op per layout: the math
is the same (dequantize, then the grouped GEMM), only the scales' shapes differ, and a backend serves
layouts, not ops, by declining the ones it cannot (Backend.check_problem); six op names would repeat one
spec three times and make every "which ops does X serve" table three times as long.

Tolerance (relative error against the float32 reference of the dequantized operands, the worst row): the
inputs are already FP8, so the kernel and the reference multiply the same values; what differs is the
order of float32 accumulation, scaling after the sum instead of before (exact but for float32 rounding,
2^-24), and the output's rounding. A bf16 output rounds each value to 8 significant bits, a relative
error of at most 2^-8 = 3.9e-3 per value, hence per row (measured on CPU: 1-2e-3). The bf16 tolerance is
twice that, 8e-3: the other half is room for accumulation, which on Hopper's FP8 tensor cores keeps fewer
bits than float32 within one 128-wide K step, before the kernel promotes the partial sum into float32
registers. A wrong scale, block or expert is off by far more (tens of percent). The bf16 ops' 1e-2 has
room for bf16 *inputs* rounded differently as well; here the inputs are exact. f16 and f32 outputs: twice
their own rounding (2^-11; 2^-24 plus accumulation order), as the 16-bit ops allow.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.ops import fp8_scales
from moetune.kernels.ops.grouped_matmul import GROUP_SIZES, LHS, RHS, _even_n, dims_of, flops
from moetune.kernels.ops.spec import Operand, OpSpec
from moetune.kernels.problem import DTYPES, FP8_DTYPES, Problem

if TYPE_CHECKING:
    import jax

TOLERANCE = {"bfloat16": 8e-3, "float16": 1e-3, "float32": 1e-5}
LHS_SCALE = Operand(
    "lhs_scale",
    lambda p: fp8_scales.scale_shape(p, "lhs"),
    lambda p: fp8_scales.SCALE_DTYPE,
    kind="scale",
    scales="lhs",
    layout="by_problem",
)
RHS_SCALE = dataclasses.replace(
    LHS_SCALE, name="rhs_scale", shape=lambda p: fp8_scales.scale_shape(p, "rhs"), scales="rhs"
)
OPERANDS = (LHS, LHS_SCALE, RHS, RHS_SCALE, GROUP_SIZES)


@dataclasses.dataclass(frozen=True)
class QuantizedOpSpec(OpSpec):
    """An op on FP8 operands with scales: `draw` of "lhs" or "rhs" gives (values, scale), quantized from
    one float32 draw (fp8_scales.draw_quantized), since a scale means nothing apart from its values."""

    def draw(self, problem: Problem, name: str, key: Any) -> tuple[jax.Array, jax.Array]:
        operand = self.operand(name)
        if operand.stddev is None:
            raise ConfigInvalid(f"op {self.name}: {name} is drawn with the operand it scales, not alone")
        shape = operand.shape(problem)
        # Rows of lhs, output columns of rhs differ in loudness (draw_quantized).
        spread_axis = 0 if name == "lhs" else (1 if problem.transpose_rhs else 2)
        return fp8_scales.draw_quantized(
            key,
            shape,
            fp8_scales.block_shape(problem, name),
            operand.dtype(problem),
            float(operand.stddev(problem)),
            spread_axis,
        )


def reference(
    lhs: jax.Array,
    lhs_scale: jax.Array,
    rhs: jax.Array,
    rhs_scale: jax.Array,
    group_sizes: jax.Array,
    *,
    transpose_rhs: bool,
) -> jax.Array:
    """The float32 grouped GEMM of the dequantized operands (float32 products at HIGHEST precision)."""
    from moetune.kernels.reference import reference_grouped_matmul  # jax: imported where a reference runs

    return reference_grouped_matmul(
        fp8_scales.dequantize(lhs, lhs_scale),
        fp8_scales.dequantize(rhs, rhs_scale),
        group_sizes,
        transpose_rhs=transpose_rhs,
    )


def quantized(name: str, summary: str, activation: str = "") -> QuantizedOpSpec:
    """The FP8 grouped GEMM `name`, followed by `activation` (a gate of kernels.moe.reference.GATES) on
    its float32 product when given, as the 16-bit gated ops (grouped_matmul.gated)."""

    def op_reference(*operands: jax.Array, transpose_rhs: bool) -> jax.Array:
        from moetune.kernels.moe.reference import gated_activation

        product = reference(*operands, transpose_rhs=transpose_rhs)
        return gated_activation(activation, product) if activation else product

    op_reference.__name__ = f"{name}_reference"
    gated = bool(activation)
    return QuantizedOpSpec(
        name=name,
        summary=summary,
        operands=OPERANDS,
        out_shape=(lambda p: (p.m, p.n // 2)) if gated else (lambda p: (p.m, p.n)),
        reference=op_reference,
        dims_of=dims_of,
        flops=flops,
        operand_dtypes=FP8_DTYPES,
        out_dtypes=DTYPES,
        checks=((_even_n,) if gated else ()) + (fp8_scales.divisible_blocks,),
        tolerance=TOLERANCE,
        epilogue=activation,
        rhs_columns_per_out_column=2 if gated else 1,
        out_columns="F" if gated else "N",
        vjp=None,  # inference: FP8 training needs scaled gradients, a design of its own
    )


SPEC = quantized(
    "grouped_matmul_fp8", "out[M, N] = dequant(lhs) @ dequant(rhs[g]) per group, FP8 operands with scales"
)
