"""The MoE layer's routing for a decode-sized batch in one Pallas Triton kernel.

`moe.route` and `moe.sort_by_expert` compute top-k and the stable sort by comparisons that XLA fuses into
four small kernels (top-k, the weights' gather, the sorted order, the group sizes), each a launch of
~1.5 us on the H200 in a step whose routing work is a few hundred comparisons. This is those four as one
kernel, one program: every (token, slot) is compared with every other in registers, as
`moe._top_k_by_comparison` and `moe._sorted_rows_by_comparison` do, with the same results (ties to the
lower expert, then to the earlier slot; logits in IEEE total order). `moe.route_rows` runs it where
its `routing_mode` argument resolves to "kernel" or "interpret" (see moetune.kernels.moe.pallas_mode)
and the batch `fits`.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from moetune.kernels.moe.pallas_mode import pow2_at_least

Array = Any
MAX_EXPERTS = 16
MAX_ROWS = 64  # tokens * top_k; the comparisons grow as its square


def fits(tokens: int, experts: int, top_k: int) -> bool:
    return experts <= MAX_EXPERTS and tokens * top_k <= MAX_ROWS


def route_and_sort(
    router_logits: Array, top_k: int, renormalize: bool, *, interpret: bool = False
) -> tuple[Array, Array, Array, Array, Array]:
    """(expert_ids [T, k], weights [T, k] float32, row_token [T*k], slot_row [T*k], group_sizes [E]), as
    `moe.route` then `moe.sort_by_expert` give them. router_logits [T, E], with fits(T, E, top_k)."""
    tokens, experts = router_logits.shape
    if not fits(tokens, experts, top_k):
        raise ValueError(
            f"{tokens} tokens x top_k {top_k} over {experts} experts is beyond the one-program kernel"
        )
    i32 = jnp.int32
    expert_ids, weights, slot_row, row_token, group_sizes = pl.pallas_call(
        functools.partial(_kernel, top_k=top_k, renormalize=renormalize),
        out_shape=(
            jax.ShapeDtypeStruct((tokens, top_k), i32),
            jax.ShapeDtypeStruct((tokens, top_k), jnp.float32),
            jax.ShapeDtypeStruct((tokens, top_k), i32),
            jax.ShapeDtypeStruct((tokens * top_k,), i32),
            jax.ShapeDtypeStruct((experts,), i32),
        ),
        grid=(1,),
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="moetune_routing",
    )(router_logits.astype(jnp.float32))
    return expert_ids, weights, row_token, slot_row.reshape(-1), group_sizes


def _kernel(logits_ref, ids_ref, weights_ref, slot_row_ref, row_token_ref, sizes_ref, *, top_k, renormalize):
    tokens, experts = logits_ref.shape
    tp, ep = pow2_at_least(tokens), pow2_at_least(experts)
    real_token, real_expert = jnp.arange(tp) < tokens, jnp.arange(ep) < experts
    logits = pltriton.load(
        logits_ref.at[pl.ds(0, tp), pl.ds(0, ep)],
        mask=real_token[:, None] & real_expert[None, :],
        other=-jnp.inf,
    )  # [tp, ep]
    routed = route(logits, tokens, experts, top_k, renormalize)
    store(routed, ids_ref, weights_ref, slot_row_ref, row_token_ref, sizes_ref)


class Routed(NamedTuple):
    """`route`'s arrays, padded to powers of two, with the masks of their real entries."""

    ids: Array  # [tp, kp]
    weights: Array  # [tp, kp]
    slot_row: Array  # [tp, kp]
    row_token: Array  # [rp]
    sizes: Array  # [ep]
    real: Array  # [tp, kp]: real (token, slot) pairs
    real_row: Array  # [rp]
    real_expert: Array  # [ep]


def route(logits, tokens: int, experts: int, top_k: int, renormalize: bool) -> Routed:
    """Inside a Pallas Triton kernel: the routing of float32 logits [tp, ep] held in registers (padded to
    powers of two; padding entries -inf), for `store`. Also used by norm_router's decode kernel."""
    tp, ep, kp, rp = map(pow2_at_least, (tokens, experts, top_k, tokens * top_k))
    token, expert, slot = jnp.arange(tp), jnp.arange(ep), jnp.arange(kp)
    real_token, real_expert, real_slot = token < tokens, expert < experts, slot < top_k

    # Top-k: an expert's rank is how many real experts order before it (a larger key, or an equal one at a
    # lower index); the padding experts rank last.
    bits = jax.lax.bitcast_convert_type(logits, jnp.int32)
    key = bits ^ ((bits >> 31) & jnp.int32(0x7FFFFFFF))  # IEEE total order as int32 order
    mine, other = key[:, :, None], key[:, None, :]
    ahead = (other > mine) | ((other == mine) & (expert[None, None, :] < expert[None, :, None]))
    rank = jnp.sum((ahead & real_expert[None, None, :]).astype(jnp.int32), axis=2)
    rank = jnp.where(real_expert[None, :], rank, ep)  # [tp, ep]
    picked = rank[:, None, :] == slot[None, :, None]  # [tp, kp, ep]: the expert of rank j
    ids = jnp.sum(jnp.where(picked, expert[None, None, :], 0), axis=2)  # [tp, kp]
    top_logits = jnp.sum(jnp.where(picked, logits[:, None, :], 0.0), axis=2)

    if renormalize:  # softmax over the chosen k
        top = jnp.where(real_slot[None, :], top_logits, -jnp.inf)
        exp = jnp.exp(top - jnp.max(top, axis=1)[:, None])
        weights = exp / jnp.sum(exp, axis=1)[:, None]
    else:  # their share of the softmax over all experts
        row_max = jnp.max(logits, axis=1)
        total = jnp.sum(jnp.exp(logits - row_max[:, None]), axis=1)
        weights = jnp.exp(top_logits - row_max[:, None]) / total[:, None]

    # Stable sort of the (token, slot) rows by expert: a row's sorted place is how many real rows sort
    # before it (a smaller expert, or the same expert at an earlier flat index token * k + slot).
    real = real_token[:, None] & real_slot[None, :]  # [tp, kp]
    flat = token[:, None] * top_k + slot[None, :]
    before = (ids[None, None, :, :] < ids[:, :, None, None]) | (
        (ids[None, None, :, :] == ids[:, :, None, None]) & (flat[None, None, :, :] < flat[:, :, None, None])
    )
    before = (before & real[None, None, :, :]).astype(jnp.int32)
    slot_row = jnp.sum(jnp.sum(before, axis=3), axis=2)  # [tp, kp]
    row = jnp.arange(rp)
    holds = (slot_row[None, :, :] == row[:, None, None]) & real[None, :, :]  # [rp, tp, kp]
    row_token = jnp.sum(jnp.sum(jnp.where(holds, token[None, :, None], 0), axis=2), axis=1)
    chosen = (ids[None, :, :] == expert[:, None, None]) & real[None, :, :]  # [ep, tp, kp]
    sizes = jnp.sum(jnp.sum(chosen.astype(jnp.int32), axis=2), axis=1)
    return Routed(ids, weights, slot_row, row_token, sizes, real, row < tokens * top_k, real_expert)


def store(routed: Routed, ids_ref, weights_ref, slot_row_ref, row_token_ref, sizes_ref) -> None:
    """`route`'s arrays into the outputs route_and_sort returns (ids, weights, slot_row [T, k], row_token
    [T*k], group_sizes [E])."""
    r = routed
    out_tk = (pl.ds(0, r.ids.shape[0]), pl.ds(0, r.ids.shape[1]))
    pltriton.store(ids_ref.at[out_tk], r.ids, mask=r.real)
    pltriton.store(weights_ref.at[out_tk], r.weights, mask=r.real)
    pltriton.store(slot_row_ref.at[out_tk], r.slot_row, mask=r.real)
    pltriton.store(row_token_ref.at[pl.ds(0, r.row_token.shape[0])], r.row_token, mask=r.real_row)
    pltriton.store(sizes_ref.at[pl.ds(0, r.sizes.shape[0])], r.sizes, mask=r.real_expert)
