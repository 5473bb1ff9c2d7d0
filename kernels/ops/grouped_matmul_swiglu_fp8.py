"""The FP8 MoE gate_up GEMM with its SwiGLU: out[M, F] = silu(h[:, :F]) * h[:, F:], h the float32
product of the dequantized FP8 operands (grouped_matmul_fp8) [M, 2F], gate columns first, then up."""

from moetune.kernels.ops.grouped_matmul_fp8 import quantized

SPEC = quantized(
    "grouped_matmul_swiglu_fp8", "silu(gate) * up of the FP8 grouped GEMM into [G, K, 2F]", "swiglu"
)
