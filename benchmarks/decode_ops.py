"""A decode token's kernels one by one, each way we could run it, timed with CUPTI (issue 7).

At batch 1 every weight GEMM reads its weights once and does almost no arithmetic, so the question for
each is how close to the HBM read roofline it gets. For the Mixtral-8x7B shapes, one H200:
  proj       the dense projections (wqkv, wo, lm_head) at M=1: XLA's dot against moetune's Hopper kernel
             as a one-group grouped GEMM, for each config in PROJ_CONFIGS, on x [1, K] and with pad_lhs on
             an x left 64 rows tall by its producer;
  gate_up    the MoE gate_up GEMM at T=1 (two experts of one row each): SwiGLU fused, and unfused with
             split-K (the activation then an XLA op on the small output), for each config; and XLA's
             dot on the same two experts' weights;
  down       the MoE down GEMM at T=1 for each config, on x [2, F] and with pad_lhs on an x its producer
             left 64 rows tall; and XLA's dot on the same two experts' weights;
  stride     (only when asked) the same GEMVs with rows of a multiple of 8 KiB or not;
  orientation (only when asked) the down GEMM at T=1 with its weights stored [G, K, N] or [G, N, K]: a
             tile then reads runs of block_n * 2 or of block_k * 2 contiguous bytes;
  pad        (only when asked) the shipped pack's decode winners (T = 1 to 16) with pad_lhs off and on;
  stream     (only when asked) the T=1 GEMMs' weight tiles streamed through the same TMA pipeline with no
             arithmetic at all, one CTA per column tile; and gate_up with both rows on one expert against
             XLA's dot on that expert: what read rate the tiles alone reach, apart from the wgmmas;
  norm_router (only when asked) the MoE block's RMSNorm and router dot at T=1: XLA's ops, and
             models/norm_router.py's kernel at 4, 8 and 16 warps;
  gemv       (only when asked) the dense projections as the model runs them at batch 1 (wqkv after the
             attention RMSNorm, wo before the residual add, the lm_head after the final norm): XLA's ops
             against models/gemv.py's kernel (the norm folded in, the split-K sum left to XLA) at
             each tiling in GEMV_TILINGS;
  attention  one decode position's attention over a 2176-position cache (position 2100), with RoPE and the
             cache write: the einsum path (XLA's kernels) and moetune's two Pallas Triton kernels
             (models/decode_attention.py) at each tiling in ATTENTION_TILINGS.
Each variant is first checked against a float32 reference (relative L2 error); then the median of 10
CUPTI passes over input copies larger than twice the L2 (the sum of every kernel the variant launches).
The HBM roofline uses --read-tbps. `--hlo-out` also writes the optimized HLO of a 2-layer decode step.

    python3 benchmarks/decode_ops.py --out ops.json [--only proj,gate_up] [--hlo-out decode_hlo.txt.gz]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gzip
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import moe_shapes
import numpy as np
import stream_probe

from moetune.kernels.backends.mosaic_gpu import kernel_sm90
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C
from moetune.kernels.backends.mosaic_gpu.timer import CuptiSession, CuptiTimer
from moetune.kernels.moe.reference import gated_activation
from moetune.kernels.reference import relative_error

PLAIN = dict(warp_specialized=False, wg_split="none")
NP = dict(persistent=False)
SNAKE_N = dict(grid_minor_dim="n", grid_tile_width=1)  # column tiles one at a time, all experts each

# Memory-bound configs: wide weight tiles (long contiguous rows), split-K to fill the SMs.
N256 = dict(block_m=64, block_n=256, block_k=64, **PLAIN, **NP)
N128 = dict(block_m=64, block_n=128, block_k=64, **NP)
PROJ_CONFIGS = (
    [C(max_concurrent_steps=3, split_k=s, **N256) for s in (1, 2, 4, 8, 16)]
    + [C(max_concurrent_steps=4, split_k=s, **PLAIN, **N128) for s in (2, 4, 8, 16)]
    + [C(max_concurrent_steps=4, wg_split="n", split_k=s, **N128) for s in (2, 4)]
)
PADDED_ROWS = 64  # proj's padded x: one 64-row CTA tile, as a producer that pads for pad_lhs leaves it
GATE_UP_FUSED = [
    C(max_concurrent_steps=5, wg_split="none", **SNAKE_N, **N128),  # the shipped pack's winner
    C(max_concurrent_steps=4, grid_minor_dim="n", grid_tile_width=4, **PLAIN, **N128),
    C(max_concurrent_steps=4, wg_split="n", **N128 | dict(block_k=32)),  # CTA 256 wide
    C(max_concurrent_steps=5, wg_split="n", **N128 | dict(block_k=32)),
    C(max_concurrent_steps=5, wg_split="n", **SNAKE_N, **N128 | dict(block_k=32)),
    C(max_concurrent_steps=2, wg_split="none", **SNAKE_N, **N128),  # ~97 KB: two CTAs per SM
    C(max_concurrent_steps=4, wg_split="none", **SNAKE_N, **N128 | dict(block_k=32)),
    C(max_concurrent_steps=4, **PLAIN, **SNAKE_N, **N128 | dict(block_k=32)),
    # Small CTAs (<= 113 KB of shared memory): two per SM, more loads in flight per SM.
    C(max_concurrent_steps=3, **PLAIN, **SNAKE_N, **N128 | dict(block_n=64)),
    C(max_concurrent_steps=4, **PLAIN, **SNAKE_N, **N128 | dict(block_n=64)),
    C(max_concurrent_steps=2, **PLAIN, **SNAKE_N, **N128 | dict(block_n=64, block_k=128)),
    C(max_concurrent_steps=4, wg_split="none", **SNAKE_N, **N128 | dict(block_n=64)),
]
GATE_UP_UNFUSED = (
    [C(max_concurrent_steps=3, split_k=s, **N256) for s in (1, 2, 4)]
    + [C(max_concurrent_steps=4, split_k=s, **N256) for s in (2, 4)]
    + [C(max_concurrent_steps=4, wg_split="n", split_k=s, **N128) for s in (1, 2)]
    + [C(max_concurrent_steps=4, split_k=2, **PLAIN, **N128)]
)
DOWN = [
    C(max_concurrent_steps=3, grid_tile_width=1, split_k=4, **N256),  # the shipped pack's winner
    C(max_concurrent_steps=4, split_k=4, **N256),
    C(max_concurrent_steps=3, split_k=8, **N256),
    C(max_concurrent_steps=3, split_k=2, **N256),
    C(max_concurrent_steps=2, split_k=4, **N256 | dict(block_k=128)),
    C(max_concurrent_steps=4, wg_split="n", split_k=4, **N128),
    C(max_concurrent_steps=4, wg_split="n", split_k=2, **N128),
    C(max_concurrent_steps=4, wg_split="n", split_k=8, **N128),
    C(max_concurrent_steps=4, split_k=4, **PLAIN, **N128),
    C(max_concurrent_steps=4, split_k=8, **PLAIN, **N128),
]
ORIENTATION = [DOWN[0], DOWN[4], C(max_concurrent_steps=4, split_k=4, **N256 | dict(block_k=32))]


def _gemv_tilings():
    from moetune.models.gemv import Tiling

    shapes = [(64, 64), (64, 128), (128, 64), (128, 128), (256, 64)]  # (block_n, block_k)
    tilings = [Tiling(n, k, s, 4, stages) for n, k in shapes for s in (2, 4, 8) for stages in (3, 4)]
    # Wide tiles (session 12): longer contiguous runs of each weight row (block_n * 2 bytes) per load.
    wide = [(256, 32), (512, 16), (512, 32), (1024, 16)]
    return tilings + [Tiling(n, k, s, warps, 3) for n, k in wide for s in (4, 8, 16) for warps in (4, 8)]


GEMV_TILINGS = _gemv_tilings()
# (splits, block_k): the 2176-position cache split evenly into whole blocks.
# decode_attention's tilings; the first is its default.
ATTENTION_TILINGS = [
    {"block_k": 64, "splits": 32, "num_warps": 4, "num_stages": 2},
    {"block_k": 64, "splits": 16, "num_warps": 4, "num_stages": 2},
    {"block_k": 64, "splits": 64, "num_warps": 4, "num_stages": 2},
    {"block_k": 32, "splits": 64, "num_warps": 4, "num_stages": 2},
    {"block_k": 32, "splits": 128, "num_warps": 4, "num_stages": 2},
    {"block_k": 128, "splits": 32, "num_warps": 4, "num_stages": 2},
    {"block_k": 128, "splits": 32, "num_warps": 8, "num_stages": 2},
    {"block_k": 64, "splits": 64, "num_warps": 2, "num_stages": 2},
    {"block_k": 64, "splits": 64, "num_warps": 8, "num_stages": 2},
]


def log(message: str) -> None:
    print(f"[ops {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, read_tbps: float):
        self.timer = CuptiTimer()
        self.read_tbps = read_tbps
        self.rows: list[dict[str, Any]] = []

    def run(self, case: str, variant: str, fn, args: tuple, reference, weight_bytes: int) -> None:
        row: dict[str, Any] = {"case": case, "variant": variant, "weight_bytes": weight_bytes}
        try:
            jitted = jax.jit(fn)
            out = jax.block_until_ready(jitted(*args))
            if reference is not None:  # None: a probe whose output has no meaning
                row["rel_err"] = relative_error(out, reference)
            samples = self.timer.time(jitted, [args])
            median = float(np.median(samples))
            row |= {
                "median_us": median * 1e6,
                "samples_us": [s * 1e6 for s in samples],
                "roofline_frac": weight_bytes / (self.read_tbps * 1e12) / median,
                # Each kernel of one more call: which of the variant's kernels the median sums.
                "kernels_us": [(name, ms * 1e3) for name, ms in CuptiSession().record(lambda: jitted(*args))],
            }
            log(
                f"{case:10s} {variant:60s} {median * 1e6:8.1f} us  {row['roofline_frac']:.1%} of roofline"
                f"  err {row.get('rel_err', float('nan')):.1e}"
            )
        except Exception as e:  # one broken variant must not lose the others
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            log(f"{case:10s} {variant:60s} FAILED {row['error'][:200]}")
            traceback.print_exc(limit=2)
        self.rows.append(row)


def normal(key, shape, scale=1.0):
    return (jax.random.normal(key, shape, jnp.float32) * scale).astype(jnp.bfloat16)


def proj_cases(b: Bench, num_sms: int) -> None:
    """Each config twice: on x [1, K] (TMA zero-fills the tile's other rows), and with pad_lhs on an x its
    producer left 64 rows tall (rows=1: the padding rows are never read into the result), as the model's
    decode kernels can write it (session 12: is the TMA kernel then faster than gemv.py's 65-70%?)."""
    for name, k, n in (("wqkv", 4096, 6144), ("wo", 4096, 4096), ("lm_head", 4096, 32000)):
        kx, kw = jax.random.split(jax.random.key(n))
        x, w = normal(kx, (1, k)), normal(kw, (k, n), k**-0.5)
        reference = jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32))
        nbytes = k * n * 2
        b.run(name, "xla_dot", lambda x, w: x @ w, (x, w), reference, nbytes)
        sizes = jnp.ones((1,), jnp.int32)
        x_tall = jnp.pad(x, ((0, PADDED_ROWS - 1), (0, 0)))
        for c in PROJ_CONFIGS:
            if n % c.cta_n:
                continue
            fn = functools.partial(_one_group, config=c, num_sms=num_sms)
            b.run(name, kernel_sm90.kernel_name(c), fn, (x, w, sizes), reference, nbytes)
            padded = dataclasses.replace(c, pad_lhs=True)
            fn = functools.partial(_one_group, config=padded, num_sms=num_sms, rows=1)
            b.run(name, kernel_sm90.kernel_name(padded), fn, (x_tall, w, sizes), reference, nbytes)


def _one_group(x, w, sizes, *, config, num_sms, rows=None):
    return kernel_sm90.grouped_matmul(x, w[None], sizes, config=config, num_sms=num_sms, rows=rows)


def _swiglu(h):
    return gated_activation("swiglu", h).astype(jnp.bfloat16)


def _per_expert_dots(x, a, b):
    """XLA's own GEMV of each of the two rows on its expert's weights, given as two arrays."""
    return jnp.concatenate([x[:1] @ a, x[1:] @ b])


def moe_cases(b: Bench, num_sms: int, which: set[str]) -> None:
    hidden, inter, experts = 4096, 14336, 8
    sizes = jnp.zeros((experts,), jnp.int32).at[jnp.array([2, 5])].set(1)  # one token, top-2
    ks = jax.random.split(jax.random.key(7), 4)
    if "gate_up" in which:
        x = normal(ks[0], (2, hidden))
        w = normal(ks[1], (experts, hidden, 2 * inter), hidden**-0.5)
        raw = jax.lax.ragged_dot(x.astype(jnp.float32), w.astype(jnp.float32), sizes)
        ref = _swiglu(raw)
        nbytes = 2 * hidden * 2 * inter * 2
        b.run("gate_up", "xla_dot, one per expert", _per_expert_dots, (x, w[2], w[5]), raw, nbytes)
        for c in GATE_UP_FUSED:
            fn = functools.partial(kernel_sm90.grouped_matmul_swiglu, config=c, num_sms=num_sms)
            b.run("gate_up", "fused " + kernel_sm90.kernel_name(c), fn, (x, w, sizes), ref, nbytes)
        for c in GATE_UP_UNFUSED:
            gemm = functools.partial(kernel_sm90.grouped_matmul, config=c, num_sms=num_sms)
            fn = lambda x, w, s, gemm=gemm: _swiglu(gemm(x, w, s))
            b.run("gate_up", "unfused " + kernel_sm90.kernel_name(c), fn, (x, w, sizes), ref, nbytes)
        del w
    if "down" in which:
        x = normal(ks[2], (2, inter))
        w = normal(ks[3], (experts, inter, hidden), inter**-0.5)
        ref = jax.lax.ragged_dot(x.astype(jnp.float32), w.astype(jnp.float32), sizes)
        nbytes = 2 * inter * hidden * 2
        b.run("down", "xla_dot, one per expert", _per_expert_dots, (x, w[2], w[5]), ref, nbytes)
        # Each config also on an lhs its producer left 64 rows tall (rows=2), as a gate_up kernel that
        # wrote a padded output would hand it over: no TMA zero fill and no pad copy.
        x_tall = jnp.pad(x, ((0, PADDED_ROWS - 2), (0, 0)))
        for c in DOWN:
            fn = functools.partial(kernel_sm90.grouped_matmul, config=c, num_sms=num_sms)
            b.run("down", kernel_sm90.kernel_name(c), fn, (x, w, sizes), ref, nbytes)
            padded = dataclasses.replace(c, pad_lhs=True)
            fn = functools.partial(kernel_sm90.grouped_matmul, config=padded, num_sms=num_sms, rows=2)
            b.run("down", kernel_sm90.kernel_name(padded), fn, (x_tall, w, sizes), ref, nbytes)


def attention_cases(b: Bench) -> None:
    """The model's decode attention both ways, each with RoPE and the cache write (what a layer runs)."""
    from moetune.models import decode_attention, mixtral
    from moetune.models.config import model_config

    config = model_config("mixtral_8x7b")
    heads, kv_heads, dim, max_len, pos = config.heads, config.kv_heads, config.head_dim, 2176, 2100
    ks = jax.random.split(jax.random.key(3), 3)
    qkv = normal(ks[0], (1, (heads + 2 * kv_heads) * dim))
    keys, values = normal(ks[1], (1, kv_heads, max_len, dim)), normal(ks[2], (1, kv_heads, max_len, dim))
    position = jnp.asarray(pos, jnp.int32)
    nbytes = 2 * kv_heads * (pos + 1) * dim * 2

    def einsum_path(qkv, keys, values, position):
        out, _ = mixtral.einsum_attention(config, qkv[:, None], position[None], (keys, values))
        return out.reshape(1, heads * dim)

    def kernel_path(qkv, keys, values, position, **tiling):
        cos, sin = mixtral.rotation(position[None], dim // 2, config.rope_theta)
        attend = decode_attention.decode_attention
        tiling = decode_attention.Tiling(**tiling)
        return attend(qkv, keys, values, position, cos[0], sin[0], heads=heads, tiling=tiling)[0]

    f32 = lambda a: a.astype(jnp.float32)
    reference = einsum_path(f32(qkv), f32(keys), f32(values), position)
    args = (qkv, keys, values, position)
    b.run("attention", "einsum (the model's prefill path)", einsum_path, args, reference, nbytes)
    for tiling in ATTENTION_TILINGS:
        label = "moetune kernels " + " ".join(f"{key}={value}" for key, value in tiling.items())
        fn = functools.partial(kernel_path, **tiling)
        b.run("attention", label, fn, args, reference, nbytes)


def norm_router_cases(b: Bench) -> None:
    """The MoE block's RMSNorm and router logits at T=1: XLA's ops, and the one kernel at several widths."""
    from moetune.models import mixtral, norm_router

    ks = jax.random.split(jax.random.key(4), 3)
    x, weight, router = normal(ks[0], (1, 4096)), normal(ks[1], (4096,)), normal(ks[2], (4096, 8), 4096**-0.5)

    def xla_ops(x, weight, router):
        h = mixtral.rms_norm(x, weight, 1e-5)
        return jnp.dot(h, router, preferred_element_type=jnp.float32)

    reference = xla_ops(x.astype(jnp.float32), weight.astype(jnp.float32), router.astype(jnp.float32))
    nbytes = (4096 + 4096 + 4096 * 8) * 2
    b.run("norm_router", "xla ops (rms_norm, dot)", xla_ops, (x, weight, router), reference, nbytes)
    for warps in (4, 8, 16):
        fn = lambda x, w, r, warps=warps: norm_router.norm_and_router(x, w, r, 1e-5, num_warps=warps)[1]
        b.run("norm_router", f"moetune kernel num_warps={warps}", fn, (x, weight, router), reference, nbytes)


def stride_cases(b: Bench, num_sms: int) -> None:
    """Same GEMVs with the weights' row length a multiple of 8 KiB (the Mixtral shapes) or not: whether
    the row stride, not the kernel, sets the read bandwidth."""
    for k, widths in ((4096, (28672, 28928, 32000, 32768)), (14336, (4096, 4352))):
        for n in widths:
            kx, kw = jax.random.split(jax.random.key(n))
            x, w = normal(kx, (1, k)), normal(kw, (k, n), k**-0.5)
            ref = jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32))
            dot = lambda x, w: x @ w  # noqa: E731
            b.run("stride", f"xla_dot K={k} N={n} (row {n * 2} B)", dot, (x, w), ref, k * n * 2)
            del w
    sizes = jnp.zeros((8,), jnp.int32).at[jnp.array([2, 5])].set(1)
    for inter in (14336, 14464):
        x = normal(jax.random.key(1), (2, 4096))
        w = normal(jax.random.key(2), (8, 4096, 2 * inter), 4096**-0.5)
        ref = _swiglu(jax.lax.ragged_dot(x.astype(jnp.float32), w.astype(jnp.float32), sizes))
        for c in GATE_UP_FUSED[:2]:
            fn = functools.partial(kernel_sm90.grouped_matmul_swiglu, config=c, num_sms=num_sms)
            label = f"gate_up F={inter} fused {kernel_sm90.kernel_name(c)}"
            b.run("stride", label, fn, (x, w, sizes), ref, 2 * 4096 * 4 * inter)
        del w
    for hidden in (4096, 4352):
        x = normal(jax.random.key(3), (2, 14336))
        w = normal(jax.random.key(4), (8, 14336, hidden), 14336**-0.5)
        ref = jax.lax.ragged_dot(x.astype(jnp.float32), w.astype(jnp.float32), sizes)
        fn = functools.partial(kernel_sm90.grouped_matmul, config=DOWN[0], num_sms=num_sms)
        label = f"down H={hidden} {kernel_sm90.kernel_name(DOWN[0])}"
        b.run("stride", label, fn, (x, w, sizes), ref, 2 * 14336 * hidden * 2)
        del w


def pad_cases(b: Bench, num_sms: int) -> None:
    """The shipped pack's decode winners (T = 1 to 16) with pad_lhs off and on."""
    from moetune.kernels import packs

    pack = packs.load(moe_shapes.SHIPPED_PACK)
    hidden, inter, experts = 4096, 14336, 8
    weights = {
        "grouped_matmul_swiglu": normal(jax.random.key(21), (experts, hidden, 2 * inter), hidden**-0.5),
        "grouped_matmul": normal(jax.random.key(22), (experts, inter, hidden), inter**-0.5),
    }
    for entry in pack.entries:
        p = entry.problem
        if p.m > 32 or (p.op == "grouped_matmul" and p.k != inter):
            continue
        w = weights[p.op]
        x = normal(jax.random.key(p.m), (p.m, p.k))
        tokens = p.m // 2
        sizes = jnp.zeros((experts,), jnp.int32).at[jnp.arange(2 * tokens) % experts].add(1)
        swiglu = p.op == "grouped_matmul_swiglu"
        op = kernel_sm90.grouped_matmul_swiglu if swiglu else kernel_sm90.grouped_matmul
        ref = jax.lax.ragged_dot(x.astype(jnp.float32), w.astype(jnp.float32), sizes)
        ref = _swiglu(ref) if swiglu else ref
        touched = int(jnp.count_nonzero(sizes))
        for pad in (False, True):
            config = dataclasses.replace(C(**entry.config), pad_lhs=pad)
            fn = functools.partial(op, config=config, num_sms=num_sms)
            label = f"{p.op[-6:]} T={tokens} {kernel_sm90.kernel_name(config)}"
            b.run("pad", label, fn, (x, w, sizes), ref, touched * p.k * p.n * 2)


def orientation_cases(b: Bench, num_sms: int) -> None:
    """The T=1 down GEMM with the same weights stored [G, K, N] (a 64x256 tile reads 64 runs of 512
    contiguous bytes) or [G, N, K] (256 runs of block_k * 2 bytes: 64, 128 or 256): whether the length of the
    runs a tile reads sets the read rate. Were it so, a tile-contiguous weight layout would pay off at
    decode, where both GEMMs sit at 86-88% of the measured read bandwidth."""
    hidden, inter = 4096, 14336
    sizes = jnp.zeros((8,), jnp.int32).at[jnp.array([2, 5])].set(1)
    x = normal(jax.random.key(5), (2, inter))
    w = normal(jax.random.key(6), (8, inter, hidden), inter**-0.5)
    ref = jax.lax.ragged_dot(x.astype(jnp.float32), w.astype(jnp.float32), sizes)
    for transpose in (False, True):
        weights = jnp.swapaxes(w, 1, 2) if transpose else w  # a copy in the other layout
        layout = "[G,N,K]" if transpose else "[G,K,N]"
        for c in ORIENTATION:
            fn = functools.partial(
                kernel_sm90.grouped_matmul, config=c, num_sms=num_sms, transpose_rhs=transpose
            )
            label = f"{layout} {kernel_sm90.kernel_name(c)}"
            b.run("orientation", label, fn, (x, weights, sizes), ref, 2 * inter * hidden * 2)
        del weights


def _probe(b: Bench, name: str, w, what: str, tiles: tuple[int, int, int], x, **parts) -> None:
    """stream_probe's kernel over experts 2 and 5 of `w` with these tiles and parts, timed as one row."""
    block_k, block_n, stages = tiles
    fn = functools.partial(
        stream_probe.stream_weights, experts=(2, 5), block_k=block_k, block_n=block_n, stages=stages, **parts
    )
    label = f"{name} two experts, {what}, k{block_k} n{block_n} s{stages}"
    b.run("stream", label, fn, (w, x), None, 2 * w.shape[1] * w.shape[2] * w.dtype.itemsize)


def stream_cases(b: Bench, num_sms: int) -> None:
    hidden, inter, experts = 4096, 14336, 8
    for name, k, n in (("gate_up", hidden, 2 * inter), ("down", inter, hidden)):
        w = normal(jax.random.key(k), (experts, k, n), k**-0.5)
        x = normal(jax.random.key(9), (2, k))
        for tiles in stream_probe.STREAM_TILES:
            _probe(b, name, w, "TMA only", tiles, x)
        for tiles in stream_probe.STREAM_PARTS:  # the plain kernel's parts, added one at a time
            for lhs, mma in ((True, False), (False, True), (True, True)):
                parts = " + ".join(p for p, on in (("lhs tiles", lhs), ("wgmma", mma)) if on)
                _probe(b, name, w, f"TMA + {parts}", tiles, x, lhs=lhs, mma=mma)
        # Whether the lhs copies cost for the zero fill of the 62 rows past x's 2 (x padded to 64 real rows),
        # or for their size (8-row boxes).
        x64 = jnp.pad(x, ((0, 62), (0, 0)))
        tiles = stream_probe.STREAM_PARTS[0]
        _probe(b, name, w, "TMA + lhs tiles of a 64-row x", tiles, x64, lhs=True)
        _probe(b, name, w, "TMA + lhs tiles of a 64-row x + wgmma", tiles, x64, lhs=True, mma=True)
        _probe(b, name, w, "TMA + 8-row lhs boxes", tiles, x, lhs=True, lhs_rows=8)
        if name == "gate_up":  # both rows on expert 2: one expert's 235 MB, as cuBLAS's same-FLOP GEMM reads
            sizes = jnp.zeros((experts,), jnp.int32).at[2].set(2)
            ref = _swiglu(jnp.dot(x.astype(jnp.float32), w[2].astype(jnp.float32)))
            fused = GATE_UP_FUSED[1]
            fn = functools.partial(kernel_sm90.grouped_matmul_swiglu, config=fused, num_sms=num_sms)
            label = f"gate_up one expert, fused {kernel_sm90.kernel_name(fused)}"
            b.run("stream", label, fn, (x, w, sizes), ref, k * n * 2)
            dot = lambda x, w: _swiglu(x @ w[2])  # noqa: E731
            b.run("stream", "gate_up one expert, xla_dot", dot, (x, w), ref, k * n * 2)
        del w


def gemv_cases(b: Bench) -> None:
    """The dense projections at M=1 as the model runs them, XLA's ops against the GEMV kernel."""
    from moetune.models import gemv, mixtral

    ks = jax.random.split(jax.random.key(5), 4)
    x, norm_weight = normal(ks[0], (1, 4096), 3.0), normal(ks[1], (4096,), 0.1) + 1
    residual = normal(ks[2], (1, 4096))
    cases = {
        "wqkv+norm": (
            normal(ks[3], (4096, 6144), 4096**-0.5),
            lambda x, n, w, r: mixtral.rms_norm(x, n, 1e-5) @ w,
            lambda x, n, w, r, t: gemv.project(x, w, norm=(n, 1e-5), tiling=t),
        ),
        "wo+residual": (
            normal(ks[3], (4096, 4096), 4096**-0.5),
            lambda x, n, w, r: r + x @ w,
            lambda x, n, w, r, t: r + gemv.project(x, w, tiling=t),
        ),
        "lm_head+norm": (
            normal(ks[3], (4096, 32000), 4096**-0.5),
            lambda x, n, w, r: jnp.dot(mixtral.rms_norm(x, n, 1e-5), w, preferred_element_type=jnp.float32),
            lambda x, n, w, r, t: jnp.sum(gemv.partial_sums(x, w, norm=(n, 1e-5), tiling=t), axis=0),
        ),
    }
    for case, (w, xla_ops, kernel) in cases.items():
        args = (x, norm_weight, w, residual)
        reference = xla_ops(*(a.astype(jnp.float32) for a in args))
        nbytes = w.size * 2
        b.run(case, "xla ops", xla_ops, args, reference, nbytes)
        for t in GEMV_TILINGS:
            if not gemv.fits(x.shape, w.shape, t):
                continue
            label = f"moetune gemv n{t.block_n} k{t.block_k} split{t.split_k} w{t.num_warps} s{t.num_stages}"
            b.run(case, label, functools.partial(kernel, t=t), args, reference, nbytes)


def dump_hlo(path: Path) -> None:
    """The optimized HLO of a 2-layer decode step and of a 4-step decode loop (moetune path): names the
    small fusions a trace shows. The loop's goes beside `path`, named *_loop*."""
    from moetune.models import mixtral
    from moetune.models.config import model_config
    from moetune.models.weights import init_params

    config = model_config("mixtral_8x7b", 2)
    params = init_params(config, seed=0)
    cache = mixtral.KVCache.empty(config, 1, 2176)
    tokens, pos = jnp.zeros((1,), jnp.int32), jnp.asarray(2100, jnp.int32)
    static = dict(config=config, moe_path="moetune")
    step = mixtral.decode_step.lower(params, tokens, cache, pos, **static)
    loop = mixtral.decode_loop.lower(params, tokens, cache, pos, steps=4, **static)
    for lowered, out in ((step, path), (loop, path.with_name(path.name.replace(".txt", "_loop.txt")))):
        with gzip.open(out, "wt") as f:
            f.write(lowered.compile().as_text())
        log(f"wrote {out}")


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--only",
        default="proj,gate_up,down,attention",
        help="also: stride, orientation, pad, stream, norm_router, gemv",
    )
    parser.add_argument("--read-tbps", type=float, default=4.69, help="measured HBM read bandwidth")
    parser.add_argument("--hlo-out", type=Path)
    args = parser.parse_args()
    which = set(args.only.split(","))
    device = jax.devices()[0]
    num_sms = int(getattr(device, "core_count", 132))
    b = Bench(args.read_tbps)
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
        "device": device.device_kind,
        "jax": jax.__version__,
        "read_tbps": args.read_tbps,
        "rows": b.rows,
    }
    save = lambda: args.out.write_text(json.dumps(result, indent=1))  # noqa: E731
    if args.hlo_out:
        dump_hlo(args.hlo_out)
    if "attention" in which:
        attention_cases(b)
        save()
    if "norm_router" in which:
        norm_router_cases(b)
        save()
    if "gemv" in which:
        gemv_cases(b)
        save()
    if "proj" in which:
        proj_cases(b, num_sms)
        save()
    if "stride" in which:
        stride_cases(b, num_sms)
        save()
    if "orientation" in which:
        orientation_cases(b, num_sms)
        save()
    if "pad" in which:
        pad_cases(b, num_sms)
        save()
    if "stream" in which:
        stream_cases(b, num_sms)
        save()
    if which & {"gate_up", "down"}:
        moe_cases(b, num_sms, which)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
