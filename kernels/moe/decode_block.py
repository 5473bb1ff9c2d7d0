"""The MoE MLP block at decode sizes in two Pallas Triton kernels, routing included.

    kernel 1  grid (P, F / block_f, up_split), P = min(T*k, E_local) work slots, or up_programs
              programs each streaming a contiguous share of the flat (slot, F tile, split, K step) list
              (the few slots a share spans found once before its loop, each unit's rows stored in a
              branch at its last step, so a step is its loads, its dots and a few scalar selects).
              Every program routes the whole batch itself from router_logits [T, E] (softmax scores,
              top-k by repeated argmax or, with route_by_rank, by each expert's rank among its row's,
              weights renormalized or not, as `moe.route`) on the batch's own rows (with
              route_warp_rows, padded to a row per warp: routing_rows), takes the p-th
              touched local expert in ascending order (a cumulative sum over the touched mask), and
              runs gate_up over its F tile and its share of H for every token. With
              up_split == 1 it applies SwiGLU to the float32 accumulators and stores its expert's rows
              of hidden[P, T', F] (T' = the dot's padded rows; a token not routed to the expert gets
              zeros); with up_split > 1 it stores its float32 gate and up partial sums, which kernel 2
              adds in split order before the SwiGLU (more programs where experts are few and F is
              narrow, wider column tiles). The expert's first program also writes its entries of two
              small tables for kernel 2 (expert id, each token's routing weight or 0).
    kernel 2  grid (H / block_h, down_split)
              each program streams w_down[e, :, its H tile] of its share of the flat list of (touched
              expert, F step) pairs (one loop, so the weight loads pipeline across experts) and sums the
              weighted products in float32 in ascending expert order. Every address in that loop is
              arithmetic on the loop index (hidden is laid out by work slot, the expert ids are held
              in registers): no load waits on another, so the weight tiles pipeline `stages` deep.
              With down_split == 1 it owns its H tile and writes out[T, H] directly; with
              down_split > 1 the programs of one H tile write float32 partial sums, and the last to
              arrive (an integer counter zeroed by kernel 1) adds them in split order 0, 1, ... and
              writes out. Both are deterministic: no float atomics, and
              the order of every sum is fixed whatever the programs' timing.
Neither needs its tiles to divide H or F, only multiples of 16 (DIM_MULTIPLE): the last tile of a dim
runs past its end, masked there (_tail), and a dim the tiles divide compiles unmasked.

Why Pallas Triton and not Mosaic GPU: the routing is scalar-heavy work on [T, E] (argmax rounds,
cumulative sums, gathers by token) that Triton expresses as ordinary array code, and rows of x and of
hidden are gathered by index vectors, which sm90 TMA (boxes of consecutive rows) does not do. Each
program's weight stream is pipelined `stages` tiles deep by Triton's cp.async pipeliner, and the grids
put hundreds of programs on the SMs, which is what reading at the HBM roofline needs.

What bounds it: at decode sizes both kernels stream the touched experts' weights once, so the block is
at the HBM roofline when enough weight bytes are in flight on every SM (programs x stages x tile bytes)
and nothing serial precedes the first load. Two things precede it: the launch, and kernel 1's routing,
which every program repeats on [T, E] (k rounds of two reductions over E); it grows with T and E, so the
block pays most where experts are many and the weights read per token few. `up_split`, `down_split` and
the tile widths trade programs in flight against per-program work; the op's search space and cost model
(kernels/backends/mosaic_gpu/space_decode.py, cost_model_decode.py) choose them, and `moe_mlp`'s "auto"
takes the block only where a sweep timed it faster than the unfused path.

Numerics: GEMMs take the inputs' dtype and accumulate in float32; hidden is rounded to x's dtype (as the
fused gate_up GEMM of the unfused path rounds it); the down products and the weighted combine stay in
float32 until out is rounded once. FP8 weights are widened to x's dtype tile by tile, so only the weights
are 8-bit. The backward is not fused: `moe_mlp` recomputes the unfused path's for 16-bit experts and
serves FP8 experts forward only (see layer.py).

A shared expert (Qwen3-Next) is not part of this block: it is a dense MLP that runs beside it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe import fp8_widen
from moetune.kernels.moe.pallas_mode import pow2_at_least

Array = Any
DOT_ROWS = 16  # the smallest M of Triton's dot: the token rows are padded to at least this in registers
MAX_TOKENS = 32  # every program holds the batch's [T, E] routing and its [T, block] tiles in registers
MAX_ROWS = 320  # T * top_k: the work slots of kernel 1's grid (Qwen3-Next at T=32 is 320)
MAX_EXPERTS = 1024  # [T, E] routing arrays per program
INT32_MIN = -(2**31)
# route_by_rank compares every pair of a row's experts: [T, E] of them at most (padded), taken
# RANK_CHUNK_ELEMENTS // (T*E) other experts at a time.
RANK_MAX_ROUTED = 4096
RANK_CHUNK_ELEMENTS = 8192
# With up_programs, the work slots one program's share may span, each found (and held) before its loop.
MAX_SHARE_SLOTS = 8
# H and F need only be multiples of this, not of the tiles: a last tile past a dim's end loads zeros there
# and stores nothing (masked). 16 values keep each 16-byte vector of a 16-bit or FP8 row wholly inside or
# wholly past the end, so a mask is constant over a vector and the loads stay vectorized.
DIM_MULTIPLE = 16


# DecodeConfig's fields that say how each kernel reads FP8 weight tiles (kernel 1's, kernel 2's).
WIDEN_FIELDS = ("widen_up", "widen_down")


@dataclasses.dataclass(frozen=True, slots=True)
class DecodeConfig:
    """The two kernels' tiling: the op's search space once it is tuned."""

    block_f: int = 32  # kernel 1: F columns (of gate and of up each) per program
    block_k: int = 128  # kernel 1: H rows of w_gate_up per loop step
    stages_up: int = 4  # kernel 1: weight tiles in flight per program
    warps_up: int = 4
    block_h: int = 64  # kernel 2: output columns per program
    block_fd: int = 128  # kernel 2: F rows of w_down per loop step
    stages_down: int = 4
    warps_down: int = 4
    down_split: int = 1  # kernel 2 programs per H tile; > 1: partial sums meet in a fixed-order pass
    up_split: int = 1  # kernel 1 programs per (expert, F tile), each over H / up_split rows of K; > 1:
    # they write float32 gate and up partials that kernel 2 sums in split order before the SwiGLU
    up_programs: int = 0  # kernel 1: 0, a program per (expert, F tile, split); > 0, that many programs,
    # each routing once and streaming a contiguous share of the flat (expert, F tile, split, K step) list
    route_by_rank: bool = False  # kernel 1's top-k: False, k argmax rounds; True, each expert's rank
    # among its row's (T*E^2 compares, few reductions: the shorter chain where T*E is small)
    route_warp_rows: bool = False  # kernel 1 routes on at least warps_up rows (routing_rows): padding
    # rows give each warp a row of its own, so its reductions over E need no barrier
    widen_up: str = "convert"  # how kernel 1 widens FP8 weight tiles (fp8_widen.MODES); 16-bit: convert
    widen_down: str = "convert"  # the same for kernel 2
    swap_ab_up: bool = False  # kernel 1's dots as w^T @ x^T (the weight tile the A operand), transposed
    # back: Triton then feeds a widened FP8 tile to the tensor cores from registers (wgmma where the tile
    # has 64 columns or more) instead of moving it into mma's operand registers
    swap_ab_down: bool = False  # the same for kernel 2

    def __post_init__(self):
        for name in ("block_f", "block_k", "block_h", "block_fd"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ConfigInvalid(f"{name}={value} must be a power of two >= 16")
        for name in ("stages_up", "stages_down", "down_split", "up_split"):
            if getattr(self, name) < 1:
                raise ConfigInvalid(f"{name}={getattr(self, name)} must be >= 1")
        if self.up_programs < 0:
            raise ConfigInvalid(f"up_programs={self.up_programs} must be >= 0")
        for name in ("warps_up", "warps_down"):
            if getattr(self, name) not in (1, 2, 4, 8, 16):
                raise ConfigInvalid(f"{name}={getattr(self, name)} must be a power of two up to 16")
        for name in WIDEN_FIELDS:
            if getattr(self, name) not in fp8_widen.MODES:
                raise ConfigInvalid(f"{name}={getattr(self, name)!r} is not one of {fp8_widen.MODES}")

    @property
    def name(self) -> str:
        return "_".join(f"{f.name}{getattr(self, f.name)}" for f in dataclasses.fields(self))


def unfit_reason(
    tokens: int, experts: int, top_k: int, hidden: int, intermediate: int, config: DecodeConfig
) -> str | None:
    """None where the block runs these sizes with `config`, else a short reason."""
    if tokens > MAX_TOKENS:
        return f"T={tokens} > {MAX_TOKENS}"
    if tokens * top_k > MAX_ROWS:
        return f"T*top_k={tokens * top_k} > {MAX_ROWS}"
    if experts > MAX_EXPERTS:
        return f"E={experts} > {MAX_EXPERTS}"
    routed = routing_rows(tokens, config)
    if config.route_by_rank and routed * pow2_at_least(experts) > RANK_MAX_ROUTED:
        return (
            f"route_by_rank takes T*E <= {RANK_MAX_ROUTED} (powers of two, {routed} routed rows), "
            f"not {tokens}*{experts}"
        )
    for name, size in (("H", hidden), ("F", intermediate)):
        if size % DIM_MULTIPLE:
            return f"{name}={size} is not a multiple of {DIM_MULTIPLE}"
    k_steps = tiles(hidden, config.block_k)
    per_split = split_steps(hidden, config.block_k, config.up_split)
    if (config.up_split - 1) * per_split >= k_steps:
        return (
            f"up_split={config.up_split} leaves a split no K step of H={hidden} "
            f"({k_steps} steps of block_k={config.block_k})"
        )
    if config.up_programs:
        units = tiles(intermediate, config.block_f) * config.up_split
        spanned = slots_per_share(min(tokens * top_k, experts), units, config.up_programs)
        if spanned > MAX_SHARE_SLOTS:
            return (
                f"up_programs={config.up_programs} leaves a program {spanned} work slots to find before "
                f"its loop (at most {MAX_SHARE_SLOTS})"
            )
    return None


def widening_unfit_reason(
    config: DecodeConfig, gate_up_dtype: Any, down_dtype: Any, dtype: Any
) -> str | None:
    """None where each kernel's widening (WIDEN_FIELDS) reads its weights' dtype with x's `dtype`, else
    the first field's reason (fp8_widen.unfit_reason)."""
    for name, weights in zip(WIDEN_FIELDS, (gate_up_dtype, down_dtype), strict=True):
        reason = fp8_widen.unfit_reason(getattr(config, name), weights, dtype)
        if reason is not None:
            return f"{name}: {reason}"
    return None


def fits(tokens: int, experts: int, top_k: int, hidden: int, intermediate: int, config: DecodeConfig) -> bool:
    return unfit_reason(tokens, experts, top_k, hidden, intermediate, config) is None


def tiles(size: int, tile: int) -> int:
    """Tiles of `tile` over a dim of `size`, the last partial where `tile` does not divide it."""
    return -(-size // tile)


def split_steps(hidden: int, block_k: int, up_split: int) -> int:
    """Kernel 1's K steps per split: H's block_k steps shared by up_split programs, the last split taking
    what remains (fewer steps where they do not divide)."""
    return tiles(tiles(hidden, block_k), up_split)


def routing_rows(tokens: int, config: DecodeConfig) -> int:
    """The rows kernel 1 routes on: the batch's own (a power of two), or with route_warp_rows at least
    one per warp. With fewer rows than warps, Triton lays a row of the [rows, E] arrays across the
    warps, so each reduction over E crosses them through shared memory and a barrier; with a row per
    warp it stays inside its warp (Qwen3-30B-A3B's one token, argmax, 4 warps, compiled for sm_90a: 59
    barriers before the first dot, 20 so, and about as many instructions). Where E is wider than a
    warp's lanes hold, a row still spans warps and the padding only adds work: the tuner decides. The
    padding rows' logits are -inf and nothing of theirs is stored."""
    rows = pow2_at_least(tokens)
    return max(rows, config.warps_up) if config.route_warp_rows else rows


def slots_per_share(slots: int, slot_units: int, programs: int) -> int:
    """The most work slots one of `programs` contiguous shares of `slots` * `slot_units` units spans:
    kernel 1 with up_programs routes that many slots before its loop. Example: 320 slots of 8 units
    over 128 programs: shares of at most 20 units, which start anywhere in a slot and so span up to
    ceil(20 / 8) + 1 = 4 slots."""
    share = -(-slots * slot_units // programs)
    return min(slots, -(-share // slot_units) + 1)


def decode_block(
    x: Array,
    router_logits: Array,
    w_gate_up: Array,
    w_down: Array,
    *,
    top_k: int,
    renormalize: bool = True,
    group_offset: Array | None = None,
    config: DecodeConfig = DecodeConfig(),
    transpose_weights: bool = False,
    w_gate_up_scale: Array | None = None,
    w_down_scale: Array | None = None,
    interpret: bool = False,
) -> Array:
    """out[T, H] = sum over t's top-k experts e of w[t, e] * down_e(silu(gate_e(x[t])) * up_e(x[t])).

    x [T, H]; router_logits [T, E]; w_gate_up [E_local, H, 2F] (gate columns first); w_down [E_local, F, H];
    with `transpose_weights` K-major instead: [E_local, 2F, H] and [E_local, H, F].
    `group_offset` ((1,) int32): the weights hold experts [offset, offset + E_local) of the router's E and
    out sums over those only. FP8 weights come with float32 scales (`w_gate_up_scale`, `w_down_scale`),
    one per block of each weight in its own layout, as kernels/ops/fp8_scales.py lays them out ([E, 1, 1]
    per tensor, [E, 1, N] per channel, [E, K/128, N/128] in 128x128 blocks; K-major: the last two
    swapped): each tile is widened on chip as `config.widen_up` / `widen_down` say (fp8_widen.py: exact)
    and its product scaled, so the weights cross HBM once at one byte per value and x is never quantized.
    Shapes are checked by the caller (`moe_mlp`); this raises ConfigInvalid where `fits` is False or a
    scale does not fit."""
    tokens, hidden = x.shape
    experts = router_logits.shape[1]
    local = w_gate_up.shape[0]
    inter = w_gate_up.shape[1 if transpose_weights else 2] // 2
    reason = unfit_reason(tokens, experts, top_k, hidden, inter, config)
    if reason is not None:
        raise ConfigInvalid(f"decode block: {reason}")
    scales = _scale_blocks(w_gate_up, w_gate_up_scale, w_down, w_down_scale, transpose_weights, config)
    reason = widening_unfit_reason(config, w_gate_up.dtype, w_down.dtype, x.dtype)
    if reason is not None:
        raise ConfigInvalid(f"decode block: {reason}")
    rows = max(DOT_ROWS, pow2_at_least(tokens))
    slots = min(tokens * top_k, local)
    offset = jnp.zeros((1,), jnp.int32) if group_offset is None else group_offset.reshape(1).astype(jnp.int32)
    h_tiles, f_tiles = tiles(hidden, config.block_h), tiles(inter, config.block_f)
    i32, f32 = jnp.int32, jnp.float32
    up_split = config.up_split
    # Laid out by work slot, so kernel 2 reads an expert's rows at an address it computes: one split,
    # hidden rows after the SwiGLU in x's dtype; more, each split's float32 gate and up partial sums side
    # by side ([split, P, T', 2F]), which kernel 2 adds in split order.
    hidden_shape = (
        jax.ShapeDtypeStruct((slots, rows, inter), x.dtype)
        if up_split == 1
        else jax.ShapeDtypeStruct((up_split, slots, rows, 2 * inter), f32)
    )
    hidden_rows, expert_of, weight_of, count, counter = pl.pallas_call(
        functools.partial(
            _up_kernel, tokens=tokens, experts=experts, local=local, top_k=top_k, renormalize=renormalize,
            rows=rows, inter=inter, config=config, transposed=transpose_weights, scale_block=scales[0],
            interpret=interpret,
        ),
        out_shape=(
            hidden_shape,
            jax.ShapeDtypeStruct((pow2_at_least(slots),), i32),  # a power of two: kernel 2 loads it whole
            jax.ShapeDtypeStruct((slots, rows), f32),
            jax.ShapeDtypeStruct((1,), i32),
            jax.ShapeDtypeStruct((h_tiles,), i32),
        ),
        grid=(config.up_programs, 1, 1) if config.up_programs else (slots, f_tiles, up_split),
        compiler_params=pltriton.CompilerParams(num_warps=config.warps_up, num_stages=config.stages_up),
        interpret=interpret,
        name="moetune_decode_up",
    )(x, router_logits, w_gate_up, offset, *([w_gate_up_scale] if scales[0] else []))  # fmt: skip
    split = config.down_split
    out, _, _ = pl.pallas_call(
        functools.partial(
            _down_kernel, tokens=tokens, rows=rows, inter=inter, dtype=x.dtype, config=config,
            transposed=transpose_weights, scale_block=scales[1], interpret=interpret,
        ),
        out_shape=(
            jax.ShapeDtypeStruct((tokens, hidden), x.dtype),
            jax.ShapeDtypeStruct((split if split > 1 else 1, tokens, hidden), f32),
            jax.ShapeDtypeStruct((h_tiles,), i32),
        ),
        grid=(h_tiles, split),
        input_output_aliases={5: 2},
        compiler_params=pltriton.CompilerParams(num_warps=config.warps_down, num_stages=config.stages_down),
        interpret=interpret,
        name="moetune_decode_down",
    )(
        hidden_rows, w_down, expert_of, weight_of, count, counter,
        *([w_down_scale] if scales[1] else []),
    )  # fmt: skip
    return out


def _scale_blocks(w_gate_up, gate_up_scale, w_down, down_scale, transposed, config):
    """Per weight, None (16- or 32-bit weights) or the (K rows, N columns) one scale covers; ConfigInvalid
    where scales come without FP8 weights or do not divide them, or where a K tile would straddle two
    scale blocks."""
    if (gate_up_scale is None) != (down_scale is None):
        raise ConfigInvalid("decode block: give both weight scales or neither")
    if gate_up_scale is None:
        return None, None
    blocks = []
    for name, w, scale, k_tile in (
        ("w_gate_up", w_gate_up, gate_up_scale, config.block_k),
        ("w_down", w_down, down_scale, config.block_fd),
    ):
        if jnp.dtype(w.dtype).itemsize != 1:
            raise ConfigInvalid(f"decode block: {name} is {w.dtype}; scales come with FP8 weights")
        _, k, n = (w.shape[0], w.shape[2], w.shape[1]) if transposed else w.shape
        # [E, K/bk, N/bn] (K-major: [E, N/bn, K/bk]); any other rank is refused before it is read.
        sk, sn = (
            ((scale.shape[2], scale.shape[1]) if transposed else scale.shape[1:])
            if scale.ndim == 3
            else (0, 0)
        )
        if not (sk and sn) or scale.shape[0] != w.shape[0] or k % sk or n % sn:
            raise ConfigInvalid(f"decode block: {name}_scale {scale.shape} does not divide {name} {w.shape}")
        block = (k // sk, n // sn)
        if sk > 1 and block[0] % k_tile:
            raise ConfigInvalid(
                f"decode block: a K tile of {k_tile} straddles {name}'s scale blocks of {block[0]} rows"
            )
        blocks.append(block)
    return tuple(blocks)


def _silu(gate):
    return gate / (1.0 + jnp.exp(-gate))


def _order_key(logits):
    """int32 keys in the IEEE total order of float32 `logits` (the map is its own inverse)."""
    bits = jax.lax.bitcast_convert_type(logits, jnp.int32)
    return bits ^ ((bits >> 31) & jnp.int32(0x7FFFFFFF))


def route_in_kernel(logits, *, tokens: int, experts: int, top_k: int, renormalize: bool, ranks=None):
    """Inside a program: (ids [rows, kp] int32, weights [rows, kp] float32, taken [rows, E'] bool) of float32
    logits [rows, E'] (powers of two; padding -inf). Top-k is k rounds of argmax over int32 keys in IEEE
    total order (ties to the lower expert, as lax.top_k), or with `ranks` (each expert's [rows, E'] rank
    among its row's, from rank_in_kernel) the experts ranked below k; `taken` marks each real token's
    chosen experts. Both give the same ids, values and weights."""
    rows, ep = logits.shape
    kp = pow2_at_least(top_k)
    expert, slot = jnp.arange(ep), jnp.arange(kp)
    real_expert = expert < experts
    if ranks is None:
        key = _order_key(logits)
        taken = jnp.zeros((rows, ep), jnp.bool_)
        ids = jnp.zeros((rows, kp), jnp.int32)
        top = jnp.full((rows, kp), -jnp.inf, jnp.float32)
        for j in range(top_k):
            avail = real_expert[None, :] & ~taken
            keys = jnp.where(avail, key, INT32_MIN)
            best = jnp.max(keys, axis=1)
            pick = jnp.min(jnp.where(avail & (keys == best[:, None]), expert[None, :], ep), axis=1)
            taken = taken | (expert[None, :] == pick[:, None])
            # The key's map is its own inverse: the chosen logit comes back from `best` without a third
            # reduction over E.
            value = jax.lax.bitcast_convert_type(best ^ ((best >> 31) & jnp.int32(0x7FFFFFFF)), jnp.float32)
            ids = jnp.where(slot[None, :] == j, pick[:, None], ids)
            top = jnp.where(slot[None, :] == j, value[:, None], top)
    else:
        # One [rows, kp, E'] pick instead of k rounds: the expert of rank j fills slot j.
        taken = (ranks < top_k) & real_expert[None, :]
        hit = (ranks[:, None, :] == slot[None, :, None]) & taken[:, None, :]
        ids = jnp.sum(jnp.where(hit, expert[None, None, :], 0), axis=2)
        top = jnp.sum(jnp.where(hit, logits[:, None, :], 0.0), axis=2)
        top = jnp.where((slot < top_k)[None, :], top, -jnp.inf)
    if renormalize:
        exp = jnp.exp(top - jnp.max(top, axis=1)[:, None])
        weights = exp / jnp.sum(exp, axis=1)[:, None]
    else:
        row_max = jnp.max(logits, axis=1)
        total = jnp.sum(jnp.exp(logits - row_max[:, None]), axis=1)
        weights = jnp.exp(top - row_max[:, None]) / total[:, None]
    real_token = jnp.arange(rows) < tokens
    return ids, weights, taken & real_token[:, None]


def rank_chunk(rows: int, experts: int) -> int:
    """The other experts rank_in_kernel compares at a time: [rows, E, chunk] within RANK_CHUNK_ELEMENTS."""
    return max(1, min(experts, RANK_CHUNK_ELEMENTS // (rows * experts)))


def rank_in_kernel(logits, load_chunk, *, experts: int, chunk: int):
    """Each expert's rank in its row ([rows, E'] int32): how many real experts come before it in the
    order top-k takes them (a greater logit, or an equal one at a lower index). The other experts come
    `chunk` at a time from `load_chunk(c)` ([rows, chunk] float32 logits of experts [c*chunk, ...)), so
    that the [rows, E', chunk] compares fit in registers: T*E^2 compares and one reduction per chunk, in
    place of argmax's 2k reductions over E, each a round trip through shared memory."""
    rows, ep = logits.shape
    key = _order_key(logits)[:, :, None]
    expert = jnp.arange(ep)[None, :, None]

    def add_chunk(c, ranks):
        other = _order_key(load_chunk(c))[:, None, :]
        j = (c * chunk + jnp.arange(chunk))[None, None, :]
        before = (j < experts) & ((other > key) | ((other == key) & (j < expert)))
        return ranks + jnp.sum(before.astype(jnp.int32), axis=2)

    return jax.lax.fori_loop(0, ep // chunk, add_chunk, jnp.zeros((rows, ep), jnp.int32))


def _tail(start, size: int, limit: int):
    """Which of the indices [start, start + size) lie below `limit`: the mask of a tile in a dim its tiles
    do not divide (in one they divide, the kernels trace no mask at all)."""
    return start + jnp.arange(size) < limit


def _masked(ref, index, row_mask, column_mask):
    """The 2-D tile ref[index], its lanes outside the masks (None: no tail in that dim) read as 0: the last
    tile of a dim its tiles do not divide loads only what lies inside."""
    if row_mask is None and column_mask is None:
        return ref[index]
    rows = True if row_mask is None else row_mask[:, None]
    columns = True if column_mask is None else column_mask[None, :]
    return pltriton.load(ref.at[index], mask=rows & columns, other=jnp.zeros((), ref.dtype))


def _dot_weights(
    rows_in, w_ref, expert, ks, cols, transposed: bool, precision, scale=None, widen=None, scaled=True,
    tails=(None, None), swap_ab=False,
):  # fmt: skip
    """rows_in [rows, K tile] @ the expert's weight tile (K rows ks, columns cols) in float32; a K-major
    weight ([E, N, K]) is read as its [N tile, K tile] block and contracted on its second dim. `tails`:
    the masks (_tail) of the tile's K rows and columns inside the weight, where a dim has a last partial
    tile; `swap_ab`: the dot as w^T @ rows_in^T, transposed back (the same sum of products). `scale`
    (scale_ref, (K rows, N columns) per scale, first column index): FP8 weights, read as
    `widen` ((mode, interpret): fp8_widen.operands) says and, where `scaled`, the product scaled by the
    tile's column scales (else the caller scales the sum of its steps, the scales being the same at
    every step)."""
    k_mask, n_mask = tails
    if transposed:
        w = _masked(w_ref, (expert, cols, ks), n_mask, k_mask)
    else:
        w = _masked(w_ref, (expert, ks, cols), k_mask, n_mask)
    row_factor = None
    if scale is not None:
        rows_in, w, row_factor = fp8_widen.operands(rows_in, w, *widen)
    if swap_ab:  # w^T [N, K] as the A operand: a K-major tile is that as it is loaded
        w_t = w if transposed else w.T
        dims = (((1,), (0,)), ((), ()))
        part = jax.lax.dot_general(
            w_t, rows_in.T, dims, precision=precision, preferred_element_type=jnp.float32
        ).T
    else:
        dims = (((1,), (1,)), ((), ())) if transposed else (((1,), (0,)), ((), ()))
        part = jax.lax.dot_general(rows_in, w, dims, precision=precision, preferred_element_type=jnp.float32)
    if row_factor is not None:
        part = part * row_factor[:, None]
    if scale is None or not scaled:
        return part
    scale_ref, block, first = scale
    tail = (k_mask is not None, n_mask is not None)
    factor = _column_scales(
        scale_ref, block, expert, ks.start // block[0], first, part.shape[1], transposed, tail
    )
    return part * factor[None, :]


def _column_scales(
    scale_ref, block, expert, k_index, first, width: int, transposed: bool, tail=(False, False)
):
    """The expert's scales of `width` columns from `first`, in K block `k_index` (`block`: the K rows and
    N columns one scale covers). `tail` (K, N): where tiles run past the weight's end in that dim, an
    index past it reads the last scale (its products are zeros) so that no load leaves the array."""
    n_index = (first + jnp.arange(width)) // block[1]
    k_blocks, n_blocks = (scale_ref.shape[2], scale_ref.shape[1]) if transposed else scale_ref.shape[1:]
    if tail[0]:
        k_index = jnp.minimum(k_index, k_blocks - 1)
    if tail[1]:
        n_index = jnp.minimum(n_index, n_blocks - 1)
    return scale_ref[expert, n_index, k_index] if transposed else scale_ref[expert, k_index, n_index]


def _widen(values, rows: int):
    """[R] per-token values of the routing's rows onto the dot's `rows` (R <= rows, both powers of
    two); rows past R get 0 (False)."""
    (narrow,) = values.shape
    if narrow == rows:
        return values
    same = jnp.arange(rows)[:, None] == jnp.arange(narrow)[None, :]
    if values.dtype == jnp.bool_:
        return jnp.max(jnp.where(same, values.astype(jnp.int32)[None, :], 0), axis=1) > 0
    return jnp.sum(jnp.where(same, values[None, :], jnp.zeros((), values.dtype)), axis=1)


def _up_kernel(
    x_ref, logits_ref, w_ref, offset_ref, *refs,
    tokens, experts, local, top_k, renormalize, rows, inter, config, transposed, scale_block, interpret,
):  # fmt: skip
    scale_ref = refs[0] if scale_block else None
    hidden_ref, expert_ref, weight_ref, count_ref, counter_ref = refs[1:] if scale_block else refs
    p, f, s = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    hidden_size = x_ref.shape[1]
    ep, kp = pow2_at_least(experts), pow2_at_least(top_k)
    # The routing runs on the batch's own rows (a power of two) or one per warp (routing_rows), not on
    # the dot's padded 16: at one token that is a sixteenth of the work every program does before its
    # first weight load.
    narrow = routing_rows(tokens, config)
    token, expert, slot = jnp.arange(narrow), jnp.arange(ep), jnp.arange(kp)
    real_token = token < tokens
    logits = pltriton.load(
        logits_ref.at[pl.ds(0, narrow), pl.ds(0, ep)],
        mask=real_token[:, None] & (expert < experts)[None, :],
        other=-jnp.inf,
    ).astype(jnp.float32)
    ranks = None
    if config.route_by_rank:
        chunk = rank_chunk(narrow, ep)

        def chunk_at(c):
            first = pl.multiple_of(c * chunk, chunk)
            return pltriton.load(
                logits_ref.at[pl.ds(0, narrow), pl.ds(first, chunk)],
                mask=real_token[:, None] & ((first + jnp.arange(chunk)) < experts)[None, :],
                other=-jnp.inf,
            ).astype(jnp.float32)

        ranks = rank_in_kernel(logits, chunk_at, experts=experts, chunk=chunk)
    ids, weights, taken = route_in_kernel(
        logits, tokens=tokens, experts=experts, top_k=top_k, renormalize=renormalize, ranks=ranks
    )
    # The touched local experts in ascending order; a program takes work slot p (slot_of).
    offset = offset_ref[0]
    is_local = (expert >= offset) & (expert < offset + local)
    touched = (jnp.max(taken.astype(jnp.int32), axis=0) > 0) & is_local
    running = jnp.cumsum(touched.astype(jnp.int32))
    count = jnp.sum(touched.astype(jnp.int32))
    bf, bk = config.block_f, config.block_k
    dtype = x_ref.dtype
    precision = jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None

    def slot_of(p):
        """Work slot p's expert (the p-th touched local expert, ascending; local index), its routing
        (which dot rows are its tokens, their weights) and whether it has one. Example: E=8, local
        experts [0, 8), tokens chose {1, 4, 6} -> touched 01001010, running count 01122333, so p=1 is
        the expert where touched and count == 2: expert 4."""
        active = p < count
        e = jnp.sum(jnp.where(touched & (running == p + 1), expert, 0))
        routed = (ids == e) & (slot < top_k)[None, :]  # [narrow, kp]: at most one slot per token
        mine = _widen((jnp.max(routed.astype(jnp.int32), axis=1) > 0) & real_token & active, rows)
        weight = _widen(jnp.sum(jnp.where(routed, weights, 0.0), axis=1), rows)
        return jnp.where(active, e - offset, 0), mine, weight, active

    # Scales per channel or per tensor are the same at every K step: a unit's sums are scaled once,
    # before they are stored, instead of every step's product (block scales change along K).
    once = bool(scale_block) and scale_block[0] >= hidden_size

    # H's K steps shared by the splits and F's tiles: where they do not divide, the last runs past the
    # end, and its loads and stores are masked there (_tail); else they cover both exactly and the
    # kernel is traced as it is without tails, op for op.
    split = config.up_split
    f_tiles, unit_steps = tiles(inter, bf), split_steps(hidden_size, bk, split)
    k_tail, f_tail = unit_steps * split * bk != hidden_size, f_tiles * bf != inter

    def x_tile(clamped, ks):
        """x's [rows, block_k] tile at K rows `ks` (the padding rows read the last token's)."""
        if not k_tail:
            return x_ref[clamped, ks]
        # Index arrays: the interpreter's masked loads take no mix of arrays and slices.
        at = x_ref.at[clamped[:, None], (ks.start + jnp.arange(bk))[None, :]]
        return pltriton.load(at, mask=_tail(ks.start, bk, hidden_size)[None, :], other=0)

    def f_columns(tile):
        """F tile `tile`'s gate and up columns. The up columns start at F, which a tile need not divide:
        their hint is what F and the tile share."""
        gate = pl.ds(pl.multiple_of(tile * bf, bf), bf)
        return gate, pl.ds(pl.multiple_of(inter + tile * bf, math.gcd(inter, bf)), bf)

    def gate_up_step(xs, local_e, tile, gate_cols, up_cols, ks, acc):
        """The gate and up accumulators after one K step of F tile `tile`."""
        gate, up = acc
        tails = (
            _tail(ks.start, bk, hidden_size) if k_tail else None,
            _tail(tile * bf, bf, inter) if f_tail else None,
        )
        gate_scale = up_scale = None
        if scale_block:
            gate_scale = (scale_ref, scale_block, tile * bf)
            up_scale = (scale_ref, scale_block, inter + tile * bf)
        widen = (config.widen_up, interpret)
        step = functools.partial(
            _dot_weights, xs, w_ref, local_e, ks, widen=widen, scaled=not once, tails=tails,
            swap_ab=config.swap_ab_up,
        )  # fmt: skip
        gate += step(gate_cols, transposed, precision, gate_scale)
        up += step(up_cols, transposed, precision, up_scale)
        return gate, up

    def store_hidden(part, p, local_e, tile, row, columns, gate, up, mine, mask):
        """Slot p's hidden rows at `columns` (F tile `tile` of local expert `local_e`): with one split the
        SwiGLU in x's dtype, else split `part`'s float32 gate and up partial sums, which kernel 2 adds in
        split order. A last tile past F stores its columns inside it alone."""
        if f_tail:
            mask = mask & (columns < inter)
        if once:
            scales = functools.partial(
                _column_scales, scale_ref, scale_block, local_e, 0, width=bf, tail=(False, f_tail)
            )
            gate = gate * scales(tile * bf, transposed=transposed)[None, :]
            up = up * scales(inter + tile * bf, transposed=transposed)[None, :]
        if split == 1:
            value = jnp.where(mine[:, None], _silu(gate) * up, 0.0).astype(dtype)
            pltriton.store(hidden_ref.at[p, row, columns], value, mask=mask)
        else:
            for value, at in ((gate, columns), (up, inter + columns)):
                pltriton.store(
                    hidden_ref.at[part, p, row, at], jnp.where(mine[:, None], value, 0.0), mask=mask
                )

    def store_tables(p, local_e, mine, weight, first):
        """Kernel 2's tables, written once per expert: its id and each token's routing weight or 0."""
        pltriton.store(
            expert_ref.at[pl.ds(p, 1)], jnp.full((1,), local_e, jnp.int32), mask=jnp.full((1,), first)
        )
        pltriton.store(
            weight_ref.at[p, pl.ds(0, rows)], jnp.where(mine, weight, 0.0), mask=jnp.full((rows,), first)
        )

    # The batch's real rows of an expert's slot: a token routed elsewhere stores zeros (its weight is 0
    # there, and 0 * a finite value cannot carry a NaN of another token's x into the sum); the padding
    # rows are neither stored nor read (padding rows of x read the last token). Index arrays, not
    # slices: the interpreter's stores take one kind.
    if config.up_programs:
        # One program streams a contiguous share of the flat (slot, F tile, K split, K step) list in one
        # loop, so its weight loads pipeline across slots and F tiles, and it routes once for all of
        # them. The few slots a share spans (slots_per_share) are found before the loop, so a step
        # picks its expert among them with scalar selects instead of a reduction over E; a unit's
        # accumulators are stored (with up_split == 1 the SwiGLU rows, else its float32 gate and up
        # partial sums, as the grid of one program per unit stores them) and restarted in a branch
        # taken at its last K step only. Where the splits do not divide H's steps, the last split's
        # steps past H load nothing (masked) and add zeros.
        dot_token = jnp.arange(rows)
        clamped = jnp.minimum(dot_token, tokens - 1)
        row, real_rows = dot_token[:, None], (dot_token < tokens)[:, None]
        slot_units = f_tiles * split
        units = count * slot_units
        work = units * unit_steps
        share = (units + config.up_programs - 1) // config.up_programs * unit_steps
        lo = jnp.minimum(p * share, work)
        hi = jnp.minimum(lo + share, work)
        first_slot = lo // unit_steps // slot_units
        spanned = slots_per_share(min(tokens * top_k, local), slot_units, config.up_programs)
        # Each slot's (expert, its tokens' rows, their routing weights), the j-th for first_slot + j.
        experts_of, mines, weights = zip(*(slot_of(first_slot + j)[:3] for j in range(spanned)), strict=True)

        def pick(j, values):
            """values[j] by selects (a share's slots are few and known only at run time)."""
            picked = values[0]
            for at in range(1, len(values)):
                picked = jnp.where(j == at, values[at], picked)
            return picked

        def store_unit(slot_p, tile, part, acc):
            j = slot_p - first_slot
            local_e, mine, weight = pick(j, experts_of), pick(j, mines), pick(j, weights)
            columns = (tile * bf + jnp.arange(bf))[None, :]
            store_hidden(part, slot_p, local_e, tile, row, columns, *acc, mine, real_rows)
            store_tables(slot_p, local_e, mine, weight, (tile == 0) & (part == 0))
            return tuple(jnp.zeros_like(a) for a in acc)

        def stream(i, acc):
            unit, k = i // unit_steps, i % unit_steps
            slot_p, tile, part = unit // slot_units, unit // split % f_tiles, unit % split
            local_e = pick(slot_p - first_slot, experts_of)
            ks = pl.ds(pl.multiple_of((part * unit_steps + k) * bk, bk), bk)
            gate_cols, up_cols = f_columns(tile)
            acc = gate_up_step(x_tile(clamped, ks), local_e, tile, gate_cols, up_cols, ks, acc)
            return jax.lax.cond(
                k == unit_steps - 1, lambda a: store_unit(slot_p, tile, part, a), lambda a: a, acc
            )

        zeros = jnp.zeros((rows, bf), jnp.float32)
        jax.lax.fori_loop(lo, hi, stream, (zeros, zeros))
    else:
        local_e, mine, weight, active = slot_of(p)
        dot_token = jnp.arange(rows)
        clamped = jnp.minimum(dot_token, tokens - 1)
        gate_cols, up_cols = f_columns(f)
        k_start = s * (unit_steps * bk)
        # An idle program streams nothing; where the splits do not divide H's steps, the last has fewer.
        steps = unit_steps if not k_tail else jnp.minimum(unit_steps, tiles(hidden_size, bk) - s * unit_steps)
        steps = jnp.where(active, jnp.int32(steps), jnp.int32(0))

        def step(i, acc):
            ks = pl.ds(pl.multiple_of(k_start + i * bk, bk), bk)
            return gate_up_step(x_tile(clamped, ks), local_e, f, gate_cols, up_cols, ks, acc)

        zeros = jnp.zeros((rows, bf), jnp.float32)
        gate, up = jax.lax.fori_loop(0, steps, step, (zeros, zeros))
        row = dot_token[:, None]
        columns = (f * bf + jnp.arange(bf))[None, :]
        keep = ((dot_token < tokens) & active)[:, None]
        store_hidden(s, p, local_e, f, row, columns, gate, up, mine, keep)
        store_tables(p, local_e, mine, weight, active & (f == 0) & (s == 0))

    # The count and the zeroed arrival counters, once per call.
    once = (p == 0) & (f == 0) & (s == 0)
    pltriton.store(count_ref.at[pl.ds(0, 1)], jnp.full((1,), count, jnp.int32), mask=jnp.full((1,), once))
    h_tiles = counter_ref.shape[0]
    for start in range(0, h_tiles, 1024):
        n = min(1024, h_tiles - start)
        width = pow2_at_least(n)
        lanes = jnp.arange(width)
        pltriton.store(
            counter_ref.at[pl.ds(start, width)], jnp.zeros((width,), jnp.int32), mask=(lanes < n) & once
        )


def _down_kernel(
    hidden_ref, w_ref, expert_ref, weight_ref, count_ref, _counter_in, *refs,
    tokens, rows, inter, dtype, config, transposed, scale_block, interpret,
):  # fmt: skip
    scale_ref = refs[0] if scale_block else None
    out_ref, partial_ref, counter_ref = refs[1:] if scale_block else refs
    h, s = pl.program_id(0), pl.program_id(1)
    split = config.down_split
    bh, bk = config.block_h, config.block_fd
    precision = jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None
    hidden = out_ref.shape[1]
    cols = pl.ds(pl.multiple_of(h * bh, bh), bh)
    columns = (h * bh + jnp.arange(bh))[None, :]  # for stores: index arrays, as in _up_kernel
    # Where block_h does not divide H (block_fd F), the last H tile (F step) runs past the end: its loads
    # and stores are masked there (_tail); where they divide, no mask is traced.
    h_tail = _tail(h * bh, bh, hidden) if hidden % bh else None
    # The work is the flat list of (touched expert, F step) pairs in ascending order; split s takes a
    # contiguous share of it, so few experts with wide F (Mixtral at one token) split as well as many.
    f_steps = jnp.int32(tiles(inter, bk))
    work = count_ref[0] * f_steps
    share = (work + split - 1) // split
    lo = jnp.minimum(s * share, work)
    hi = jnp.minimum(lo + share, work)

    token = jnp.arange(rows)
    real = (token < tokens)[:, None]
    # Every touched expert's id, held in registers: the step picks its own with a compare and a sum,
    # so the weight tile's address waits on no load.
    slot_ids = jnp.arange(expert_ref.shape[0])
    expert_ids = expert_ref[...]

    def hidden_rows(p, f0, f_tail):
        """Work slot p's [rows, bk] SwiGLU outputs at F columns [f0, f0 + bk), in x's dtype; the padding
        rows, and the columns past F of a last step past it, are 0 and never read."""
        mask = real if f_tail is None else real & f_tail[None, :]
        if config.up_split == 1:
            at = hidden_ref.at[p, pl.ds(0, rows), pl.ds(pl.multiple_of(f0, bk), bk)]
            return pltriton.load(at, mask=mask, other=0.0)
        gate = jnp.zeros((rows, bk), jnp.float32)
        up = jnp.zeros((rows, bk), jnp.float32)
        gate_cols = pl.ds(pl.multiple_of(f0, bk), bk)
        up_cols = pl.ds(pl.multiple_of(inter + f0, math.gcd(inter, bk)), bk)
        for part in range(config.up_split):  # kernel 1's K splits, added in split order
            index = (jnp.int32(part), p, pl.ds(0, rows))
            gate += pltriton.load(hidden_ref.at[(*index, gate_cols)], mask=mask, other=0.0)
            up += pltriton.load(hidden_ref.at[(*index, up_cols)], mask=mask, other=0.0)
        return (_silu(gate) * up).astype(dtype)

    def step(i, acc):
        p = i // f_steps
        f0 = (i % f_steps) * bk
        e = jnp.sum(jnp.where(slot_ids == p, expert_ids, 0))
        weight = weight_ref[p, pl.ds(0, rows)]
        f_tail = _tail(f0, bk, inter) if inter % bk else None
        rows_in = hidden_rows(p, f0, f_tail)
        ks = pl.ds(pl.multiple_of(f0, bk), bk)
        scale = (scale_ref, scale_block, h * bh) if scale_block else None
        widen = (config.widen_down, interpret)
        part = _dot_weights(
            rows_in, w_ref, e, ks, cols, transposed, precision, scale, widen, tails=(f_tail, h_tail),
            swap_ab=config.swap_ab_down,
        )  # fmt: skip
        return acc + part * weight[:, None]

    acc = jax.lax.fori_loop(lo, hi, step, jnp.zeros((rows, bh), jnp.float32))
    # Padding rows point one past the end: a masked lane touches no memory on the GPU, and the interpreter
    # (which stores every lane, masked ones with the value read) drops out-of-bounds lanes.
    beyond = jnp.where(token < tokens, token, tokens)[:, None]
    if h_tail is not None:  # and a last H tile's columns past H store nothing
        real = real & h_tail[None, :]
    if split == 1:
        pltriton.store(out_ref.at[beyond, columns], acc.astype(out_ref.dtype), mask=real)
        return
    pltriton.store(partial_ref.at[s, beyond, columns], acc, mask=real)
    # Every thread's partial sum is stored before the counter moves (the barrier), and the counter's
    # atomic add (acquire-release, GPU scope) publishes them to the program that arrives last.
    if not interpret:  # the interpreter runs programs one at a time and has no barrier
        pltriton.debug_barrier()
    arrived = pltriton.atomic_add(counter_ref, (h,), jnp.int32(1))
    last = arrived == split - 1
    total = jnp.zeros((rows, bh), jnp.float32)
    for other in range(split):  # fixed order, whichever program arrived last
        total += pltriton.load(
            partial_ref.at[other, beyond, columns], mask=real & last, other=0.0, volatile=True
        )
    pltriton.store(out_ref.at[beyond, columns], total.astype(out_ref.dtype), mask=real & last)
