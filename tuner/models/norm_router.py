"""The MoE block's RMSNorm and router logits for a decode-sized batch, in one Pallas Triton kernel.

XLA runs them as three small kernels in a decode step (the norm's sum of squares, its scaling, and the
router's [H] x [H, E] dot as a reduction), each a launch of ~1.5 us on the H200. Here one program per
token reads its row, the norm's weight and the router's [H, E] weights once and writes both outputs.

Numerics follow the model's `rms_norm` then `jnp.dot(h, router, preferred_element_type=float32)`: the
normed row is rounded to x's dtype and the logits are the float32 dot of that rounded row.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from moetune.kernels import pallas_mode
from moetune.kernels.pallas_mode import pow2_at_least

Array = Any
MODE_ENV = "MOETUNE_NORM_ROUTER"  # kernel, xla or interpret: see moetune.kernels.pallas_mode
MAX_TOKENS = 64  # one program per token; a prefill batch stays with XLA


def mode() -> str:
    return pallas_mode.mode(MODE_ENV)


def fits(tokens: int) -> bool:
    return tokens <= MAX_TOKENS


def norm_and_router(
    x: Array, weight: Array, router: Array, eps: float, *, num_warps: int = 8, interpret: bool = False
) -> tuple[Array, Array]:
    """(rms_norm(x, weight, eps) [T, H] in x's dtype, its router logits [T, E] float32); x [T, H]."""
    tokens, hidden = x.shape
    experts = router.shape[1]
    if weight.shape != (hidden,) or router.shape[0] != hidden or not fits(tokens):
        raise ValueError(f"norm_and_router: x {x.shape}, weight {weight.shape}, router {router.shape}")
    return pl.pallas_call(
        functools.partial(_kernel, eps=eps),
        out_shape=(
            jax.ShapeDtypeStruct((tokens, hidden), x.dtype),
            jax.ShapeDtypeStruct((tokens, experts), jnp.float32),
        ),
        grid=(tokens,),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="moetune_norm_router",
    )(x, weight, router)


def _kernel(x_ref, weight_ref, router_ref, h_ref, logits_ref, *, eps):
    token = pl.program_id(0)
    hidden, experts = router_ref.shape
    hp, ep = pow2_at_least(hidden), pow2_at_least(experts)
    real_h, real_e = jnp.arange(hp) < hidden, jnp.arange(ep) < experts
    columns = pl.ds(0, hp)
    x = pltriton.load(x_ref.at[token, columns], mask=real_h, other=0).astype(jnp.float32)
    weight = pltriton.load(weight_ref.at[columns], mask=real_h, other=0).astype(jnp.float32)
    router = pltriton.load(
        router_ref.at[columns, pl.ds(0, ep)], mask=real_h[:, None] & real_e[None, :], other=0
    ).astype(jnp.float32)
    normed = x * jax.lax.rsqrt(jnp.sum(x * x) / hidden + eps)
    h = (normed * weight).astype(h_ref.dtype)
    logits = jnp.sum(h.astype(jnp.float32)[:, None] * router, axis=0)
    pltriton.store(h_ref.at[token, columns], h, mask=real_h)
    pltriton.store(logits_ref.at[token, pl.ds(0, ep)], logits, mask=real_e)
