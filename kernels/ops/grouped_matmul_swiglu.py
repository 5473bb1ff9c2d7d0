"""The MoE gate_up GEMM with its SwiGLU: out[M, F] = silu(h[:, :F]) * h[:, F:], h = lhs @ rhs[g] [M, 2F]
in float32 (gate columns first, then up, as in moe_mlp_reference)."""

from moetune.kernels.ops.grouped_matmul import gated

SPEC = gated("grouped_matmul_swiglu", "swiglu", "silu(gate) * up of the grouped GEMM into [G, K, 2F]")
