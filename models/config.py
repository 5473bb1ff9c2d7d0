"""Shapes of the benchmark decoder models: a frozen, hashable config (a static jit argument) and presets."""

from __future__ import annotations

import dataclasses

from moetune.kernels.errors import ConfigInvalid


@dataclasses.dataclass(frozen=True, slots=True)
class ModelConfig:
    """A Mixtral-style decoder: RMSNorm, grouped-query attention with RoPE, and a top-k MoE MLP."""

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
        if self.heads % self.kv_heads:
            raise ConfigInvalid(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.head_dim % 2:
            raise ConfigInvalid(f"head_dim={self.head_dim} must be even for RoPE")
        if not 1 <= self.top_k <= self.experts:
            raise ConfigInvalid(f"top_k={self.top_k} must be in [1, experts={self.experts}]")

    def with_layers(self, layers: int | None) -> ModelConfig:
        return self if layers is None else dataclasses.replace(self, layers=layers)

    @property
    def expert_weight_bytes(self) -> int:
        itemsize = 4 if self.dtype == "float32" else 2
        return self.layers * self.experts * 3 * self.hidden * self.intermediate * itemsize


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
}


def model_config(name: str, layers: int | None = None) -> ModelConfig:
    """The named preset, with `layers` overriding its depth; ConfigInvalid names the presets."""
    if name not in MODELS:
        raise ConfigInvalid(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise ConfigInvalid(f"layers={layers!r} must be a positive integer")
    return MODELS[name].with_layers(layers)
