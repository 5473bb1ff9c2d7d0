"""A Mixtral-style decoder in JAX: RMSNorm, grouped-query attention with RoPE and a KV cache, MoE MLP;
with the config's options, Qwen3's q/k RMSNorm and DeepSeek's shared experts (see ModelConfig).

Entry points (all jitted; `config`, `moe_path` and `choices` are static, the cache is donated and updated
in place):
  forward_full(params, tokens)                    -> logits [B, S, V] of every position, no cache
  prefill(params, tokens, cache)                  -> (logits of the last position [B, V], cache)
  decode_step(params, tokens, cache, pos)         -> (logits [B, V], cache); tokens [B] sit at `pos`
  decode_loop(params, tokens, cache, pos, steps)  -> (greedy tokens [B, steps], cache), one fori_loop

On a GPU a decode step (one new token, with a cache) attends through decode_attention.py's Pallas Triton
kernels, batches of up to 4 rows take the attention's RMSNorm + wqkv and its wo from gemv.py's kernel, and up
to 64 tokens take the MoE block's RMSNorm and router logits from norm_router.py's kernel; on the moetune
path, up to 8 (token, expert) rows take the norm, router, routing and the rows gathered in expert order
from its norm_route_gather kernel instead. `choices` (a KernelChoices) says which of them run: a field at
"xla" keeps XLA's ops, "interpret" runs the kernel in Pallas's interpreter, and "auto" (the default) means
the kernel on a GPU and XLA elsewhere. With gemv, decode_attention and norm_route_gather on, the moetune
path's decode step carries its residual stream in float32, and wo's GEMV adds into it with atomics, so the
first residual add is no kernel of its own (decode_residual="add": two XLA adds).

`choices.decode_block` is moe_mlp's `decode_mode` on the moetune path: where moe_mlp's decode_choice takes
the fused decode block for a block's rows (up to 32 tokens; `moe_decode_choice` says which
and why), the block routes the rows itself, so norm_route_gather does not run: the block's rows come
from norm_router's kernel or XLA's norm and router, in the model's dtype.

Layers are a Python loop, unrolled into the program, rather than a scan over stacked [L, ...] weights:
inside a loop, a layer's weights would be a dynamic slice of the stacked array, which XLA on GPU may copy
to a buffer of its own before a GEMM reads it; a copy of all the expert weights per step would cost more
than the decode step itself (it reads only the top-k experts). Unrolling costs compile time instead; the
MoE block, whose kernels are the costliest to lower, is one jitted function that every layer calls.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe import layer as moe
from moetune.kernels.moe import pallas_mode
from moetune.kernels.moe.reference import gated_activation
from moetune_lab.model import decode_attention, gemv, norm_router
from moetune_lab.model.config import ModelConfig
from moetune_lab.model.kernel_choices import DEFAULT_CHOICES, KernelChoices
from moetune_lab.model.moe_paths import SORTED_MOE_PATHS
from moetune_lab.model.moe_paths import moe_path as moe_fn
from moetune_lab.model.weights import LayerParams, ModelParams

Array = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Per-layer keys and values, each [B, kv_heads, max_len, head_dim]; positions >= the fill are junk.

    Heads before positions, so that attention's dots read the cache in place (batch dims b, g lead),
    without a transposed copy of the whole cache in every decode step.
    """

    keys: tuple[Array, ...]
    values: tuple[Array, ...]

    @classmethod
    def empty(cls, config: ModelConfig, batch: int, max_len: int) -> KVCache:
        shape = (batch, config.kv_heads, max_len, config.head_dim)
        zeros = lambda: jnp.zeros(shape, jnp.dtype(config.dtype))
        return cls(
            keys=tuple(zeros() for _ in range(config.layers)),
            values=tuple(zeros() for _ in range(config.layers)),
        )


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32)).astype(x.dtype)


def rotation(positions: Array, half: int, theta: float) -> tuple[Array, Array]:
    """RoPE's cos and sin [S, D/2] (float32) at `positions` [S]."""
    inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    return jnp.cos(angles), jnp.sin(angles)


def rope(x: Array, positions: Array, theta: float) -> Array:
    """Rotary embedding, half-split convention (as Mixtral's checkpoints): x [B, S, N, D], positions [S]."""
    cos, sin = rotation(positions, x.shape[-1] // 2, theta)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _attend(config: ModelConfig, q: Array, k: Array, v: Array, mask: Array) -> Array:
    """q [B, Sq, heads, D], k and v [B, kv_heads, Skv, D], mask [Sq, Skv] -> [B, Sq, heads * D].

    Query head h reads kv head h // (heads / kv_heads), as in Mixtral.
    """
    batch, q_len = q.shape[:2]
    group = config.heads // config.kv_heads
    q = q.reshape(batch, q_len, config.kv_heads, group, config.head_dim)
    scores = jnp.einsum("bqgrd,bgkd->bgrqk", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask, scores * config.head_dim**-0.5, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bgrqk,bgkd->bqgrd", probs, v)
    return out.reshape(batch, q_len, config.heads * config.head_dim)


def einsum_attention(
    config: ModelConfig,
    qkv: Array,
    positions: Array,
    layer_cache: tuple[Array, Array] | None,
    qk_norm: tuple[Array, Array] | None = None,
) -> tuple[Array, tuple[Array, Array]]:
    """Attention from the fused projection's output qkv [B, S, (heads + 2 * kv_heads) * D] as XLA ops:
    [B, S, heads * D] and this layer's (keys, values). `qk_norm` (q weight [D], k weight [D]) RMSNorms
    each query and key head before RoPE (Qwen3).

    Without a cache the S tokens attend causally among themselves and their own keys and values are
    returned. With one, they are written at `positions[0]` and the tokens attend to every cached position
    up to their own; the updated cache arrays are returned.
    """
    batch, seq = qkv.shape[:2]
    q_width, kv_width = config.heads * config.head_dim, config.kv_heads * config.head_dim
    q = qkv[..., :q_width].reshape(batch, seq, config.heads, config.head_dim)
    k = qkv[..., q_width : q_width + kv_width].reshape(batch, seq, config.kv_heads, config.head_dim)
    v = qkv[..., q_width + kv_width :].reshape(batch, seq, config.kv_heads, config.head_dim)
    if qk_norm is not None:
        q, k = rms_norm(q, qk_norm[0], config.norm_eps), rms_norm(k, qk_norm[1], config.norm_eps)
    q, k = rope(q, positions, config.rope_theta), rope(k, positions, config.rope_theta)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # the cache's [B, kv_heads, S, D]
    if layer_cache is None:
        mask = positions[:, None] >= positions[None, :]
    else:
        start = positions[0]
        k = jax.lax.dynamic_update_slice(layer_cache[0], k, (0, 0, start, 0))
        v = jax.lax.dynamic_update_slice(layer_cache[1], v, (0, 0, start, 0))
        mask = jnp.arange(k.shape[2])[None, :] <= positions[:, None]
    return _attend(config, q, k, v, mask), (k, v)


def _qk_norm(config: ModelConfig, p: LayerParams) -> tuple[Array, Array] | None:
    return (p.q_norm, p.k_norm) if config.qk_norm else None


def _attention(
    config: ModelConfig,
    p: LayerParams,
    x: Array,
    positions: Array,
    layer_cache: tuple[Array, Array] | None,
    choices: KernelChoices,
) -> tuple[Array, tuple[Array, Array]]:
    """Attention sub-block output [B, S, H] and this layer's (keys, values), as `einsum_attention` gives
    them. One token with a cache (a decode step) goes through decode_attention's kernels unless
    choices.decode_attention resolves to "xla"."""
    if _decode_kernels(x, layer_cache, choices):
        out, kv = _decode_attention(config, p, x, positions, layer_cache, choices)
        return project(out[:, None], p.wo, gemv_mode=choices.gemv), kv
    qkv = project(x, p.wqkv, (p.attn_norm, config.norm_eps), gemv_mode=choices.gemv)
    out, kv = einsum_attention(config, qkv, positions, layer_cache, _qk_norm(config, p))
    return project(out, p.wo, gemv_mode=choices.gemv), kv


def _decode_kernels(x: Array, cache: Any, choices: KernelChoices) -> bool:
    """Whether a step's attention runs decode_attention's kernels: one token per sequence, a cache (the
    model's or a layer's)."""
    return cache is not None and x.shape[1] == 1 and choices.mode("decode_attention") != "xla"


def _decode_attention(
    config: ModelConfig,
    p: LayerParams,
    x: Array,
    positions: Array,
    layer_cache: tuple[Array, Array],
    choices: KernelChoices,
) -> tuple[Array, tuple[Array, Array]]:
    """A decode step's attention before wo, through decode_attention's kernels: [B, heads * D] and this
    layer's (keys, values)."""
    cos, sin = rotation(positions, config.head_dim // 2, config.rope_theta)
    qk_norm = _qk_norm(config, p)
    out, keys, values = decode_attention.decode_attention(
        _decode_qkv(x[:, 0], p.wqkv, (p.attn_norm, config.norm_eps), choices.gemv),
        *layer_cache,
        positions[0],
        cos[0],
        sin[0],
        heads=config.heads,
        tiling=choices.decode_attention_tiling,
        qk_norm=None if qk_norm is None else (*qk_norm, config.norm_eps),
        interpret=choices.mode("decode_attention") == "interpret",
    )
    return out, (keys, values)


def _gemv_tiling(x: Array, w: Array, gemv_mode: str) -> gemv.Tiling | None:
    """The GEMV kernel's tiling for rows x [M, K] @ w, or None where XLA's ops run it."""
    tiling = gemv.tiling_for(*w.shape)
    on = pallas_mode.resolve(gemv_mode, "gemv") != "xla"
    return tiling if on and gemv.fits(x.shape, w.shape, tiling) else None


def _decode_qkv(x: Array, wqkv: Array, norm: tuple[Array, float], gemv_mode: str) -> Array:
    """The decode attention kernel's input for rows x [B, H]: the GEMV kernel's split-K partial sums of
    rms_norm(x) @ wqkv, which the attention kernel adds as it reads them; else XLA's projection [B, W]."""
    if (tiling := _gemv_tiling(x, wqkv, gemv_mode)) is not None:
        interpret = pallas_mode.resolve(gemv_mode) == "interpret"
        return gemv.partial_sums(x, wqkv, norm=norm, tiling=tiling, interpret=interpret)
    return rms_norm(x, *norm) @ wqkv


def project(x: Array, w: Array, norm: tuple[Array, float] | None = None, *, gemv_mode: str = "auto") -> Array:
    """x [B, S, K] @ w [K, N] (rms_norm(x, *norm) @ w with `norm`), in x's dtype. A decode step's few rows
    go through gemv.py's kernel unless `gemv_mode` resolves to "xla" (pallas_mode); XLA's ops otherwise."""
    batch, seq, k = x.shape
    rows = x.reshape(batch * seq, k)
    if (tiling := _gemv_tiling(rows, w, gemv_mode)) is not None:
        interpret = pallas_mode.resolve(gemv_mode) == "interpret"
        out = gemv.project(rows, w, norm=norm, tiling=tiling, interpret=interpret)
    else:
        out = (rms_norm(rows, *norm) if norm is not None else rows) @ w
    return out.reshape(batch, seq, w.shape[1])


def shared_experts(p: LayerParams, h: Array) -> Array:
    """The shared experts' output [T, H] for the MoE block's normed rows h [T, H]: one dense SwiGLU MLP
    that every token goes through. Its GEMMs are plain dense ones, which XLA runs (moetune tunes only the
    routed experts' grouped GEMMs). Each GEMM accumulates in float32 and rounds to h's dtype, as the
    routed layer's do."""
    dot = lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(h.dtype)  # noqa: E731
    return dot(gated_activation("swiglu", dot(h, p.w_shared_gate_up)), p.w_shared_down)


@functools.cache
def _shared_moe(moe_path: str, decode_mode: str = "auto") -> Any:
    """The MoE path as its own jitted function: every layer calls it with the same shapes, so it is traced
    and lowered once and the layers call that one function. Inlined, each of the 32 layers lowered its own
    Mosaic GPU kernels again (on the H200 the moetune prefill program took 195 s to compile). The moetune
    path's moe_mlp takes `decode_mode` (the other paths have no fused decode block)."""
    fn = moe_fn(moe_path)
    if moe_path == "moetune":
        fn = functools.partial(fn, decode_mode=decode_mode)
    return jax.jit(fn, static_argnames=("top_k", "routing_mode"))


@functools.cache
def _shared_fp8_moe(scale_layout: str, decode_mode: str = "auto") -> Any:
    """moe_mlp on FP8 experts (K-major, scales in `scale_layout`) jitted once for every layer, as
    _shared_moe."""
    fp8 = functools.partial(
        moe.moe_mlp, scale_layout=scale_layout, transpose_weights=True, decode_mode=decode_mode
    )
    return jax.jit(fp8, static_argnames=("top_k", "routing_mode"))


def routed_experts(
    config: ModelConfig,
    p: LayerParams,
    h: Array,
    router_logits: Array,
    moe_path: str,
    routing_mode: str,
    decode_mode: str = "auto",
) -> Array:
    """The routed experts' output [T, H] for the normed rows h [T, H]: the path's MoE MLP, or on FP8
    experts (config.experts_scale_layout) moe_mlp with their scales, which only the moetune path runs.
    `decode_mode` is moe_mlp's on the moetune path (KernelChoices.decode_block; `moe_decode_choice` says
    what it picks); the other paths have no fused decode block and only check it."""
    pallas_mode.check(decode_mode, "decode_block")
    layout = config.experts_scale_layout
    if layout == "none":
        return _shared_moe(moe_path, decode_mode)(
            h, router_logits, p.w_gate_up, p.w_down, top_k=config.top_k, routing_mode=routing_mode
        )
    if moe_path != "moetune":
        raise ConfigInvalid(f"FP8 experts run on the moetune path only, not {moe_path!r}")
    return _shared_fp8_moe(layout, decode_mode)(
        h, router_logits, p.w_gate_up, p.w_down, top_k=config.top_k, routing_mode=routing_mode,
        w_gate_up_scale=p.w_gate_up_scale, w_down_scale=p.w_down_scale,
    )  # fmt: skip


def moe_decode_choice(
    config: ModelConfig, p: LayerParams, tokens: int, moe_path: str, decode_mode: str
) -> moe.DecodeChoice:
    """Whether the MoE MLP of a block of `tokens` rows runs as moe_mlp's fused decode block (`.config`
    set) or unfused, and why: moe_mlp's decode_choice for the rows routed_experts gives it (the model's
    dtype) and layer `p`'s experts. The dense and ragged paths have no fused block."""
    if moe_path != "moetune":
        return moe.DecodeChoice(None, False, f"the {moe_path} path has no fused decode block")
    h = jax.ShapeDtypeStruct((tokens, config.hidden), jnp.dtype(config.dtype))
    logits = jax.ShapeDtypeStruct((tokens, config.experts), jnp.float32)
    fp8 = config.experts_scale_layout
    return moe.decode_choice(
        h, logits, p.w_gate_up, config.top_k, decode_mode=decode_mode, scale_layout=fp8,
        transpose_weights=fp8 != "none",
    )  # fmt: skip


@functools.cache
def _shared_sorted_moe(moe_path: str) -> Any:
    """SORTED_MOE_PATHS[moe_path] jitted once for every layer, as _shared_moe."""
    return jax.jit(SORTED_MOE_PATHS[moe_path])


def _moe_block(config: ModelConfig, p: LayerParams, x: Array, moe_path: str, choices: KernelChoices) -> Array:
    """The MoE block's output [B, S, H] in the model's dtype (x may be a float32 residual stream): the
    routed experts' and, with config.shared_experts, the shared experts' outputs added. Where the fused
    decode block takes the routed experts (moe_decode_choice), it routes the rows itself: no
    norm_route_gather."""
    batch, seq, hidden = x.shape
    x_rows = x.reshape(batch * seq, hidden)
    tokens, top_k = batch * seq, config.top_k
    fused = moe_decode_choice(config, p, tokens, moe_path, choices.decode_block).config is not None
    if (
        not fused
        and moe_path in SORTED_MOE_PATHS
        and config.experts_scale_layout == "none"  # the sorted layer takes 16-bit experts
        and (mode := choices.mode("norm_route_gather")) != "xla"
        and norm_router.fits_gather(tokens, config.experts, top_k)
    ):
        permuted, ids, weights, row_token, slot_row, sizes = norm_router.norm_route_gather(
            x_rows,
            p.moe_norm,
            p.router,
            config.norm_eps,
            top_k=top_k,
            renormalize=True,
            rows_out=moe.permuted_rows(tokens * top_k),
            out_dtype=p.w_gate_up.dtype,
            interpret=mode == "interpret",
        )
        routing, rows = moe.Routing(ids, weights), moe.SortedRows(row_token, slot_row, sizes)
        out = _shared_sorted_moe(moe_path)(permuted, routing, rows, p.w_gate_up, p.w_down)
        if config.shared_experts:
            # Token t's normed row is the sorted row of its first slot t * k: no norm of its own.
            h = jnp.take(permuted, rows.slot_row[::top_k], axis=0, mode="clip")
            out = out + shared_experts(p, h)
        return out.reshape(batch, seq, hidden)
    # The rows in the model's dtype, their logits those of the rounded rows (as norm_route_gather's).
    dtype = jnp.dtype(config.dtype)
    if (mode := choices.mode("norm_router")) != "xla" and norm_router.fits(tokens, config.experts):
        h, router_logits = norm_router.norm_and_router(
            x_rows, p.moe_norm, p.router, config.norm_eps, out_dtype=dtype, interpret=mode == "interpret"
        )
    else:
        h = rms_norm(x_rows, p.moe_norm, config.norm_eps).astype(dtype)
        router_logits = jnp.dot(h, p.router, preferred_element_type=jnp.float32)
    out = routed_experts(config, p, h, router_logits, moe_path, choices.routing, choices.decode_block)
    if config.shared_experts:
        out = out + shared_experts(p, h)
    return out.reshape(batch, seq, hidden)


def _decoder(
    config: ModelConfig,
    params: ModelParams,
    tokens: Array,
    positions: Array,
    cache: KVCache | None,
    moe_path: str,
    choices: KernelChoices,
) -> tuple[Array, list[tuple[Array, Array]]]:
    """Final-normed hidden states [B, S, H] and every layer's (keys, values)."""
    x = jnp.take(params.embed, tokens, axis=0, mode="clip")
    kv = []
    carried = _carries_residual(config, params, x, cache, moe_path, choices)
    residual = x[:, 0].astype(jnp.float32) if carried else None
    for i, p in enumerate(params.layers):  # unrolled: see the module docstring
        layer_cache = None if cache is None else (cache.keys[i], cache.values[i])
        if carried:
            out, layer_kv = _decode_attention(config, p, x, positions, layer_cache, choices)
            residual = gemv.accumulate(
                out,
                p.wo,
                residual,
                tiling=_gemv_tiling(out, p.wo, choices.gemv),
                interpret=choices.mode("gemv") == "interpret",
            )
            moe_out = _moe_block(config, p, residual[:, None], moe_path, choices)[:, 0]
            residual = residual + moe_out.astype(jnp.float32)
            x = residual.astype(x.dtype)[:, None]  # the next layer's wqkv GEMV reads it
        else:
            attn, layer_kv = _attention(config, p, x, positions, layer_cache, choices)
            x = x + attn
            x = x + _moe_block(config, p, x, moe_path, choices)
        kv.append(layer_kv)
    return rms_norm(x, params.final_norm, config.norm_eps), kv


def _carries_residual(
    config: ModelConfig,
    params: ModelParams,
    x: Array,
    cache: KVCache | None,
    moe_path: str,
    choices: KernelChoices,
) -> bool:
    """Whether a decode step keeps its residual stream in float32 between kernels that add into it: wo's
    GEMV adds its partial sums into the stream (gemv.accumulate), norm_route_gather reads it, and the MoE
    output's add is one XLA fusion with the copy the next wqkv GEMV reads. The first residual add is then
    no kernel of its own. Needs every one of those kernels on; choices.decode_residual="add" keeps the two
    adds in the model's dtype instead. Where the fused decode block takes the MoE MLP, the norm and router
    that feed it read the stream in norm_route_gather's place: the condition leaves choices.decode_block
    out, so that the fused and unfused models differ in their MoE MLP alone."""
    batch = x.shape[0]
    wo = params.layers[0].wo
    attention_out = jax.ShapeDtypeStruct((batch, wo.shape[0]), x.dtype)
    return (
        choices.decode_residual == "accumulate"
        and _decode_kernels(x, cache, choices)
        and _gemv_tiling(attention_out, wo, choices.gemv) is not None
        and moe_path in SORTED_MOE_PATHS
        and choices.mode("norm_route_gather") != "xla"
        and norm_router.fits_gather(batch, config.experts, config.top_k)
    )


def _logits(params: ModelParams, hidden: Array) -> Array:
    return jnp.dot(hidden, params.lm_head, preferred_element_type=jnp.float32)


_static = ("config", "moe_path", "choices")


@functools.partial(jax.jit, static_argnames=_static)
def forward_full(
    params: ModelParams,
    tokens: Array,
    *,
    config: ModelConfig,
    moe_path: str,
    choices: KernelChoices = DEFAULT_CHOICES,
) -> Array:
    """Logits [B, S, V] of every position, recomputing the whole sequence (the cache-free reference)."""
    hidden, _ = _decoder(config, params, tokens, jnp.arange(tokens.shape[1]), None, moe_path, choices)
    return _logits(params, hidden)


@functools.partial(jax.jit, static_argnames=_static, donate_argnames=("cache",))
def prefill(
    params: ModelParams,
    tokens: Array,
    cache: KVCache,
    *,
    config: ModelConfig,
    moe_path: str,
    choices: KernelChoices = DEFAULT_CHOICES,
) -> tuple[Array, KVCache]:
    """Run the prompt tokens [B, S] from position 0; fill the cache's first S positions."""
    hidden, kv = _decoder(config, params, tokens, jnp.arange(tokens.shape[1]), None, moe_path, choices)
    write = lambda buf, new: jax.lax.dynamic_update_slice(buf, new, (0, 0, 0, 0))
    cache = KVCache(
        keys=tuple(write(buf, k) for buf, (k, _) in zip(cache.keys, kv, strict=True)),
        values=tuple(write(buf, v) for buf, (_, v) in zip(cache.values, kv, strict=True)),
    )
    return _logits(params, hidden[:, -1]), cache


def _step(
    config: ModelConfig,
    params: ModelParams,
    tokens: Array,
    cache: KVCache,
    pos: Array,
    moe_path: str,
    choices: KernelChoices,
):
    hidden, kv = _decoder(config, params, tokens[:, None], pos[None], cache, moe_path, choices)
    cache = KVCache(keys=tuple(k for k, _ in kv), values=tuple(v for _, v in kv))
    return _logits(params, hidden[:, 0]), cache


@functools.partial(jax.jit, static_argnames=_static, donate_argnames=("cache",))
def decode_step(
    params: ModelParams,
    tokens: Array,
    cache: KVCache,
    pos: Array,
    *,
    config: ModelConfig,
    moe_path: str,
    choices: KernelChoices = DEFAULT_CHOICES,
) -> tuple[Array, KVCache]:
    """One token per sequence (tokens [B]) at position `pos`; returns its logits [B, V] and the cache."""
    return _step(config, params, tokens, cache, jnp.asarray(pos, jnp.int32), moe_path, choices)


@functools.partial(jax.jit, static_argnames=(*_static, "steps"), donate_argnames=("cache",))
def decode_loop(
    params: ModelParams,
    tokens: Array,
    cache: KVCache,
    pos: Array,
    *,
    steps: int,
    config: ModelConfig,
    moe_path: str,
    choices: KernelChoices = DEFAULT_CHOICES,
) -> tuple[Array, KVCache]:
    """Greedy decoding: `tokens` [B] sit at `pos`; step i feeds position pos + i and emits its argmax.

    Returns the emitted tokens [B, steps] (for positions pos + 1 ... pos + steps) and the cache.
    """
    pos = jnp.asarray(pos, jnp.int32)
    out = jnp.zeros((tokens.shape[0], steps), jnp.int32)

    def body(i, carry):
        current, cache, out = carry
        logits, cache = _step(config, params, current, cache, pos + i, moe_path, choices)
        following = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return following, cache, out.at[:, i].set(following)

    _, cache, out = jax.lax.fori_loop(0, steps, body, (tokens.astype(jnp.int32), cache, out))
    return out, cache
