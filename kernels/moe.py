"""The routed MoE MLP layer on moetune's tuned grouped GEMM: `moe_mlp`.

    x[T, H] -- top-k routing --> T*k (token, expert) rows, sorted by expert
            -- gate_up grouped GEMM [T*k, H] x [E, H, 2F] --> SwiGLU --> [T*k, F]
            -- down grouped GEMM [T*k, F] x [E, F, H] --> weighted combine of each token's k rows --> [T, H]

What runs today, on every backend (`xla` on CPU, `mosaic_gpu` on Hopper), and what is fused:
  * Both GEMMs are `moetune.kernels.grouped_matmul` calls, so each is one Problem (op "grouped_matmul",
    `moe_problems` lists them) that the tuner sweeps and the dispatcher looks up at trace time.
  * The token permutation is NOT fused into the first GEMM: a stable argsort by expert, then a row gather
    (`jnp.take`) that writes a permuted [T*k, H] copy of the activations.
  * SwiGLU is NOT a GEMM epilogue: it is an XLA elementwise op on the bf16 gate_up output, so the
    [T*k, 2F] output is written to memory and read back once.
  * The combine is NOT fused into the down GEMM: an XLA gather through the inverse permutation plus a
    float32 weighted sum over k (elementwise, which XLA can fuse into one pass over the [T*k, H] output).
  `moe_mlp_using` runs the same layer on any grouped GEMM (the benchmark's `ragged` path passes
  jax.lax.ragged_dot), so the tuned kernel and XLA's are compared inside identical surroundings.

Extension points. Each stage below is one function, and each names the fused op that would replace it.
These ops are not implemented and are not registered: when a backend implements one, it becomes its own
Problem op (so it is tuned and looked up like "grouped_matmul") and the stage calls it instead:
  * "grouped_matmul_gather"  (`_gate_up`): lhs rows read through `row_token` inside the kernel (TMA
    gather / row loads), so no permuted copy of x exists. Problem: m=T*k, k=H, n=2F, g=E.
  * "grouped_matmul_swiglu"  (`_gate_up`): silu(gate) * up from the float32 accumulators in the epilogue,
    writing [T*k, F]; needs gate and up columns of a tile in the same CTA. Problem: n=2F (output F).
  * "grouped_matmul_combine" (`_down_and_combine`): the epilogue scales each row by its routing weight
    and adds it into out[token] (atomics, or a tile owning whole tokens), writing [T, H] directly; or
    a separate tuned "moe_combine" reduction. Problem: m=T*k, k=F, n=H, g=E.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from moetune.kernels.api import grouped_matmul, problem_of
from moetune.kernels.moe_reference import check_moe_args, gated_activation
from moetune.kernels.problem import Problem, dtype_name

Array = Any
# gemm(lhs[M, K], rhs[G, K, N], group_sizes[G]) -> [M, N] in lhs's dtype, with jax.lax.ragged_dot semantics.
GroupedGemm = Callable[[Array, Array, Array], Array]


@dataclasses.dataclass(frozen=True)
class Routing:
    """Each token's top-k experts and their float32 combine weights, both [T, k]."""

    expert_ids: Array
    weights: Array


@dataclasses.dataclass(frozen=True)
class SortedRows:
    """The T*k (token, slot) rows sorted by expert, as grouped GEMMs need them.

    Example, T=3, k=2, expert_ids [[2, 0], [1, 2], [0, 1]] -> flat ids [2, 0, 1, 2, 0, 1];
    order (flat slot of each sorted row) = [1, 4, 2, 5, 0, 3]; row_token = order // k = [0, 2, 1, 2, 0, 1];
    group_sizes = [2, 2, 2]; slot_row (sorted row of each flat slot: order's inverse) = [4, 0, 2, 5, 1, 3].
    """

    row_token: Array  # [T*k] token whose activations each sorted row holds
    slot_row: Array  # [T*k] sorted row of flat slot t*k + j
    group_sizes: Array  # [E] int32 rows per expert, summing to T*k


def route(router_logits: Array, top_k: int, renormalize: bool) -> Routing:
    """Top-k experts per token from the logits; weights are the softmax over all E experts, or with
    `renormalize` over the chosen k (the same values as renormalising those probabilities)."""
    logits = router_logits.astype(jnp.float32)
    top_logits, expert_ids = jax.lax.top_k(logits, top_k)
    if renormalize:
        weights = jax.nn.softmax(top_logits, axis=-1)
    else:
        weights = jnp.exp(top_logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True))
    return Routing(expert_ids=expert_ids.astype(jnp.int32), weights=weights)


def sort_by_expert(expert_ids: Array, num_experts: int) -> SortedRows:
    """Stable sort of the flattened (token, slot) pairs by expert; see SortedRows for an example."""
    flat = expert_ids.reshape(-1)
    rows = flat.shape[0]
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    slot_row = (
        jnp.zeros((rows,), jnp.int32)
        .at[order]
        .set(jnp.arange(rows, dtype=jnp.int32), unique_indices=True, mode="promise_in_bounds")
    )
    group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    return SortedRows(row_token=order // expert_ids.shape[1], slot_row=slot_row, group_sizes=group_sizes)


def _gate_up(gemm: GroupedGemm, x: Array, rows: SortedRows, w_gate_up: Array, activation: str) -> Array:
    """[T*k, F] activated hidden rows in expert order. Fused ops that would replace this:
    "grouped_matmul_gather" (the take) and "grouped_matmul_swiglu" (the activation)."""
    permuted = jnp.take(x, rows.row_token, axis=0, mode="clip")  # in bounds: clip only skips masking
    return gated_activation(activation, gemm(permuted, w_gate_up, rows.group_sizes))


def _down_and_combine(
    gemm: GroupedGemm, hidden: Array, rows: SortedRows, w_down: Array, routing: Routing
) -> Array:
    """[T, H] weighted sum of each token's k expert outputs. Fused op that would replace the gather and
    the sum: "grouped_matmul_combine"."""
    tokens, top_k = routing.weights.shape
    down = gemm(hidden, w_down, rows.group_sizes)
    per_slot = jnp.take(down, rows.slot_row, axis=0, mode="clip").reshape(tokens, top_k, -1)
    # Elementwise multiply and sum over k, not a dot: XLA can fuse it with the gather into one pass, and
    # a float32 dot on a GPU would round the weights through TF32.
    out = jnp.sum(per_slot.astype(jnp.float32) * routing.weights[:, :, None], axis=1)
    return out.astype(hidden.dtype)


def moe_mlp_using(
    gemm: GroupedGemm,
    x: Array,
    router_logits: Array,
    w_gate_up: Array,
    w_down: Array,
    *,
    top_k: int,
    renormalize: bool = True,
    activation: str = "swiglu",
) -> Array:
    """`moe_mlp` with any grouped GEMM: baselines pass jax.lax.ragged_dot to time XLA's own kernel."""
    check_moe_args(x, router_logits, w_gate_up, w_down, top_k=top_k, activation=activation)
    routing = route(router_logits, top_k, renormalize)
    rows = sort_by_expert(routing.expert_ids, router_logits.shape[1])
    hidden = _gate_up(gemm, x, rows, w_gate_up, activation)
    return _down_and_combine(gemm, hidden, rows, w_down, routing)


def moe_mlp(
    x: Array,
    router_logits: Array,
    w_gate_up: Array,
    w_down: Array,
    *,
    top_k: int,
    renormalize: bool = True,
    activation: str = "swiglu",
    backend: str | None = None,
) -> Array:
    """Routed MoE MLP: out[t] = sum over t's top-k experts e of w[t, e] * down_e(act(gate_up_e(x[t]))).

    x [T, H]; router_logits [T, E]; w_gate_up [E, H, 2F] (gate columns first, then up); w_down [E, F, H].
    Returns [T, H] in x's dtype. Routing weights are the softmax of the logits over the chosen top_k
    experts (`renormalize`, Mixtral) or over all E (Qwen-MoE with norm_topk_prob=False). Both GEMMs go
    through `grouped_matmul` on `backend` (None: the dispatcher's default for the device), each with its
    tuned config looked up at trace time. Raises ConfigInvalid for bad shapes or top_k, Unsupported for an
    unknown activation.
    """
    gemm = functools.partial(grouped_matmul, backend=backend)
    return moe_mlp_using(
        gemm, x, router_logits, w_gate_up, w_down, top_k=top_k, renormalize=renormalize, activation=activation
    )


def moe_problems(
    tokens: int, hidden: int, intermediate: int, experts: int, top_k: int, dtype: Any = "bfloat16"
) -> tuple[Problem, Problem]:
    """The (gate_up, down) Problems `moe_mlp` dispatches for `tokens` tokens: what a sweep should tune."""
    dtype = jnp.dtype(dtype_name(dtype))
    rows = tokens * top_k
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
    return (
        problem_of(spec(rows, hidden), spec(experts, hidden, 2 * intermediate)),
        problem_of(spec(rows, intermediate), spec(experts, intermediate, hidden)),
    )
