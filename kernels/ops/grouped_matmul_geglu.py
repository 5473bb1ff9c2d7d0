"""The MoE gate_up GEMM with its GeGLU: out[M, F] = gelu(h[:, :F]) * h[:, F:] with the tanh form of
GELU, h = lhs @ rhs[g] [M, 2F] in float32 (gate columns first, then up, as in moe_mlp_reference)."""

from moetune.kernels.ops.grouped_matmul import gated

SPEC = gated("grouped_matmul_geglu", "geglu", "gelu_tanh(gate) * up of the grouped GEMM into [G, K, 2F]")
