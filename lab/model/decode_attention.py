"""Attention for one new token per sequence (decode), as two Pallas Triton kernels.

XLA runs a decode step's attention as ten kernels: RoPE of q, the key and value cache writes (the key's with
its RoPE), the two einsums, and the softmax's max, exp, sum and normalise, and a transpose. Each is a small
launch of ~1.4 us on the H200, so together they cost several times the 2 us that reading the cache takes.
Here it is two:

  split kernel   grid (batch * kv_heads, splits). Each program reads its group's query heads and the new key
                 and value out of the fused projection's output in place, ropes q and k, reads its share of
                 the cache's blocks up to `pos` in place (no transposed copy), and keeps a flash-style
                 running max, sum and weighted value sum. The new key and value are taken from registers at
                 row `pos`, and the program whose share holds `pos` writes them into the cache (aliased in
                 place), so no program reads a row that another writes.
  combine        grid (batch * heads, head_dim / 32): rescales one head's split partial sums to their common
                 max and divides, 32 output columns a program.

Both are latency-bound at decode sizes on the H200: one program's few dependent loads, not the cache's
bytes, set their time, so they want many programs each doing little.

Numerics follow the model's `_attend`: q and k (with `qk_norm`, first RMSNormed over each head, rounded to
the cache dtype) roped in float32 then rounded to the cache dtype, scores in float32 scaled by
head_dim**-0.5, probabilities rounded to the value dtype before the value dot (here the unnormalised ones,
the sum taken in float32).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from moetune.kernels.errors import ConfigInvalid

Array = Any
QUERY_ROWS = 16  # a group's query heads, padded to the smallest M of Triton's dot
COMBINE_COLUMNS = 32  # output columns per combine program: more programs, each reading less


@dataclasses.dataclass(frozen=True, slots=True)
class Tiling:
    """How the split kernel divides the cache: `splits` programs per (sequence, kv head), each reading its
    share of the cache `block_k` rows at a time. Frozen and hashable: the model takes it as a static
    argument (KernelChoices.decode_attention_tiling)."""

    block_k: int = 64  # cache rows per loop step (a power of two)
    splits: int = 32  # programs along the cache (a power of two)
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigInvalid(
                    f"decode attention tiling: {field.name}={value!r} must be a positive integer"
                )
        for name in ("block_k", "splits", "num_warps"):
            value = getattr(self, name)
            if value & (value - 1):
                raise ConfigInvalid(f"decode attention tiling: {name}={value} must be a power of two")

    @classmethod
    def parse(cls, text: str) -> Tiling:
        """'block_k=64,splits=64' -> Tiling(block_k=64, splits=64); fields left out keep their defaults."""
        known = [field.name for field in dataclasses.fields(cls)]
        values = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, value = (part.strip() for part in item.partition("="))
            if key not in known or not value.isdigit():
                raise ConfigInvalid(
                    f"decode attention tiling {text!r}: {item!r} is not {' | '.join(known)} = an integer"
                )
            values[key] = int(value)
        return cls(**values)

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


def decode_attention(
    qkv: Array,
    keys: Array,
    values: Array,
    pos: Array,
    cos: Array,
    sin: Array,
    *,
    heads: int,
    tiling: Tiling = Tiling(),
    qk_norm: tuple[Array, Array, float] | None = None,
    interpret: bool = False,
) -> tuple[Array, Array, Array]:
    """One decode step's attention, with the cache update.

    qkv [B, (heads + 2 * kv_heads) * D]: the new token's projections side by side (q, k, v; q and k before
    RoPE), as the model's fused projection writes them: the kernel slices them, so XLA copies none out.
    Or [S, B, (heads + 2 * kv_heads) * D] float32: the projection's split-K partial sums (gemv.py's), which
    the kernel adds and rounds to the cache's dtype as it reads them, so that no kernel of its own does.
    keys, values [B, kv_heads, L, D]: the layer's cache; positions above `pos` hold junk and are masked.
    pos: the token's position (int32 scalar; clamped into [0, L) as the einsum path's cache write clamps it).
    cos, sin [D/2] float32: RoPE's rotation at `pos`.
    qk_norm: (q weight [D], k weight [D], eps) to RMSNorm each query and key head before RoPE (Qwen3), or
    None (Mixtral).
    Returns (out [B, heads * D] in qkv's dtype (from partial sums, the cache's), keys, values with the roped
    k and v written at `pos`).
    """
    batch, kv_heads, length, dim = keys.shape
    group = heads // kv_heads
    given, out_dtype = qkv.shape, qkv.dtype if qkv.ndim == 2 else keys.dtype
    if qkv.ndim == 2:
        qkv = qkv[None]  # one "partial sum": the projection itself
    elif qkv.dtype != jnp.float32:
        raise ValueError(f"qkv partial sums [S, B, W] must be float32; got {qkv.dtype}")
    if qkv.shape[1:] != (batch, (heads + 2 * kv_heads) * dim):
        raise ValueError(f"qkv {given} does not hold {heads} query and 2x{kv_heads} kv heads of {dim}")
    if group > QUERY_ROWS or heads % kv_heads or dim % 2:
        raise ValueError(f"unsupported decode attention: group={group} dim={dim}")
    block_k, splits = tiling.block_k, tiling.splits
    chunk = pl.cdiv(pl.cdiv(length, block_k), splits)  # blocks per split
    pos = jnp.asarray(pos, jnp.int32).reshape(1)
    f32 = jnp.float32
    norm_weights, norm_eps = (), None
    if qk_norm is not None:
        q_weight, k_weight, norm_eps = qk_norm
        if q_weight.shape != (dim,) or k_weight.shape != (dim,):
            raise ValueError(f"qk_norm weights {q_weight.shape}, {k_weight.shape} for head_dim {dim}")
        norm_weights = (q_weight.astype(f32), k_weight.astype(f32))
    split_kernel = functools.partial(
        _split_kernel,
        heads=heads,
        kv_heads=kv_heads,
        length=length,
        block_k=block_k,
        chunk=chunk,
        norm_eps=norm_eps,
    )
    acc, row_max, row_sum, keys, values = pl.pallas_call(
        split_kernel,
        out_shape=(
            jax.ShapeDtypeStruct((batch * heads, splits, dim), f32),
            jax.ShapeDtypeStruct((batch * heads, splits), f32),
            jax.ShapeDtypeStruct((batch * heads, splits), f32),
            jax.ShapeDtypeStruct(keys.shape, keys.dtype),
            jax.ShapeDtypeStruct(values.shape, values.dtype),
        ),
        grid=(batch * kv_heads, splits),
        input_output_aliases={4: 3, 5: 4},
        compiler_params=pltriton.CompilerParams(num_warps=tiling.num_warps, num_stages=tiling.num_stages),
        interpret=interpret,
        name="moetune_decode_attention",
    )(qkv, cos.astype(f32), sin.astype(f32), pos, keys, values, *norm_weights)
    columns = COMBINE_COLUMNS if dim % COMBINE_COLUMNS == 0 else dim
    out = pl.pallas_call(
        functools.partial(_combine_kernel, columns=columns),
        out_shape=jax.ShapeDtypeStruct((batch * heads, dim), out_dtype),
        grid=(batch * heads, dim // columns),
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="moetune_decode_attention_combine",
    )(acc, row_max, row_sum)
    return out.reshape(batch, heads * dim), keys, values


def _split_kernel(
    qkv_ref, cos_ref, sin_ref, pos_ref, keys_ref, values_ref, *refs,
    heads, kv_heads, length, block_k, chunk, norm_eps,
):  # fmt: skip
    # With qk_norm, the q and k norm weights come before the outputs.
    norm_refs, (acc_ref, max_ref, sum_ref, keys_out, values_out) = refs[:-5], refs[-5:]
    bg, split = pl.program_id(0), pl.program_id(1)
    b, g = bg // kv_heads, bg % kv_heads
    dim = keys_ref.shape[-1]
    group, half, dtype = heads // kv_heads, dim // 2, keys_ref.dtype
    pos = jnp.clip(pos_ref[0], 0, length - 1)  # as XLA's dynamic_update_slice clamps its start
    cos, sin = cos_ref[...], sin_ref[...]

    def norm_then_rope(x1, x2, weight_ref=None):
        """RoPE of a head's halves [..., D/2]; first the head's RMSNorm with `weight_ref`'s [D], as the
        model's rms_norm does it (float32, the weight applied, rounded to the cache dtype)."""
        x1, x2 = x1.astype(jnp.float32), x2.astype(jnp.float32)
        if weight_ref is not None:
            squares = jnp.sum(x1 * x1, axis=-1) + jnp.sum(x2 * x2, axis=-1)
            scale = jax.lax.rsqrt(squares / dim + norm_eps)
            scale = scale[:, None] if x1.ndim == 2 else scale
            x1 = (x1 * scale * weight_ref[pl.ds(0, half)]).astype(dtype).astype(jnp.float32)
            x2 = (x2 * scale * weight_ref[pl.ds(half, half)]).astype(dtype).astype(jnp.float32)
        return (x1 * cos - x2 * sin).astype(dtype), (x2 * cos + x1 * sin).astype(dtype)

    q_norm, k_norm = norm_refs if norm_refs else (None, None)

    def read_qkv(at, **mask):  # the projection at `at` (partial sums added, rounded to the cache's dtype)
        parts = [pltriton.load(qkv_ref.at[jnp.int32(s), b, at], **mask) for s in range(qkv_ref.shape[0])]
        return parts[0] if len(parts) == 1 else functools.reduce(jnp.add, parts).astype(dtype)

    # This group's query heads as rows (padded to QUERY_ROWS), each row's halves read from qkv in place.
    real_rows = jnp.arange(QUERY_ROWS) < group
    q_at = (g * group + jnp.arange(QUERY_ROWS))[:, None] * dim + jnp.arange(half)[None, :]
    q_mask = real_rows[:, None]
    q1, q2 = norm_then_rope(
        read_qkv(q_at, mask=q_mask, other=0), read_qkv(q_at + half, mask=q_mask, other=0), q_norm
    )
    k_at, v_at = (heads + g) * dim, (heads + kv_heads + g) * dim
    k1_new, k2_new = norm_then_rope(read_qkv(pl.ds(k_at, half)), read_qkv(pl.ds(k_at + half, half)), k_norm)
    v_new = read_qkv(pl.ds(v_at, dim)).astype(dtype)

    scale = dim**-0.5
    dot_t = lambda x, y: jax.lax.dot_general(
        x, y, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
    )
    first, second = pl.ds(0, half), pl.ds(half, half)

    def block(i, carry):
        acc, row_max, row_sum = carry
        start = i * block_k
        key = start + jnp.arange(block_k)
        stored, new = (key < length)[:, None], (key == pos)[:, None]
        rows = pl.ds(start, block_k)

        def read(cache_ref, columns, new_row):  # the block's rows, with row pos from registers
            stored_rows = pltriton.load(cache_ref.at[b, g, rows, columns], mask=stored, other=0)
            return jnp.where(new, new_row[None, :], stored_rows)

        k1, k2 = read(keys_ref, first, k1_new), read(keys_ref, second, k2_new)
        scores = dot_t(q1, k1) + dot_t(q2, k2)  # [QUERY_ROWS, block_k]
        scores = jnp.where((key <= pos)[None, :], scores * scale, -jnp.inf)
        new_max = jnp.maximum(row_max, jnp.max(scores, axis=1))  # finite: the block starts at or before pos
        rescale = jnp.exp(row_max - new_max)
        probs = jnp.exp(scores - new_max[:, None])
        value = read(values_ref, pl.ds(0, dim), v_new)
        acc = acc * rescale[:, None] + jax.lax.dot(
            probs.astype(dtype), value, preferred_element_type=jnp.float32
        )
        return acc, new_max, row_sum * rescale + jnp.sum(probs, axis=1)

    init = (
        jnp.zeros((QUERY_ROWS, dim), jnp.float32),
        jnp.full((QUERY_ROWS,), -jnp.inf, jnp.float32),
        jnp.zeros((QUERY_ROWS,), jnp.float32),
    )
    lo = split * chunk
    hi = jnp.minimum(lo + chunk, pos // block_k + 1)  # blocks past pos's are all masked: skip them
    acc, row_max, row_sum = jax.lax.fori_loop(lo, hi, block, init)
    # Only the real rows go out, as [batch * heads, splits, ...]: this group's heads are rows bg * group + r.
    out_rows = pl.ds(bg * group, QUERY_ROWS)
    pltriton.store(acc_ref.at[out_rows, split, :], acc, mask=q_mask)
    pltriton.store(max_ref.at[out_rows, split], row_max, mask=real_rows)
    pltriton.store(sum_ref.at[out_rows, split], row_sum, mask=real_rows)

    @pl.when(split == pos // block_k // chunk)
    def _write_new_row():
        keys_out[b, g, pos, first] = k1_new
        keys_out[b, g, pos, second] = k2_new
        values_out[b, g, pos, :] = v_new


def _combine_kernel(acc_ref, max_ref, sum_ref, out_ref, *, columns):
    """One query head's `columns` output columns: its splits' partial sums, rescaled to their common max.
    Split 0 always holds key 0, so that max is finite; a split with no keys holds max -inf and weighs 0."""
    head, part = pl.program_id(0), pl.program_id(1)
    row_max = max_ref[head, :]  # [splits]
    weight = jnp.exp(row_max - jnp.max(row_max))
    total = jnp.sum(weight * sum_ref[head, :])
    cols = pl.ds(part * columns, columns)
    out_ref[head, cols] = (jnp.sum(weight[:, None] * acc_ref[head, :, cols], axis=0) / total).astype(
        out_ref.dtype
    )
