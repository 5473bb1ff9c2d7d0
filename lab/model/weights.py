"""Random weights for a ModelConfig, generated on the device with jax.random (no checkpoint, no download).

Layers are separate arrays, not stacked [L, ...] arrays: the model unrolls its layers (mixtral.py says
why), and generating one layer per call keeps the random-bit temporaries to one layer's size. Values are
uniform with variance 1/fan_in, so activations keep their scale through the residual stream and the
routing is as varied as a trained router's on random tokens (not all tokens to one expert).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from moetune_lab.model.config import ModelConfig

Array = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerParams:
    attn_norm: Array  # [H]
    # q, k and v projections side by side, [H, (heads + 2 * kv_heads) * D]: one GEMM reads all three (in
    # decode, three separate GEMVs cost 38 us more per layer on the H200).
    wqkv: Array
    wo: Array  # [heads * D, H]
    moe_norm: Array  # [H]
    router: Array  # [H, E]
    w_gate_up: Array  # [E, H, 2F]: gate columns, then up columns
    w_down: Array  # [E, F, H]
    # Only with config.qk_norm: each query / key head's RMSNorm weight [D].
    q_norm: Array | None = None
    k_norm: Array | None = None
    # Only with config.shared_experts: the shared experts as one dense SwiGLU MLP of S = count * F_shared,
    # [H, 2S] (gate columns, then up columns) and [S, H].
    w_shared_gate_up: Array | None = None
    w_shared_down: Array | None = None
    # Only with config.experts_scale_layout: the FP8 experts' float32 scales; w_gate_up and w_down are
    # then FP8 and K-major, [E, 2F, H] and [E, H, F].
    w_gate_up_scale: Array | None = None
    w_down_scale: Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ModelParams:
    embed: Array  # [V, H]
    layers: tuple[LayerParams, ...]
    final_norm: Array  # [H]
    lm_head: Array  # [H, V]


def _uniform(key: Array, shape: tuple[int, ...], fan_in: int, dtype: Any) -> Array:
    bound = (3.0 / fan_in) ** 0.5  # variance of U(-b, b) is b^2 / 3 = 1 / fan_in
    return jax.random.uniform(key, shape, dtype=dtype, minval=-bound, maxval=bound)


@functools.partial(jax.jit, static_argnames=("config",))
def _init_layer(key: Array, config: ModelConfig) -> LayerParams:
    c = config
    dtype = jnp.dtype(c.dtype)
    keys = jax.random.split(key, 5)
    q_width, kv_width = c.heads * c.head_dim, c.kv_heads * c.head_dim
    optional = {}
    if c.qk_norm:
        optional["q_norm"] = optional["k_norm"] = jnp.ones((c.head_dim,), dtype)
    if c.shared_experts:
        # Keys of their own, so that adding shared experts leaves the other weights as they were.
        up_key, down_key = jax.random.split(jax.random.fold_in(key, 1))
        shared = c.shared_experts * c.shared_intermediate
        optional["w_shared_gate_up"] = _uniform(up_key, (c.hidden, 2 * shared), c.hidden, dtype)
        optional["w_shared_down"] = _uniform(down_key, (shared, c.hidden), shared, dtype)
    experts = {
        "w_gate_up": _uniform(keys[3], (c.experts, c.hidden, 2 * c.intermediate), c.hidden, dtype),
        "w_down": _uniform(keys[4], (c.experts, c.intermediate, c.hidden), c.intermediate, dtype),
    }
    if c.experts_scale_layout != "none":
        from moetune.kernels.moe.fp8 import quantize_weights

        # The same draw as the `dtype` model's experts, quantized (K-major, as the FP8 kernel reads them).
        for name in ("w_gate_up", "w_down"):
            experts[name], experts[f"{name}_scale"] = quantize_weights(
                experts[name], c.experts_scale_layout, transpose=True
            )
    return LayerParams(
        attn_norm=jnp.ones((c.hidden,), dtype),
        wqkv=_uniform(keys[0], (c.hidden, q_width + 2 * kv_width), c.hidden, dtype),
        wo=_uniform(keys[1], (q_width, c.hidden), q_width, dtype),
        moe_norm=jnp.ones((c.hidden,), dtype),
        router=_uniform(keys[2], (c.hidden, c.experts), c.hidden, dtype),
        **experts,
        **optional,
    )


@functools.partial(jax.jit, static_argnames=("config",))
def _init_outer(key: Array, config: ModelConfig) -> tuple[Array, Array, Array]:
    c = config
    dtype = jnp.dtype(c.dtype)
    embed_key, head_key = jax.random.split(key)
    embed = _uniform(embed_key, (c.vocab, c.hidden), 1, dtype)  # unit variance, like a trained embedding
    lm_head = _uniform(head_key, (c.hidden, c.vocab), c.hidden, dtype)
    return embed, jnp.ones((c.hidden,), dtype), lm_head


def init_params(config: ModelConfig, seed: int = 0) -> ModelParams:
    """All weights of `config` on the default device; one jitted call per layer."""
    outer_key, *layer_keys = jax.random.split(jax.random.key(seed), config.layers + 1)
    embed, final_norm, lm_head = _init_outer(outer_key, config)
    layers = tuple(_init_layer(k, config) for k in layer_keys)
    return ModelParams(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)
