"""The MoE MLP layer in plain JAX: argument checks, gated activations, and the dense reference.

The reference runs every expert on every token (three einsums) and then keeps only the top-k outputs
through a [T, E] combine matrix that is zero off each token's top-k. It has no routing gather or sort, so
it checks the routed layer (`moetune.kernels.moe`) independently, and it is the `dense` baseline of the
model benchmark: E/top_k times the FLOPs of the routed layer, but only regular dense GEMMs.

Weights follow the Mixtral layout: `w_gate_up[e]` is [H, 2F] with the gate projection in columns [0, F)
and the up projection in [F, 2F); `w_down[e]` is [F, H].

Numerics (both here and in the routed layer): GEMMs take the inputs' dtype and accumulate in float32;
each GEMM's output is rounded to the inputs' dtype; routing, the activation and the weighted combine are
computed in float32. Called with float32 inputs this is the float32 reference that the tests use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from moetune.kernels.errors import ConfigInvalid, Unsupported

Array = Any


def _silu_gate(gate: Array) -> Array:
    return jax.nn.silu(gate)


def _gelu_gate(gate: Array) -> Array:
    return jax.nn.gelu(gate, approximate=True)


# Gated activations: act(h[:, :F]) * h[:, F:]. The routed layer and the reference share this table so
# that a new activation is added once.
GATES: dict[str, Callable[[Array], Array]] = {"swiglu": _silu_gate, "geglu": _gelu_gate}


def gated_activation(activation: str, gate_up: Array) -> Array:
    """act(gate) * up over the last axis of `gate_up` ([..., 2F] -> [..., F]), in float32, cast back."""
    gate, up = jnp.split(gate_up.astype(jnp.float32), 2, axis=-1)
    return (GATES[activation](gate) * up).astype(gate_up.dtype)


def check_moe_args(
    x: Array, router_logits: Array, w_gate_up: Array, w_down: Array, *, top_k: int, activation: str
) -> None:
    """Raise ConfigInvalid (bad shapes, top_k) or Unsupported (activation) with the values by name."""
    if x.ndim != 2:
        raise ConfigInvalid(f"x must be [T, H]; got shape {x.shape}")
    tokens, hidden = x.shape
    if router_logits.ndim != 2 or router_logits.shape[0] != tokens:
        raise ConfigInvalid(f"router_logits must be [T={tokens}, E]; got shape {router_logits.shape}")
    experts = router_logits.shape[1]
    if w_gate_up.ndim != 3 or w_gate_up.shape[:2] != (experts, hidden) or w_gate_up.shape[2] % 2:
        raise ConfigInvalid(
            f"w_gate_up must be [E={experts}, H={hidden}, 2F] with an even last axis; got {w_gate_up.shape}"
        )
    intermediate = w_gate_up.shape[2] // 2
    if w_down.shape != (experts, intermediate, hidden):
        raise ConfigInvalid(f"w_down must be [E={experts}, F={intermediate}, H={hidden}]; got {w_down.shape}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise ConfigInvalid(f"top_k={top_k!r} must be an integer in [1, E={experts}]")
    if activation not in GATES:
        raise Unsupported(f"activation={activation!r}; supported: {', '.join(sorted(GATES))}")


def combine_matrix(router_logits: Array, top_k: int, renormalize: bool) -> Array:
    """[T, E] float32 routing weights: softmax probabilities on each token's top-k experts, zero elsewhere.

    With `renormalize` the kept probabilities are rescaled to sum to one per token (Mixtral); without it
    they stay fractions of the softmax over all experts (Qwen-MoE's norm_topk_prob=False).
    """
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
    top_probs, top_ids = jax.lax.top_k(probs, top_k)
    if renormalize:
        top_probs = top_probs / jnp.sum(top_probs, axis=-1, keepdims=True)
    one_hot = jax.nn.one_hot(top_ids, probs.shape[-1], dtype=jnp.float32)  # [T, k, E]
    return jnp.einsum("tk,tke->te", top_probs, one_hot)


def _precision(dtype: Any) -> jax.lax.Precision:
    # float32 inputs stay exact on GPUs, whose default float32 matmul rounds through TF32; bf16 and f16
    # inputs keep the default, their native tensor-core path.
    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else jax.lax.Precision.DEFAULT


def _expert_einsum(spec: str, lhs: Array, rhs: Array) -> Array:
    out = jnp.einsum(spec, lhs, rhs, preferred_element_type=jnp.float32, precision=_precision(lhs.dtype))
    return out.astype(lhs.dtype)


def moe_mlp_reference(
    x: Array,
    router_logits: Array,
    w_gate_up: Array,
    w_down: Array,
    *,
    top_k: int,
    renormalize: bool = True,
    activation: str = "swiglu",
) -> Array:
    """out[t] = sum over t's top-k experts e of weight[t, e] * down_e(act(gate_up_e(x[t]))), in x.dtype."""
    check_moe_args(x, router_logits, w_gate_up, w_down, top_k=top_k, activation=activation)
    combine = combine_matrix(router_logits, top_k, renormalize)
    gate_up = _expert_einsum("th,ehn->etn", x, w_gate_up)
    down = _expert_einsum("etf,efh->eth", gated_activation(activation, gate_up), w_down)
    out = jnp.einsum("eth,te->th", down.astype(jnp.float32), combine, precision=_precision(jnp.float32))
    return out.astype(x.dtype)
