"""`moe_mlp` on FP8 expert weights: activations quantized on the fly, both GEMMs FP8 ops.

    x[T, H] --quantize (per token, per 1x128 block, or per tensor)--> FP8 x, float32 scales
            -- gather by expert (values and their per-row scales) --> [T*k, H] FP8
            -- grouped_matmul_swiglu_fp8 x w_gate_up [E, H, 2F] FP8 --> [T*k, F] bf16
            -- quantize again --> grouped_matmul_fp8 x w_down [E, F, H] FP8 --> combine --> [T, H]

"Not a separate pass", on xla: the quantization is elementwise work and one reduction per block inside
the same jitted program as the gather and the GEMMs, so XLA fuses it into the gather that already reads x
and writes the permuted copy; no FP8 copy of x is written to memory and read back before the gather by a
program of its own. x is quantized before the gather, not after: a token's k copies share its scale, and
the permuted copy moves one byte per value instead of two. The layout is one of the FP8 op layouts
(kernels/ops/fp8_scales.py); the weights' scales come with them, the activations' are computed here.

With `transpose_weights` the weights are K-major, w_gate_up [E, 2F, H] and w_down [E, H, F] (each
expert's nn.Linear [out, in], as FP8 checkpoints store them): the layout Hopper's 8-bit wgmma reads, so
mosaic_gpu serves those GEMMs; [E, H, 2F] weights fall through to xla there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from moetune.kernels.api import call_scaled_op, explain
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.moe.reference import check_moe_args, gated_activation
from moetune.kernels.ops import GROUPED_MATMUL_FP8, GROUPED_MATMUL_SWIGLU_FP8, fp8_scales
from moetune.kernels.problem import FP8_DTYPES, Problem

Array = Any
FUSED_OP = {"swiglu": GROUPED_MATMUL_SWIGLU_FP8}  # the FP8 ops fusing an activation


def moe_mlp_fp8(
    x: Array,
    router_logits: Array,
    w_gate_up: Array,
    w_gate_up_scale: Array,
    w_down: Array,
    w_down_scale: Array,
    *,
    top_k: int,
    scale_layout: str,
    renormalize: bool = True,
    activation: str = "swiglu",
    backend: str | None = None,
    fuse: bool = True,
    routing_mode: str = "auto",
    transpose_weights: bool = False,
    group_offset: Array | None = None,
) -> Array:
    """Routed MoE MLP as `moe_mlp`, with w_gate_up [E, H, 2F] and w_down [E, F, H] in FP8 ([E, 2F, H]
    and [E, H, F] with `transpose_weights`) and their float32 scales in `scale_layout`; x and the hidden
    rows are quantized to the weights' FP8 dtype in the same layout on the fly. Returns [T, H] in x's
    dtype. `group_offset` as moe_mlp's: the weights and their scales hold the local slice of experts
    [offset, offset + E_local), and the result sums over those only. ConfigInvalid names a scale whose
    shape or dtype does not fit, or weights that are not FP8."""
    from moetune.kernels.moe.layer import _all_experts, _down_and_combine, route_rows

    # Checked as the [E, K, N] weights they are the transposes of, a local slice as the whole layer's.
    weights = [_as_kn(w) if transpose_weights else w for w in (w_gate_up, w_down)]
    if group_offset is not None:
        weights = [_all_experts(w, router_logits) for w in weights]
    check_moe_args(x, router_logits, *weights, top_k=top_k, activation=activation)
    dtype = _fp8_dtype(w_gate_up, w_down)
    tokens, hidden = x.shape
    m = tokens * top_k
    gate_up = _problem(m, w_gate_up, dtype, scale_layout, GROUPED_MATMUL_FP8, transpose_weights)
    down = _problem(m, w_down, dtype, scale_layout, GROUPED_MATMUL_FP8, transpose_weights)
    fp8_scales.check_scale(gate_up, "rhs", w_gate_up_scale, "w_gate_up_scale")
    fp8_scales.check_scale(down, "rhs", w_down_scale, "w_down_scale")

    routing, rows = route_rows(router_logits, top_k, renormalize, routing_mode)
    # Quantized per token of x (the problem's block of lhs over T rows, not T*k), then gathered.
    qx, x_scale = fp8_scales.quantize(x, _lhs_block(gate_up, tokens), dtype)
    permuted = jnp.take(qx, rows.row_token, axis=0, mode="clip")
    if x_scale.shape[0] == tokens:
        x_scale = jnp.take(x_scale, rows.row_token, axis=0, mode="clip")
    # Under group_offset the rows of other experts come out zero, and so add nothing to the combine.
    scales = {"scale_layout": scale_layout, "backend": backend, "transpose_rhs": transpose_weights}
    scales |= {"group_offset": group_offset}

    fused_op = FUSED_OP.get(activation) if fuse else None
    if fused_op is not None and _serves(fused_op, gate_up, backend):
        out_dtype = x.dtype
        hidden_rows = call_scaled_op(
            fused_op, permuted, x_scale, w_gate_up, w_gate_up_scale, rows.group_sizes,
            preferred_element_type=out_dtype, **scales,
        )  # fmt: skip
    else:
        product = call_scaled_op(
            GROUPED_MATMUL_FP8, permuted, x_scale, w_gate_up, w_gate_up_scale, rows.group_sizes,
            preferred_element_type=jnp.float32, **scales,
        )  # fmt: skip
        hidden_rows = gated_activation(activation, product).astype(x.dtype)

    def down_gemm(h: Array, w: Array, group_sizes: Array) -> Array:
        qh, h_scale = fp8_scales.quantize(h, _lhs_block(down, m), dtype)
        return call_scaled_op(
            GROUPED_MATMUL_FP8, qh, h_scale, w, w_down_scale, group_sizes,
            preferred_element_type=x.dtype, **scales,
        )  # fmt: skip

    return _down_and_combine(down_gemm, hidden_rows, rows, w_down, routing)


def quantize_weights(
    w: Array, scale_layout: str, dtype: str = "float8_e4m3fn", *, transpose: bool = False
) -> tuple[Array, Array]:
    """Expert weights [E, K, N] (w_gate_up [E, H, 2F] or w_down [E, F, H]) as (FP8 values, float32
    scales) in `scale_layout`: each block's largest magnitude maps to the dtype's largest value. With
    `transpose`, K-major: values [E, N, K] and their scales in that layout (`transpose_weights`)."""
    g, k, n = w.shape
    problem = Problem(
        GROUPED_MATMUL_FP8, 1, k, n, g, dtype, dtype, "bfloat16", transpose_rhs=transpose,
        scale_layout=scale_layout,
    )  # fmt: skip
    values = jnp.swapaxes(w, 1, 2) if transpose else w
    return fp8_scales.quantize(values, fp8_scales.block_shape(problem, "rhs"), dtype)


def _as_kn(w: Array) -> Any:
    """The shape and dtype of K-major weights [E, N, K] read as [E, K, N] (no copy: a check needs no data)."""
    shape = (*w.shape[:-2], w.shape[-1], w.shape[-2]) if w.ndim >= 2 else w.shape
    return jax.ShapeDtypeStruct(shape, w.dtype)


def _fp8_dtype(w_gate_up: Array, w_down: Array) -> str:
    dtypes = {jnp.dtype(w_gate_up.dtype).name, jnp.dtype(w_down.dtype).name}
    if len(dtypes) != 1 or not dtypes <= set(FP8_DTYPES):
        raise ConfigInvalid(
            f"FP8 weights must share one dtype of {', '.join(FP8_DTYPES)}; "
            f"got w_gate_up {w_gate_up.dtype}, w_down {w_down.dtype}"
        )
    return dtypes.pop()


def _problem(m: int, w: Array, dtype: str, scale_layout: str, op: str, transpose: bool) -> Problem:
    g, k, n = (w.shape[0], w.shape[2], w.shape[1]) if transpose else w.shape
    return Problem(op, m, k, n, g, dtype, dtype, "bfloat16", transpose, scale_layout=scale_layout)


def _lhs_block(problem: Problem, rows: int) -> tuple[int, int]:
    """The activation block one scale covers, over `rows` rows (a per-tensor scale covers all of them)."""
    block_rows, block_k = fp8_scales.block_shape(problem, "lhs")
    return (rows if block_rows == problem.m else block_rows), block_k


def _serves(op: str, like: Problem, backend: str | None) -> bool:
    """Whether the first backend asked for `op` computes it itself (as layer.serves, for FP8 ops)."""
    try:
        explanation = explain(dataclasses.replace(like, op=op), backend=backend)
    except (Unsupported, ConfigInvalid, ExceptionGroup):
        return False
    return not explanation.declined
