"""The routed MoE MLP layer on moetune's tuned grouped GEMM: `moe_mlp`.

    x[T, H] -- top-k routing --> T*k (token, expert) rows, sorted by expert
            -- gate_up grouped GEMM [T*k, H] x [E, H, 2F] --> SwiGLU --> [T*k, F]
            -- down grouped GEMM [T*k, F] x [E, F, H] --> weighted combine of each token's k rows --> [T, H]

What runs, on every backend (`xla` on CPU, `mosaic_gpu` on Hopper), and what is fused:
  * The GEMMs are `moetune.kernels` dispatched calls, so each is one Problem (`moe_problems` lists them)
    that the tuner sweeps and the dispatcher looks up at trace time.
  * The activation IS fused into the gate_up GEMM (the op whose spec has that epilogue:
    "grouped_matmul_swiglu" or "grouped_matmul_geglu", Problem n=2F, out_n=F) when the chosen backend
    serves that op: mosaic_gpu computes silu(gate) * up from its float32 accumulators and writes only
    [T*k, F]; xla (the plain fallback) runs ragged_dot in float32, then the activation. A backend that
    declines the op (mosaic_gpu declines geglu) gets the unfused path: the "grouped_matmul" GEMM writes
    [T*k, 2F] in the inputs' dtype and an XLA op applies the activation.
  * Routing (top-k, then the stable sort of the rows by expert) is pairwise comparisons while T*k and E
    are small (decode): on a GPU one Pallas Triton kernel (routing_kernel.py), elsewhere XLA reductions
    (the `routing_mode` argument chooses); lax.top_k and an argsort otherwise.
  * The token permutation is NOT fused into the first GEMM: a stable sort by expert, then a row gather
    (`jnp.take`) that writes a permuted [T*k, H] copy of the activations. See "grouped_matmul_gather".
  * The combine is NOT fused into the down GEMM: an XLA gather through the inverse permutation plus a
    float32 weighted sum over k (elementwise, which XLA can fuse into one pass over the [T*k, H] output).
  `moe_mlp_using` runs the same layer on any grouped GEMM (the benchmark's `ragged` path passes
  jax.lax.ragged_dot), so the tuned kernel and XLA's are compared inside identical surroundings.
  `moe_mlp_sorted` is the layer after routing and permutation, for a caller that did those itself (the
  model's decode step does them in one kernel with the norm and router: models/norm_router.py).

Extension points not implemented (each stage is one function that names the op that would replace it):
  * "grouped_matmul_gather"  (`_gate_up`): lhs rows read through `row_token` inside the kernel, so no
    permuted copy of x exists. Problem: m=T*k, k=H, n=2F, g=E. Not built for Hopper: sm90's TMA copies
    boxes of consecutive rows only. In jax 0.11.2, plgpu's copy_gmem_to_smem takes row indices only as
    a TMA gather4 (`cp.async.bulk.tensor...tile::gather4`, sm100 PTX), and its cp.async path raises
    NotImplementedError for gathers. On sm90 each lhs tile would then need one copy per row per K step
    instead of one box (issue slots and the swizzled layout wgmma reads, built by hand), to save one
    [T*k, H] pass that is small beside the GEMMs at prefill and not the bottleneck in decode.
  * "grouped_matmul_combine" (`_down_and_combine`): the epilogue adds each row, scaled by its routing
    weight, into out[token] (atomics, or a tile owning whole tokens), writing [T, H] directly. Problem:
    m=T*k, k=F, n=H, g=E. Not built: scaling the rows in the down GEMM's epilogue and leaving the top-k
    sum to XLA saves nothing, since the down GEMM still writes [T*k, H] and the sum still reads it once
    (today's multiply already runs inside that XLA pass); the gain needs the scatter-add, whose float32
    atomics need a float32 [T, H] output (or bf16x2 atomics that round every add) and a zeroing pass.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from moetune.kernels import ops, registry
from moetune.kernels.api import Explanation, call_op, explain, grouped_matmul, note_use, problem_of
from moetune.kernels.backend import Backend
from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint, current_fingerprint
from moetune.kernels.errors import ConfigInvalid, UnknownBackend, Unsupported
from moetune.kernels.lookup import LOOKUP
from moetune.kernels.moe import pallas_mode, routing_kernel
from moetune.kernels.moe.reference import check_moe_args, gated_activation
from moetune.kernels.ops import moe_decode_block, moe_decode_block_fp8
from moetune.kernels.problem import GROUPED_MATMUL, Problem, dtype_name

Array = Any
# gemm(lhs[M, K], rhs[G, K, N], group_sizes[G]) -> [M, N] in lhs's dtype, with jax.lax.ragged_dot semantics.
GroupedGemm = Callable[[Array, Array, Array], Array]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Routing:
    """Each token's top-k experts and their float32 combine weights, both [T, k]."""

    expert_ids: Array
    weights: Array


@jax.tree_util.register_dataclass
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


# The rows a decode-sized permuted lhs is produced with, for moe_mlp_sorted (M = T*k rows, the rest left
# unwritten): up to M's last 8-row boundary, then the tallest CTA tile mosaic_gpu runs (two 128-row
# consumers), so that its pad_lhs window lies inside the buffer whatever the config and no copy pads it.
PERMUTED_SLACK_ROWS = 256


def permuted_rows(m: int) -> int:
    return (m - 1) // 8 * 8 + PERMUTED_SLACK_ROWS


# Up to these sizes routing is computed by pairwise comparison (reductions that XLA fuses into a few
# kernels) instead of lax.top_k and a sort (XLA's sort, scatter and scatter-add kernels, one launch each).
# Top-k compares E^2 logits per token, cheap at any T for E <= 16 (prefill included); the sort compares
# (T*k)^2 rows, so only decode-sized batches use it and prefill keeps the argsort and bincount. On the
# H200 this took 9 us off one MoE block at T=1 (Mixtral-8x7B's shapes), nothing measurable in decode.
COMPARE_MAX_EXPERTS = 16
COMPARE_MAX_ROWS = 64


def route(router_logits: Array, top_k: int, renormalize: bool) -> Routing:
    """Top-k experts per token from the logits; weights are the softmax over all E experts, or with
    `renormalize` over the chosen k (the same values as renormalising those probabilities). Ties go to
    the lower expert index, as in lax.top_k."""
    logits = router_logits.astype(jnp.float32)
    if not 1 <= top_k <= logits.shape[1]:
        raise ConfigInvalid(f"top_k={top_k} must be between 1 and the {logits.shape[1]} experts")
    if logits.shape[1] <= COMPARE_MAX_EXPERTS:
        top_logits, expert_ids = _top_k_by_comparison(logits, top_k)
    else:
        top_logits, expert_ids = jax.lax.top_k(logits, top_k)
    if renormalize:
        weights = jax.nn.softmax(top_logits, axis=-1)
    else:
        weights = jnp.exp(top_logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True))
    return Routing(expert_ids=expert_ids.astype(jnp.int32), weights=weights)


def _top_k_by_comparison(logits: Array, top_k: int) -> tuple[Array, Array]:
    """lax.top_k's result from ranks: expert e's rank is the number of experts ordered before it (a
    larger logit, or an equal one at a lower index), so ranks are distinct and the top k are ranks 0..k-1.
    Logits compare in IEEE total order as lax.top_k's do (+0 above -0, NaNs by sign)."""
    experts = logits.shape[1]
    index = jnp.arange(experts)
    key = _total_order_key(logits)
    mine, other = key[:, :, None], key[:, None, :]
    ahead = (other > mine) | ((other == mine) & (index[None, :] < index[:, None]))  # [T, E, E]
    rank = jnp.sum(ahead, axis=2, dtype=jnp.int32)  # [T, E]
    pick = rank[:, None, :] == jnp.arange(top_k)[None, :, None]  # [T, k, E]: expert with rank j
    expert_ids = jnp.sum(jnp.where(pick, index, 0), axis=2, dtype=jnp.int32)
    top_logits = jnp.take_along_axis(logits, expert_ids, axis=1)  # a gather: -0.0 and NaN as they are
    return top_logits, expert_ids


def _total_order_key(x: Array) -> Array:
    """int32 keys of float32 values that order as IEEE totalOrder: flip the magnitude bits of negatives."""
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    return bits ^ ((bits >> 31) & jnp.int32(0x7FFFFFFF))


def sort_by_expert(expert_ids: Array, num_experts: int) -> SortedRows:
    """Stable sort of the flattened (token, slot) pairs by expert; see SortedRows for an example."""
    flat = expert_ids.reshape(-1)
    rows = flat.shape[0]
    if rows <= COMPARE_MAX_ROWS:
        slot_row, order = _sorted_rows_by_comparison(flat)
        group_sizes = jnp.sum(flat[None, :] == jnp.arange(num_experts)[:, None], axis=1, dtype=jnp.int32)
    else:
        order = jnp.argsort(flat, stable=True).astype(jnp.int32)
        slot_row = (
            jnp.zeros((rows,), jnp.int32)
            .at[order]
            .set(jnp.arange(rows, dtype=jnp.int32), unique_indices=True, mode="promise_in_bounds")
        )
        group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    return SortedRows(row_token=order // expert_ids.shape[1], slot_row=slot_row, group_sizes=group_sizes)


def _sorted_rows_by_comparison(flat: Array) -> tuple[Array, Array]:
    """(slot_row, order) of the stable sort of `flat`: a slot's sorted row is the number of slots that
    sort before it (a smaller expert, or the same expert at an earlier slot); `order` inverts that."""
    index = jnp.arange(flat.shape[0], dtype=jnp.int32)
    mine, other = flat[:, None], flat[None, :]
    before = (other < mine) | ((other == mine) & (index[None, :] < index[:, None]))
    slot_row = jnp.sum(before, axis=1, dtype=jnp.int32)
    order = jnp.sum(jnp.where(slot_row[None, :] == index[:, None], index, 0), axis=1, dtype=jnp.int32)
    return slot_row, order


def route_rows(
    router_logits: Array, top_k: int, renormalize: bool, routing_mode: str = "auto"
) -> tuple[Routing, SortedRows]:
    """`route`, then `sort_by_expert`: in one Pallas Triton kernel (routing_kernel.py) where the batch fits
    it and `routing_mode` does not resolve to "xla" ("auto": the kernel on a GPU, XLA's ops elsewhere;
    "interpret": the kernel in Pallas's interpreter), else as XLA ops."""
    tokens, experts = router_logits.shape
    mode = pallas_mode.resolve(routing_mode, "routing_mode")
    if mode != "xla" and routing_kernel.fits(tokens, experts, top_k):
        ids, weights, row_token, slot_row, sizes = routing_kernel.route_and_sort(
            router_logits, top_k, renormalize, interpret=mode == "interpret"
        )
        return Routing(ids, weights), SortedRows(row_token=row_token, slot_row=slot_row, group_sizes=sizes)
    routing = route(router_logits, top_k, renormalize)
    return routing, sort_by_expert(routing.expert_ids, experts)


def _permute(x: Array, rows: SortedRows) -> Array:
    """x's rows in expert order [T*k, H]. Fused op that would replace the take: "grouped_matmul_gather"."""
    return jnp.take(x, rows.row_token, axis=0, mode="clip")  # in bounds: clip only skips masking


def _gate_up(
    gemm: GroupedGemm,
    permuted: Array,
    rows: SortedRows,
    w_gate_up: Array,
    activation: str,
    fused: GroupedGemm | None = None,
) -> Array:
    """[T*k, F] activated hidden rows in expert order: through `fused` (the GEMM with `activation` in its
    epilogue, [M, K] x [G, K, 2F] -> [M, F]) when given, else the GEMM then the activation."""
    if fused is not None:
        return fused(permuted, w_gate_up, rows.group_sizes)
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
    routing_mode: str = "auto",
    transpose_weights: bool = False,
) -> Array:
    """`moe_mlp` with any grouped GEMM, unfused: baselines pass jax.lax.ragged_dot to time XLA's own
    kernel. With `transpose_weights` the weights are K-major and `gemm` must read them so."""
    check_moe_args(
        x, router_logits, *_k_by_n(w_gate_up, w_down, transpose_weights), top_k=top_k, activation=activation
    )
    routing, rows = route_rows(router_logits, top_k, renormalize, routing_mode)
    hidden = _gate_up(gemm, _permute(x, rows), rows, w_gate_up, activation)
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
    fuse: bool = True,
    routing_mode: str = "auto",
    group_offset: Array | None = None,
    w_gate_up_scale: Array | None = None,
    w_down_scale: Array | None = None,
    scale_layout: str = "none",
    transpose_weights: bool = False,
    decode_mode: str = "auto",
) -> Array:
    """Routed MoE MLP: out[t] = sum over t's top-k experts e of w[t, e] * down_e(act(gate_up_e(x[t]))).

    x [T, H]; router_logits [T, E]; w_gate_up [E, H, 2F] (gate columns first, then up); w_down [E, F, H].
    Returns [T, H] in x's dtype. Routing weights are the softmax of the logits over the chosen top_k
    experts (`renormalize`, Mixtral) or over all E (Qwen-MoE with norm_topk_prob=False). The GEMMs run on
    `backend` (None: the dispatcher's default for the device), each with its tuned config looked up at
    trace time; with `fuse` (the default) the gate_up GEMM is the op fusing the activation
    ("grouped_matmul_swiglu", "grouped_matmul_geglu") wherever `backend` serves that op, and `fuse=False`
    forces the unfused path (benchmarks compare the two).
    `routing_mode` says how top-k and the sort by expert run (`route_rows`): "auto" (the default) takes
    the one-kernel routing where it fits on a GPU and XLA's ops otherwise; "kernel", "xla", "interpret".
    `group_offset` ((1,) int32, expert parallelism): w_gate_up and w_down hold the local slice of
    experts [offset, offset + E_local) of the router's E; the result sums over the local experts only
    (rows routed elsewhere are zero), so the shards' results add up (a psum) to the whole layer's.
    Raises ConfigInvalid for bad shapes, top_k or routing_mode, Unsupported for an unknown activation.
    FP8 expert weights come with their float32 scales (`w_gate_up_scale`, `w_down_scale`) in
    `scale_layout`; the activations are then quantized on the fly in that layout (kernels/moe/fp8.py).
    With `transpose_weights` the weights are K-major, [E, 2F, H] and [E, H, F]: for FP8 weights the layout
    the Hopper FP8 kernel reads (quantize_weights(..., transpose=True) makes them); 16-bit ones run as the
    grouped GEMMs' t=1 problems, or the block's.
    `decode_mode` says when the fused decode block (the op "moe_decode_block": decode_block.py's two
    kernels, routing included) replaces this path (`decode_choice`): "auto" where its tuned winner for the
    T bucket was timed faster than this path, "kernel" wherever it fits on a Hopper GPU, "interpret"
    wherever it fits in Pallas's interpreter (CPU tests), "xla" never. recording() shows which ran: the
    block's decision, or the grouped GEMMs' of this path.
    """
    if scale_layout != "none":
        from moetune.kernels.moe.fp8 import moe_mlp_fp8  # it builds on this module

        choice = decode_choice(
            x, router_logits, w_gate_up, top_k, activation, backend, fuse, decode_mode,
            sliced=group_offset is not None, scale_layout=scale_layout, transpose_weights=transpose_weights,
        )  # fmt: skip
        choice.note_declined()
        if choice.kernel is not None:  # forward only: FP8 experts are served for inference
            note_use(choice.explanation)  # the op "moe_decode_block_fp8", its config and source
            return choice.kernel(
                x, router_logits, w_gate_up, w_gate_up_scale, w_down, w_down_scale, renormalize=renormalize,
                group_offset=group_offset, interpret=choice.interpret,
            )  # fmt: skip

        return moe_mlp_fp8(
            x, router_logits, w_gate_up, w_gate_up_scale, w_down, w_down_scale, top_k=top_k,
            scale_layout=scale_layout, renormalize=renormalize, activation=activation, backend=backend,
            fuse=fuse, routing_mode=routing_mode, transpose_weights=transpose_weights,
            group_offset=group_offset,
        )  # fmt: skip
    # A local slice is checked as the whole layer's weights would be.
    whole = [w if group_offset is None else _all_experts(w, router_logits) for w in (w_gate_up, w_down)]
    check_moe_args(x, router_logits, *_k_by_n(*whole, transpose_weights), top_k=top_k, activation=activation)
    choice = decode_choice(
        x,
        router_logits,
        w_gate_up,
        top_k,
        activation,
        backend,
        fuse,
        decode_mode,
        sliced=group_offset is not None,
        transpose_weights=transpose_weights,
    )
    choice.note_declined()
    if choice.kernel is not None:
        note_use(choice.explanation)  # recording() shows the block, its config and where it came from
        return _decode_forward(
            (choice.kernel, top_k, renormalize, choice.interpret, backend, transpose_weights),
            x, router_logits, w_gate_up, w_down, group_offset,
        )  # fmt: skip
    routing, rows = route_rows(router_logits, top_k, renormalize, routing_mode)
    options = dict(activation=activation, backend=backend, fuse=fuse, group_offset=group_offset)
    return moe_mlp_sorted(
        _permute(x, rows), routing, rows, w_gate_up, w_down, transpose_weights=transpose_weights, **options
    )


def _k_by_n(w_gate_up: Any, w_down: Any, transposed: bool) -> tuple[Any, Any]:
    """The weights' shapes as [E, H, 2F] and [E, F, H] (K-major ones swapped back), for the checks."""
    if not transposed:
        return w_gate_up, w_down
    return tuple(
        jax.ShapeDtypeStruct((w.shape[0], w.shape[2], w.shape[1]), w.dtype) for w in (w_gate_up, w_down)
    )


@dataclasses.dataclass(frozen=True)
class DecodeChoice:
    """Whether `moe_mlp` runs the fused decode block (`config` set) or the unfused path, and why: `reason`
    names where the decision came from. When the block runs, `explanation` is its dispatch decision (the
    op "moe_decode_block", its backend, config and source: what recording() shows) and `kernel` the
    backend's kernel for it; "auto" declining on that decision (no tuned winner, or the unfused one) keeps
    it in `explanation`, with no kernel."""

    config: KernelConfig | None
    interpret: bool
    reason: str
    explanation: Explanation | None = None
    kernel: Callable[..., Any] | None = None

    def note_declined(self) -> None:
        """Where "auto" declined on the block's resolution, count the miss as a dispatch counts one, so
        that `moetune tune --misses` finds the block's untuned buckets (a stale winner is warned about)."""
        if self.explanation is not None and self.kernel is None:
            explanation = self.explanation
            LOOKUP.note_use(explanation.problem, explanation.resolution, explanation.device)


def decode_choice(
    x: Any,
    router_logits: Any,
    w_gate_up: Any,
    top_k: int,
    activation: str = "swiglu",
    backend: str | None = None,
    fuse: bool = True,
    decode_mode: str = "auto",
    *,
    sliced: bool = False,
    device: DeviceFingerprint | None = None,
    scale_layout: str = "none",
    transpose_weights: bool = False,
) -> DecodeChoice:
    """Whether `moe_mlp` takes the fused decode block (op "moe_decode_block", on FP8 weights with scales in
    `scale_layout` "moe_decode_block_fp8") for these operands, with which config, and why. `sliced`: the
    weights are a local slice of experts (group_offset); `device`: the running device, by default;
    `transpose_weights`: K-major weights, the block's t=1 problem.

    The block's problem is (T bucket, shapes, dtypes, layout, top_k): dispatch resolves it as any op's, exact
    winner, else the nearest tuned T, else the heuristic. A sweep times the unfused path first as the
    op's baseline (SearchSpace.baseline), so a tuned winner other than it was measured faster than it:
      auto       the block where the tuned winner is the block; otherwise (no winner, the winner is the
                 unfused path, a backend whose kernels are the unfused path, a local slice whose whole
                 layer was tuned, no GPU) the unfused path;
      kernel     the block wherever a backend runs it on this GPU: the tuned winner, or the heuristic's
                 config where there is none or the winner is the unfused path;
      interpret  as kernel, in Pallas's interpreter, on any device;
      xla        never.
    FP8 experts decide alike on the FP8 block's own problem, whose baseline is the unfused FP8 path."""
    mode = pallas_mode.check(decode_mode, "decode_mode")
    decline = lambda why: DecodeChoice(None, False, why)  # noqa: E731
    if mode == "xla":
        return decline("decode_mode='xla'")
    if not fuse or activation != "swiglu":
        return decline(f"fuse={fuse}, activation={activation!r}: the block fuses swiglu only")
    one_dtype = jnp.dtype(x.dtype) in (jnp.bfloat16, jnp.float16, jnp.float32) and w_gate_up.dtype == x.dtype
    if scale_layout == "none" and not one_dtype:
        return decline(f"x {x.dtype}, weights {w_gate_up.dtype}: the block takes one 16- or 32-bit dtype")
    experts = router_logits.shape[1]
    whole = jax.ShapeDtypeStruct((experts, *w_gate_up.shape[1:]), w_gate_up.dtype)  # a slice's whole layer
    layout = dict(top_k=top_k, transpose_rhs=transpose_weights)
    try:
        if scale_layout == "none":
            problem = moe_decode_block.problem_of(x, router_logits, whole, **layout)
        else:
            problem = moe_decode_block_fp8.problem_of(
                x, router_logits, whole, scale_layout=scale_layout, **layout
            )
    except ValueError as e:  # ConfigInvalid included
        return decline(str(e))
    device = device or current_fingerprint()
    if mode == "interpret":
        return _interpreted_choice(problem, device)
    if device.platform != "gpu":
        return decline("not on a GPU")
    try:
        explanation = explain(problem, backend=backend, device=device)
    except (Unsupported, ExceptionGroup) as e:
        return decline(_declined(e))
    runs = registry.get(explanation.backend)
    baseline = runs.search_space(problem, device).baseline
    if baseline is None:  # xla: its kernels for the block's problem are the unfused path
        why = "; ".join(explanation.declined) or f"{explanation.backend} serves the block as the unfused path"
        return decline(why)
    tuned = explanation.source not in ("heuristic", "explicit config")
    fused = explanation.config != baseline
    if mode == "kernel":
        # A winner that is the unfused path: the caller asked for the block all the same.
        if not fused:
            why = f"the {explanation.source} winner is unfused"
            explanation = _heuristic(explanation, runs, device, why=why)
        return _taken(explanation, runs, False, f"decode_mode='kernel': the {explanation.source} config")
    if sliced:
        return decline("group_offset: the block's winners are tuned for whole layers; the unfused path runs")
    # Declined with the block's resolution: moe_mlp notes its use (a miss counted, a stale winner warned
    # about), so that `moetune tune --misses` finds the block's untuned buckets.
    resolved = lambda why: DecodeChoice(None, False, why, explanation)  # noqa: E731
    if not tuned:
        return resolved(
            f"no tuned winner for {problem.key} on {device.device_kind}: decode_mode='auto' keeps the "
            "unfused path until a sweep times the block faster (the heuristic's config serves 'kernel')"
        )
    if not fused:
        return resolved(
            f"the {explanation.source} winner is the unfused path: it was timed faster than the block"
        )
    origin = (
        explanation.source if explanation.from_m is None else f"{explanation.source} (T={explanation.from_m})"
    )
    return _taken(
        explanation, runs, False, f"the {origin} winner: the block was timed faster than the unfused path"
    )


def _declined(error: Exception) -> str:
    """One line of why no backend runs the block (an Unsupported, or every backend's in a group)."""
    if isinstance(error, ExceptionGroup):
        return "; ".join(str(e) for e in error.exceptions)
    return str(error)


def _interpreted_choice(problem: Problem, device: DeviceFingerprint) -> DecodeChoice:
    """decode_mode='interpret': the block of the highest-priority backend that runs it (available here or
    not), with its winner on this device, else its heuristic's config, in Pallas's interpreter."""
    for runs in sorted(map(registry.get, _block_backends(problem.op)), key=lambda b: -b.priority):
        try:
            runs.check(problem)
        except Unsupported as e:
            return DecodeChoice(None, False, str(e))
        baseline = runs.search_space(problem, device).baseline
        if baseline is None:
            continue
        resolution = LOOKUP.resolve(problem, runs, device)
        explanation = Explanation(
            problem, device, runs.name, "decode_mode='interpret'", resolution.config, resolution.source,
            resolution.from_m, resolution.stale, (), resolution.median_s,
        )  # fmt: skip
        if resolution.config == baseline:
            explanation = _heuristic(
                explanation, runs, device, why=f"the {resolution.source} winner is unfused"
            )
        return _taken(explanation, runs, True, f"decode_mode='interpret': the {explanation.source} config")
    return DecodeChoice(None, False, "no backend runs the fused decode block")


def _block_backends(op: str) -> list[str]:
    """The registered backends whose table holds the block's `op` (available on this device or not)."""
    names = []
    for name in registry.names():
        try:
            if op in registry.get(name).kernels:
                names.append(name)
        except UnknownBackend:  # an optional dependency missing: that backend runs nothing here
            continue
    return names


def _heuristic(
    explanation: Explanation, runs: Backend, device: DeviceFingerprint, *, why: str
) -> Explanation:
    """`explanation` with the backend's heuristic config in place of its winner's, saying why."""
    return dataclasses.replace(
        explanation,
        config=runs.heuristic(explanation.problem, device),
        source=f"heuristic ({why})",
        from_m=None,
        stale=(),
        median_s=None,
        heuristic_basis=runs.heuristic_basis(device),
    )


def _taken(explanation: Explanation, runs: Backend, interpret: bool, reason: str) -> DecodeChoice:
    kernel = runs.build(explanation.problem, explanation.config)
    return DecodeChoice(explanation.config, interpret, reason, explanation, kernel)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _decode_forward(static, x, router_logits, w_gate_up, w_down, group_offset):
    """The fused block forward; its backward is the unfused path's (recomputed), since the block has none."""
    kernel, top_k, renormalize, interpret, _, _ = static
    return kernel(
        x, router_logits, w_gate_up, w_down, renormalize=renormalize, group_offset=group_offset,
        interpret=interpret,
    )  # fmt: skip


def _decode_fwd(static, x, router_logits, w_gate_up, w_down, group_offset):
    out = _decode_forward(static, x, router_logits, w_gate_up, w_down, group_offset)
    return out, (x, router_logits, w_gate_up, w_down, group_offset)


def _decode_bwd(static, saved, cotangent):
    _, top_k, renormalize, _, backend, transposed = static
    *diff, group_offset = saved
    unfused = lambda *a: moe_mlp(  # noqa: E731
        *a, top_k=top_k, renormalize=renormalize, backend=backend, group_offset=group_offset,
        transpose_weights=transposed, decode_mode="xla",
    )  # fmt: skip
    _, vjp = jax.vjp(unfused, *diff)
    return (*vjp(cotangent), None)


_decode_forward.defvjp(_decode_fwd, _decode_bwd)


def _all_experts(local: Array, router_logits: Array) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((router_logits.shape[1], *local.shape[1:]), local.dtype)


def moe_mlp_sorted(
    permuted: Array,
    routing: Routing,
    rows: SortedRows,
    w_gate_up: Array,
    w_down: Array,
    *,
    activation: str = "swiglu",
    backend: str | None = None,
    fuse: bool = True,
    group_offset: Array | None = None,
    transpose_weights: bool = False,
) -> Array:
    """`moe_mlp` after its routing and permutation, for a caller that computed them itself (a decode
    kernel that norms, routes and gathers in one program: models/norm_router.py).

    permuted [P, H]: the rows of x in expert order (row r is token rows.row_token[r]); P may exceed T*k,
    and rows past T*k are ignored, so that a producer can leave the padding a backend's tile wants
    (`grouped_matmul`'s `rows`). Returns [T, H] as `moe_mlp` does; `group_offset` and `transpose_weights`
    (16-bit K-major weights) as for `moe_mlp`.
    """
    tokens, top_k = routing.weights.shape
    m = tokens * top_k
    if permuted.ndim != 2 or permuted.shape[0] < m or rows.row_token.shape != (m,):
        raise ConfigInvalid(
            f"permuted {permuted.shape} must hold the {m} sorted rows of {tokens} tokens x top_k {top_k}"
        )
    layout = dict(backend=backend, group_offset=group_offset, transpose_rhs=transpose_weights)
    gemm = functools.partial(grouped_matmul, **layout)
    gate_up = functools.partial(grouped_matmul, rows=m, **layout)
    fused = None
    fused_op = ops.fusing(activation) if fuse else None
    if fused_op is not None:
        lhs = jax.ShapeDtypeStruct((m, permuted.shape[1]), permuted.dtype)
        if serves(fused_op.name, lhs, w_gate_up, backend, transpose_rhs=transpose_weights):
            fused = functools.partial(call_op, fused_op.name, rows=m, **layout)
    hidden = _gate_up(gate_up, permuted, rows, w_gate_up, activation, fused)
    return _down_and_combine(gemm, hidden, rows, w_down, routing)


def serves(op: str, lhs: Any, rhs: Any, backend: str | None = None, *, transpose_rhs: bool = False) -> bool:
    """Whether the first backend asked for `op` on these operands (`backend`, else the dispatcher's
    choice) computes it itself rather than passing it down the fallback chain."""
    try:
        explanation = explain(problem_of(lhs, rhs, op=op, transpose_rhs=transpose_rhs), backend=backend)
    except (Unsupported, ExceptionGroup):
        return False
    return not explanation.declined


def moe_problems(
    tokens: int,
    hidden: int,
    intermediate: int,
    experts: int,
    top_k: int,
    dtype: Any = "bfloat16",
    fuse: bool = True,
    activation: str = "swiglu",
) -> tuple[Problem, Problem]:
    """The (gate_up, down) Problems `moe_mlp` dispatches for `tokens` tokens: what a sweep should tune.

    With `fuse` the gate_up Problem is the op fusing `activation` ("grouped_matmul_swiglu" for swiglu:
    what the layer runs on a backend that serves it), else "grouped_matmul" (the unfused path).
    """
    dtype = jnp.dtype(dtype_name(dtype))
    rows = tokens * top_k
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
    fused_op = ops.fusing(activation) if fuse else None
    gate_up_op = GROUPED_MATMUL if fused_op is None else fused_op.name
    return (
        problem_of(spec(rows, hidden), spec(experts, hidden, 2 * intermediate), op=gate_up_op),
        problem_of(spec(rows, intermediate), spec(experts, intermediate, hidden)),
    )
