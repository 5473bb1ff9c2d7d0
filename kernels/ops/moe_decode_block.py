"""The fused MoE MLP block at decode sizes as an op: the router's softmax and top-k, gate_up with SwiGLU,
down and the weighted combine of each token's top_k experts, in one call.

    out[t] = sum over t's top_k experts e of w[t, e] * down_e(silu(gate_e(x[t])) * up_e(x[t]))

Operands in call order: x [T, H], router_logits [T, E] float32, w_gate_up [E, H, 2F] (gate columns first,
then up) and w_down [E, F, H], the two weights; with `transpose_rhs` (t=1 in the key) the weights are
K-major, w_gate_up [E, 2F, H] and w_down [E, H, F], each expert's rows contiguous along the dimension a
GEMM contracts (the layout checkpoints that store each projection as [out, in] keep). Its Problem's dims
read naturally: m = T tokens (not the T * top_k rows of the grouped GEMMs), k = H, n = 2F (w_gate_up's
columns, as in the fused gate_up GEMM's key), g = E, and `top_k`, the experts each token's router picks (a
v3 key: Problem). x, the weights and the output share one 16- or 32-bit dtype (lhs_dtype, rhs_dtype,
out_dtype), as the block's kernels take one. Example: Qwen3-30B-A3B at 8 tokens is
``moe_decode_block/m=8,k=2048,n=1536,g=128,lhs=bfloat16,rhs=bfloat16,out=bfloat16,t=0,top_k=8/v3``.

The reference is kernels/moe/reference.py's dense `moe_mlp_reference` on float32 copies of the operands
(every expert on every token, then each token's top_k through the combine matrix), with the weights
renormalized over the chosen experts. `moe_mlp` runs the op's kernels with renormalize=False as well (the
softmax over all E experts), under the same config: which softmax it is changes a few operations of the
routing, not the work a config schedules, so it is no field of the key and the tuner verifies the
renormalized form. The tolerance is the default by output dtype (TOLERANCE): a bf16 block rounds its
hidden rows and its output once each, about 2^-9 relative each, well inside 1e-2.

The routing is the op's own: no group sizes operand; the router's logits are its routing operand (kind
"routing"), made from each of the tuner's routing draws by `router_logits`, so that the block is verified
and timed on the routing the sweep asked for (balanced, skewed, recorded). A draw spreads T * top_k rows
over the E experts, at most T on one expert (OpSpec.routing_rows, expert_capacity).

FLOPs are those of the T * top_k rows' two GEMMs, 2 T k H 2F + 2 T k F H = 3 T k H n. Bytes are x, the
logits and the output plus the weights of the experts the tokens touch (`touched_bytes`), at decode sizes a
fraction of the layer's: Qwen3-30B-A3B at one token reads 8 experts' 75 MB of its 128 experts' 1.2 GB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ml_dtypes  # noqa: F401 - numpy then knows bfloat16 and the float8 dtypes by name
import numpy as np

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.ops.spec import Operand, OpSpec
from moetune.kernels.problem import DTYPES, Problem

if TYPE_CHECKING:
    import jax

NAME = "moe_decode_block"
# A router's logits: the chosen experts of each token lie in [CHOSEN_LOW, CHOSEN_HIGH), every other in
# [OTHER_LOW, OTHER_HIGH): a unit apart at least, so no rounding can change which experts are the top k,
# and the reference (top-k of the softmax probabilities) picks what a kernel (top-k of the logits) picks.
CHOSEN_LOW, CHOSEN_HIGH = 1.0, 3.0
OTHER_LOW, OTHER_HIGH = -3.0, 0.0
LOGITS_DTYPE = "float32"


def router_logits(problem: Problem, group_sizes: Sequence[int], seed: int) -> jax.Array:
    """[T, E] float32 logits whose top_k experts per token are exactly a routing draw's: expert e takes
    group_sizes[e] of the T * top_k (token, choice) rows, at most one per token.

    The rows of the draw, sorted by expert, are dealt to the tokens in turn: row i goes to token
    order[i % T] (order a random permutation), so an expert's consecutive rows, at most T of them, meet
    each token once, and each token gets top_k rows. Example: T=2, top_k=2, sizes [1, 2, 1] -> rows'
    experts [0, 1, 1, 2], order [1, 0]: token 1 takes experts 0 and 1, token 0 experts 1 and 2."""
    import jax.numpy as jnp

    tokens, experts, top_k = problem.m, problem.g, problem.top_k
    sizes = np.asarray(group_sizes, dtype=np.int64)
    if sizes.shape != (experts,) or sizes.sum() != tokens * top_k or sizes.min() < 0 or sizes.max() > tokens:
        raise ConfigInvalid(
            f"{NAME}: a routing draw must spread T*top_k={tokens * top_k} rows over E={experts} experts, at "
            f"most T={tokens} on one; got group sizes of sum {int(sizes.sum())}, largest {int(sizes.max())}"
        )
    draw = np.random.default_rng([seed, *(int(s) for s in sizes)])
    expert_of_row = np.repeat(np.arange(experts), sizes)
    token_of_row = draw.permutation(tokens)[np.arange(tokens * top_k) % tokens]
    logits = draw.uniform(OTHER_LOW, OTHER_HIGH, (tokens, experts))
    logits[token_of_row, expert_of_row] = draw.uniform(CHOSEN_LOW, CHOSEN_HIGH, tokens * top_k)
    return jnp.asarray(logits.astype(LOGITS_DTYPE))


X = Operand("x", lambda p: (p.m, p.k), lambda p: p.lhs_dtype, stddev=lambda p: 1.0)
ROUTER_LOGITS = Operand(
    "router_logits", lambda p: (p.m, p.g), lambda p: LOGITS_DTYPE, kind="routing", from_routing=router_logits
)
# Scaled by 1/sqrt of the contraction, as the grouped GEMM's rhs is: hidden rows and outputs near unit size.
W_GATE_UP = Operand(
    "w_gate_up",
    lambda p: (p.g, p.n, p.k) if p.transpose_rhs else (p.g, p.k, p.n),
    lambda p: p.rhs_dtype,
    stddev=lambda p: 1.0 / math.sqrt(p.k),
    weights=True,
)
W_DOWN = Operand(
    "w_down",
    lambda p: (p.g, p.k, p.n // 2) if p.transpose_rhs else (p.g, p.n // 2, p.k),
    lambda p: p.rhs_dtype,
    stddev=lambda p: 1.0 / math.sqrt(p.n // 2),
    weights=True,
)


def dims_of(x: Any, router_logits: Any, w_gate_up: Any, transpose_rhs: bool) -> tuple[int, int, int, int]:
    """(m, k, n, g) = (T, H, 2F, E) of x [T, H], router_logits [T, E] and w_gate_up [E, H, 2F] ([E, 2F, H]
    with `transpose_rhs`), the op's first three operands in the places of a grouped GEMM's (lhs, rhs, group
    sizes); ValueError naming the first misfit."""
    if len(x.shape) != 2:
        raise ValueError(f"x must be [T, H]; got shape {tuple(x.shape)}")
    tokens, hidden = x.shape
    if len(router_logits.shape) != 2 or router_logits.shape[0] != tokens:
        raise ValueError(f"router_logits must be [T={tokens}, E]; got shape {tuple(router_logits.shape)}")
    experts = router_logits.shape[1]
    hidden_at = 2 if transpose_rhs else 1
    shape = tuple(w_gate_up.shape)
    if len(shape) != 3 or (shape[0], shape[hidden_at]) != (experts, hidden):
        layout = f"2F, H={hidden}" if transpose_rhs else f"H={hidden}, 2F"
        raise ValueError(f"w_gate_up must be [E={experts}, {layout}]; got shape {shape}")
    return int(tokens), int(hidden), int(shape[3 - hidden_at]), int(experts)


def problem_of(
    x: Any, router_logits: Any, w_gate_up: Any, *, top_k: int, transpose_rhs: bool = False
) -> Problem:
    """The Problem of a call of the block on these operands (arrays or jax.ShapeDtypeStructs): the output
    in x's dtype; `transpose_rhs` for K-major weights. ValueError (ConfigInvalid for the op's rules)
    naming the first misfit."""
    m, k, n, g = dims_of(x, router_logits, w_gate_up, transpose_rhs)
    dtype = np.dtype(x.dtype).name
    return Problem(
        NAME, m, k, n, g, dtype, np.dtype(w_gate_up.dtype).name, dtype, transpose_rhs=transpose_rhs,
        top_k=top_k,
    )  # fmt: skip


def reference(
    x: jax.Array,
    router_logits: jax.Array,
    w_gate_up: jax.Array,
    w_down: jax.Array,
    *,
    transpose_rhs: bool,
    top_k: int,
) -> jax.Array:
    """The float32 block: moe_mlp_reference on float32 copies (every product exact, nothing rounded
    between the GEMMs), the weights renormalized over each token's top_k; K-major weights are transposed
    back to [E, H, 2F] and [E, F, H] first."""
    import jax.numpy as jnp

    from moetune.kernels.moe.reference import moe_mlp_reference

    if transpose_rhs:
        w_gate_up, w_down = (jnp.swapaxes(w, 1, 2) for w in (w_gate_up, w_down))
    f32 = [jnp.asarray(a, jnp.float32) for a in (x, router_logits, w_gate_up, w_down)]
    return moe_mlp_reference(*f32, top_k=top_k, renormalize=True)


def flops(problem: Problem) -> int:
    """The two GEMMs of the T * top_k rows: 2 T k H 2F (gate_up) + 2 T k F H (down) = 3 T k H n."""
    return 3 * problem.m * problem.top_k * problem.k * problem.n


def touched_experts(problem: Problem) -> float:
    """Experts the tokens pick under uniform routing: each token picks top_k of the E apart, so an expert
    escapes one token with odds 1 - top_k / E and all T of them with (1 - top_k / E)^T."""
    return problem.g * (1.0 - (1.0 - problem.top_k / problem.g) ** problem.m)


def touched_bytes(problem: Problem) -> int:
    """x, the logits and the output, plus the weights of the touched experts (`touched_experts`)."""
    item = np.dtype(problem.rhs_dtype).itemsize
    per_expert = (problem.k * problem.n + problem.n // 2 * problem.k) * item
    rows = problem.m * (
        problem.k * (np.dtype(problem.lhs_dtype).itemsize + np.dtype(problem.out_dtype).itemsize)
    )
    logits = problem.m * problem.g * np.dtype(LOGITS_DTYPE).itemsize
    return int(round(touched_experts(problem) * per_expert)) + rows + logits


def _one_dtype(problem: Problem) -> str | None:
    dtypes = {problem.lhs_dtype, problem.rhs_dtype, problem.out_dtype}
    if len(dtypes) != 1:
        return (
            f"takes one dtype for x, the weights and the output; got lhs={problem.lhs_dtype}, "
            f"rhs={problem.rhs_dtype}, out={problem.out_dtype}"
        )
    return None


def _even_n(problem: Problem) -> str | None:
    return None if problem.n % 2 == 0 else f"needs an even n = 2F (gate and up halves); got n={problem.n}"


SPEC = OpSpec(
    name=NAME,
    summary="out[T, H] = the routed MoE MLP block of x[T, H]: top-k routing, gate_up, SwiGLU, down, combine",
    operands=(X, ROUTER_LOGITS, W_GATE_UP, W_DOWN),
    out_shape=lambda p: (p.m, p.k),
    reference=reference,
    dims_of=dims_of,
    flops=flops,
    operand_dtypes=DTYPES,
    out_dtypes=DTYPES,
    checks=(_one_dtype, _even_n),
    out_columns="H",
    routed=True,
    touched_bytes=touched_bytes,
)
