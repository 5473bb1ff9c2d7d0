"""The MoE block's RMSNorm and router logits for a decode-sized batch, in one Pallas Triton kernel; and for
the moetune path at decode, the routing and the permuted rows in the same kernel.

XLA runs them as three small kernels in a decode step (the norm's sum of squares, its scaling, and the
router's [H] x [H, E] dot as a reduction), each a launch of ~1.5 us on the H200. Here one program per
token reads its row, the norm's weight and the router's [H, E] weights once and writes both outputs
(`norm_and_router`).

`norm_route_gather` goes on to what followed it as two more kernels: routing_kernel.py's top-k and sort by
expert, and XLA's gather of the normed rows into expert order, padded to the gate_up GEMM's tile. One
program does it all for up to MAX_GATHERED_ROWS (token, expert) rows, and writes the rows in expert order
into a buffer of `rows_out` rows whose rows past T*k it leaves unwritten: moe_mlp_sorted ignores them, and
mosaic_gpu's pad_lhs then finds its window inside the buffer and copies nothing.

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

from moetune.kernels.moe import routing_kernel
from moetune.kernels.moe.pallas_mode import pow2_at_least

Array = Any
MAX_TOKENS = 64  # one program per token; a prefill batch stays with XLA
# Each program holds the whole router [H, E] in registers as float32: 128 KB at Mixtral's 4096 x 8. One
# of 128 experts (Qwen3-30B-A3B's 2048 x 128: 1 MB) would not fit, so routers wider than the routing
# kernel's bound stay with XLA's dot; nothing between 16 and 128 experts was measured.
MAX_EXPERTS = routing_kernel.MAX_EXPERTS
MAX_GATHERED_ROWS = 8  # tokens * top_k for norm_route_gather's one program (each row is a masked store)


def fits(tokens: int, experts: int) -> bool:
    return tokens <= MAX_TOKENS and experts <= MAX_EXPERTS


def fits_gather(tokens: int, experts: int, top_k: int) -> bool:
    return tokens * top_k <= MAX_GATHERED_ROWS and routing_kernel.fits(tokens, experts, top_k)


def norm_and_router(
    x: Array,
    weight: Array,
    router: Array,
    eps: float,
    *,
    out_dtype: Any = None,
    num_warps: int = 8,
    interpret: bool = False,
) -> tuple[Array, Array]:
    """(rms_norm(x, weight, eps) [T, H] in `out_dtype` (default x's), its router logits [T, E] float32);
    x [T, H]. The logits are those of the rounded row, so a float32 residual stream's rows leave in the
    weights' dtype with the logits norm_route_gather gives them."""
    tokens, hidden = x.shape
    experts = router.shape[1]
    if weight.shape != (hidden,) or router.shape[0] != hidden or not fits(tokens, experts):
        raise ValueError(f"norm_and_router: x {x.shape}, weight {weight.shape}, router {router.shape}")
    return pl.pallas_call(
        functools.partial(_kernel, eps=eps),
        out_shape=(
            jax.ShapeDtypeStruct((tokens, hidden), out_dtype or x.dtype),
            jax.ShapeDtypeStruct((tokens, experts), jnp.float32),
        ),
        grid=(tokens,),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="moetune_norm_router",
    )(x, weight, router)


def _kernel(x_ref, weight_ref, router_ref, h_ref, logits_ref, *, eps):
    token = pl.program_id(0)
    weight, router = _load_weights(weight_ref, router_ref)
    h, logits = _normed_row_and_logits(x_ref, token, weight, router, eps, h_ref.dtype)
    hp, ep = router.shape
    pltriton.store(h_ref.at[token, pl.ds(0, hp)], h, mask=jnp.arange(hp) < x_ref.shape[1])
    pltriton.store(logits_ref.at[token, pl.ds(0, ep)], logits, mask=jnp.arange(ep) < router_ref.shape[1])


def _load_weights(weight_ref, router_ref) -> tuple[Array, Array]:
    """The norm's weight [hp] and the router [hp, ep] in float32, zero past their real sizes."""
    hidden, experts = router_ref.shape
    hp, ep = pow2_at_least(hidden), pow2_at_least(experts)
    real_h, real_e = jnp.arange(hp) < hidden, jnp.arange(ep) < experts
    weight = pltriton.load(weight_ref.at[pl.ds(0, hp)], mask=real_h, other=0).astype(jnp.float32)
    router = pltriton.load(
        router_ref.at[pl.ds(0, hp), pl.ds(0, ep)], mask=real_h[:, None] & real_e[None, :], other=0
    ).astype(jnp.float32)
    return weight, router


def _normed_row_and_logits(
    x_ref, token, weight: Array, router: Array, eps: float, dtype: Any = None
) -> tuple[Array, Array]:
    """Row `token` of x normed [hp] in `dtype` (default x's), and its router logits [ep] in float32: the
    model's rms_norm, then the float32 dot of the rounded row."""
    hidden = x_ref.shape[1]
    hp = weight.shape[0]
    x = pltriton.load(x_ref.at[token, pl.ds(0, hp)], mask=jnp.arange(hp) < hidden, other=0)
    x = x.astype(jnp.float32)
    h = (x * jax.lax.rsqrt(jnp.sum(x * x) / hidden + eps) * weight).astype(dtype or x_ref.dtype)
    return h, jnp.sum(h.astype(jnp.float32)[:, None] * router, axis=0)


def norm_route_gather(
    x: Array,
    weight: Array,
    router: Array,
    eps: float,
    *,
    top_k: int,
    renormalize: bool,
    rows_out: int,
    out_dtype: Any = None,
    num_warps: int = 8,
    interpret: bool = False,
) -> tuple[Array, Array, Array, Array, Array, Array]:
    """(permuted [rows_out, H], expert_ids [T, k], weights [T, k], row_token [T*k], slot_row [T*k],
    group_sizes [E]) for x [T, H]: rms_norm(x, weight, eps)'s rows in expert order (rows past T*k
    unwritten), and the routing `moe.route_rows` gives for norm_and_router's logits. The rows are in
    `out_dtype` (default x's): a float32 residual stream's rows leave in the weights' dtype."""
    tokens, hidden = x.shape
    experts = router.shape[1]
    rows = tokens * top_k
    if weight.shape != (hidden,) or router.shape[0] != hidden or not fits_gather(tokens, experts, top_k):
        raise ValueError(
            f"norm_route_gather: x {x.shape}, weight {weight.shape}, router {router.shape}, top_k {top_k}"
        )
    if rows_out < rows:
        raise ValueError(f"rows_out={rows_out} is fewer than the {rows} rows to gather")
    i32 = jnp.int32
    permuted, ids, weights, slot_row, row_token, sizes = pl.pallas_call(
        functools.partial(_gather_kernel, eps=eps, top_k=top_k, renormalize=renormalize),
        out_shape=(
            jax.ShapeDtypeStruct((rows_out, hidden), out_dtype or x.dtype),
            jax.ShapeDtypeStruct((tokens, top_k), i32),
            jax.ShapeDtypeStruct((tokens, top_k), jnp.float32),
            jax.ShapeDtypeStruct((tokens, top_k), i32),
            jax.ShapeDtypeStruct((rows,), i32),
            jax.ShapeDtypeStruct((experts,), i32),
        ),
        grid=(1,),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="moetune_norm_route_gather",
    )(x, weight, router)
    return permuted, ids, weights, row_token, slot_row.reshape(-1), sizes


def _gather_kernel(x_ref, weight_ref, router_ref, permuted_ref, *routing_refs, eps, top_k, renormalize):
    tokens, hidden = x_ref.shape
    experts = router_ref.shape[1]
    weight, router = _load_weights(weight_ref, router_ref)
    hp, ep = router.shape
    tp = pow2_at_least(tokens)
    normed, logits = [], jnp.full((tp, ep), -jnp.inf, jnp.float32)
    for t in range(tokens):  # as _kernel's program t (Pallas wants traced indices: jnp.int32)
        h, row = _normed_row_and_logits(x_ref, jnp.int32(t), weight, router, eps, permuted_ref.dtype)
        real = (jnp.arange(tp) == t)[:, None] & (jnp.arange(ep) < experts)[None, :]
        logits = jnp.where(real, row[None, :], logits)
        normed.append(h)
    routed = routing_kernel.route(logits, tokens, experts, top_k, renormalize)
    routing_kernel.store(routed, *routing_refs)
    # Sorted row r holds token row_token[r]'s normed row: one masked store per (row, token).
    row_token, columns, real_h = routed.row_token, pl.ds(0, hp), jnp.arange(hp) < hidden
    for r in range(tokens * top_k):
        token = jnp.sum(jnp.where(jnp.arange(row_token.shape[0]) == r, row_token, 0))
        for t, h in enumerate(normed):
            pltriton.store(permuted_ref.at[jnp.int32(r), columns], h, mask=real_h & (token == t))
