"""Shapes of the benchmark decoder models: a frozen, hashable config (a static jit argument) and presets."""

from __future__ import annotations

import dataclasses

from moetune.kernels.errors import ConfigInvalid


@dataclasses.dataclass(frozen=True, slots=True)
class ModelConfig:
    """A Mixtral-style decoder: RMSNorm, grouped-query attention with RoPE, and a top-k MoE MLP.

    Two options cover the other families' blocks: `qk_norm` RMSNorms each query and key head before RoPE
    (Qwen3), and `shared_experts` dense SwiGLU experts of `shared_intermediate` each run on every token
    beside the routed ones and add to their output (DeepSeek, Qwen2-MoE, Qwen3-Next; their sum is one
    dense MLP of shared_experts * shared_intermediate, as DeepSeek's code builds it; Qwen's sigmoid gate
    on that output is left out).

    `experts_scale_layout` puts the routed experts in FP8 (e4m3, K-major: w_gate_up [E, 2F, H], w_down
    [E, H, F], with float32 scales in that layout; kernels/ops/fp8_scales.py), quantized from the same
    random draw as the `dtype` experts, so the two models differ only by quantization; "none": the
    experts in `dtype`. Everything else stays in `dtype`.
    """

    name: str
    vocab: int
    hidden: int  # H
    intermediate: int  # F, per expert
    layers: int
    heads: int  # query heads
    kv_heads: int
    head_dim: int
    experts: int  # E
    top_k: int
    rope_theta: float = 1e6
    norm_eps: float = 1e-5
    dtype: str = "bfloat16"
    qk_norm: bool = False
    shared_experts: int = 0
    shared_intermediate: int = 0  # per shared expert
    experts_scale_layout: str = "none"

    def __post_init__(self) -> None:
        for field in (
            "vocab",
            "hidden",
            "intermediate",
            "layers",
            "heads",
            "kv_heads",
            "head_dim",
            "experts",
        ):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigInvalid(f"{field}={value!r} must be a positive integer")
        for field in ("shared_experts", "shared_intermediate"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigInvalid(f"{field}={value!r} must be a non-negative integer")
        if bool(self.shared_experts) != bool(self.shared_intermediate):
            raise ConfigInvalid(
                f"shared_experts={self.shared_experts} and shared_intermediate={self.shared_intermediate}: "
                "both zero or both positive"
            )
        if self.heads % self.kv_heads:
            raise ConfigInvalid(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.head_dim % 2:
            raise ConfigInvalid(f"head_dim={self.head_dim} must be even for RoPE")
        if not 1 <= self.top_k <= self.experts:
            raise ConfigInvalid(f"top_k={self.top_k} must be in [1, experts={self.experts}]")
        if self.experts_scale_layout != "none":
            from moetune.kernels.ops import fp8_scales

            if self.experts_scale_layout not in fp8_scales.BLOCKS:
                raise ConfigInvalid(
                    f"experts_scale_layout={self.experts_scale_layout!r} is not one of "
                    f"none, {', '.join(fp8_scales.BLOCKS)}"
                )
            blocked = self.experts_scale_layout.startswith("block")
            if blocked and (self.hidden % fp8_scales.BLOCK or self.intermediate % fp8_scales.BLOCK):
                raise ConfigInvalid(
                    f"experts_scale_layout={self.experts_scale_layout} needs hidden and intermediate "
                    f"multiples of {fp8_scales.BLOCK}; got {self.hidden}, {self.intermediate}"
                )

    def with_layers(self, layers: int | None) -> ModelConfig:
        return self if layers is None else dataclasses.replace(self, layers=layers)

    def decode_step_bytes(self, batch: int, context: int) -> int:
        """The least a decode step of `batch` tokens reads from memory: every weight but the embedding
        table (one row per token) and the experts no token routes to (at most batch * top_k of them per
        layer have rows), and the KV cache of `context` positions."""
        itemsize = self.itemsize
        h, d = self.hidden, self.head_dim
        attention = h * (self.heads + 2 * self.kv_heads) * d + self.heads * d * h
        shared = 3 * h * self.shared_experts * self.shared_intermediate
        touched = min(self.experts, batch * self.top_k) * 3 * h * self.intermediate * self.expert_itemsize
        per_layer = (attention + shared + h * self.experts) * itemsize + touched  # with the router
        kv_cache = 2 * self.kv_heads * d * context * batch * itemsize
        return self.layers * (per_layer + kv_cache) + h * self.vocab * itemsize

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def expert_itemsize(self) -> int:
        """Bytes of one expert weight: 1 in FP8 (its scales, one float per 128 x 128 block or per
        channel, add well under 1%), else the model's dtype's."""
        return 1 if self.experts_scale_layout != "none" else self.itemsize

    @property
    def expert_weight_bytes(self) -> int:
        """Bytes of the routed experts' weights, all layers (the shared experts' are not counted)."""
        return self.layers * self.experts * 3 * self.hidden * self.intermediate * self.expert_itemsize


MODELS: dict[str, ModelConfig] = {
    # Mixtral-8x7B (mistralai/Mixtral-8x7B-v0.1 config.json): 46.7B parameters, 12.9B active per token.
    "mixtral_8x7b": ModelConfig(
        name="mixtral_8x7b",
        vocab=32000,
        hidden=4096,
        intermediate=14336,
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        experts=8,
        top_k=2,
    ),
    # Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json): 30.5B parameters, 3.3B active per token; 128 small
    # experts, 8 per token (norm_topk_prob: the top-8 weights renormalised, as here); q/k RMSNorm per head;
    # 32 query heads of 128 (4096 wide, twice the hidden size); rms_norm_eps 1e-6.
    "qwen3_30b_a3b": ModelConfig(
        name="qwen3_30b_a3b",
        vocab=151936,
        hidden=2048,
        intermediate=768,
        layers=48,
        heads=32,
        kv_heads=4,
        head_dim=128,
        experts=128,
        top_k=8,
        norm_eps=1e-6,
        qk_norm=True,
    ),
    # Qwen3-Next-80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct config.json): 80B parameters, 3B active per
    # token; 512 experts of F=512, 10 per token (norm_topk_prob), and one shared expert of 512 beside them,
    # run as a dense SwiGLU MLP (its sigmoid gate left out, as for every shared expert here). What differs:
    # the model has full attention in one layer of four (16 query heads of 256 with an output gate, q/k
    # RMSNorm, RoPE on a quarter of each head) and Gated DeltaNet linear attention in the other three; here
    # every layer has full attention without the output gate, RoPE on the whole head, and plain (not
    # zero-centred) RMSNorms. Its bf16 experts (48 layers: 155 GB) do not fit one H200: run it with --layers.
    "qwen3_next_80b_a3b": ModelConfig(
        name="qwen3_next_80b_a3b",
        vocab=151936,
        hidden=2048,
        intermediate=512,
        layers=48,
        heads=16,
        kv_heads=2,
        head_dim=256,
        experts=512,
        top_k=10,
        rope_theta=1e7,
        norm_eps=1e-6,
        qk_norm=True,
        shared_experts=1,
        shared_intermediate=512,
    ),
    # The same structure at a size that compiles and runs in seconds on a CPU (tests, smoke runs).
    "tiny": ModelConfig(
        name="tiny",
        vocab=256,
        hidden=64,
        intermediate=96,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        experts=8,
        top_k=2,
        rope_theta=10000.0,
    ),
    # Qwen3-30B-A3B's structure at the tiny size: many small experts (32, top-8, F=32), q/k RMSNorm, query
    # heads wider than the hidden size.
    "tiny_qwen3": ModelConfig(
        name="tiny_qwen3",
        vocab=256,
        hidden=64,
        intermediate=32,
        layers=2,
        heads=8,
        kv_heads=2,
        head_dim=16,
        experts=32,
        top_k=8,
        rope_theta=10000.0,
        norm_eps=1e-6,
        qk_norm=True,
    ),
    # Qwen3-Next-80B-A3B's structure at the tiny size, and the smallest one the fused decode block takes
    # (hidden and F multiples of 128): many experts (64, top-8, F=128), one shared expert, q/k RMSNorm,
    # query heads wider than the hidden size.
    "tiny_qwen3_next": ModelConfig(
        name="tiny_qwen3_next",
        vocab=256,
        hidden=128,
        intermediate=128,
        layers=2,
        heads=8,
        kv_heads=2,
        head_dim=32,
        experts=64,
        top_k=8,
        rope_theta=10000.0,
        norm_eps=1e-6,
        qk_norm=True,
        shared_experts=1,
        shared_intermediate=128,
    ),
}


def model_config(name: str, layers: int | None = None) -> ModelConfig:
    """The named preset, with `layers` overriding its depth; ConfigInvalid names the presets."""
    if name not in MODELS:
        raise ConfigInvalid(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise ConfigInvalid(f"layers={layers!r} must be a positive integer")
    return MODELS[name].with_layers(layers)
