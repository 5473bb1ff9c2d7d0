"""Mixtral-8x7B grouped GEMMs on the GPU machine: moetune's mosaic_gpu kernel beside its peers.

Per shape ([2T, 4096] x [8, 4096, 28672] gate_up and [2T, 14336] x [8, 14336, 4096] down) and routing
(balanced, Zipf-skewed) it times, all with CUPTI device time (median of 10):
  moetune           best of a small sweep of mosaic_gpu configs: the tuned pack's winner for the shape
                    (--pack, the shipped H200 pack by default), then candidates by regime (below)
  xla_ragged_dot    jax.lax.ragged_dot: what a JAX user gets without a kernel
  dense_einsum      every token through every expert, then the routed rows picked: 8x the FLOPs
  mgpu_default      JAX's ragged_dot_mgpu (pallas/ops/gpu) with block 128x128x64, 4 stages, grid_block_n 1
  mgpu_best         best of ragged_dot_mgpu's own sweep: 20 configs beside the default (--mgpu-sweep)
  torch_grouped_mm  torch._grouped_mm (CUTLASS grouped GEMM): the strongest peer
  cublas_torch      torch.matmul [M,K]x[K,N]: the compute bound, cuBLAS at the same FLOPs
  cublas_xla        jnp.dot of the same shapes (cuBLAS through XLA)
and derives hbm_roofline: bytes of the weights of experts that have rows / measured HBM read bandwidth,
the memory bound for small T. Raw numbers and the environment go to --out as JSON.

    python3 lab/bench/bench_gemm.py --out $OUT/bench.json --budget-s 400

With --models, the development shapes of fine-grained models instead (dev_shapes.py; DevRunner below):
the heuristic and alternatives beside torch._grouped_mm, tokamax, ragged_dot, cuBLAS and the roofline;
with --compile-times also, each candidate's compile time alone.

    python3 lab/bench/bench_gemm.py --models qwen3-30b-a3b,deepseek-v3 --out $OUT/dev.json --budget-s 300
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import threading
import time
import traceback

from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C
from moetune_lab.bench import dev_shapes, moe_shapes, torch_timing
from moetune_lab.bench.device_kernel_check import time_jax
from moetune_lab.bench.moe_shapes import Shape

PLAIN = dict(warp_specialized=False, wg_split="none")
# 128x256 CTAs of two 128x128 consumers (the shape of most prefill winners); one expert's tiles at a time.
WIDE = dict(block_m=128, block_n=128, wg_split="n")
EXPERT = dict(grid_minor_dim="expert")
# moetune's small sweep, by regime (rows per expert), after the tuned pack's winner for the shape: the first
# three of each were seeded from device_kernel_check.py's sweep, the rest added on 2026-11-30 for the rows
# that missed their targets (64x256 one-CTA-per-tile for decode; tile order, width and stages for prefill).
CANDIDATES = {
    "memory_bound": [
        C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n"),
        C(
            block_m=64,
            block_n=64,
            block_k=128,
            max_concurrent_steps=4,
            wg_split="n",
            epi_tile_n=32,
            split_k=2,
        ),
        # Small enough (113 KB) for two CTAs per SM, so one streams while the other switches tiles.
        C(block_m=64, block_n=128, block_k=128, max_concurrent_steps=2, persistent=False, **PLAIN),
        C(
            block_m=64,
            block_n=256,
            block_k=64,
            max_concurrent_steps=3,
            persistent=False,
            grid_tile_width=1,
            **PLAIN,
        ),
        C(
            block_m=64,
            block_n=256,
            block_k=64,
            max_concurrent_steps=4,
            persistent=False,
            grid_minor_dim="n",
            grid_tile_width=4,
            **PLAIN,
        ),
        C(block_m=64, block_n=256, block_k=64, max_concurrent_steps=3, persistent=False, split_k=2, **PLAIN),
        C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=3, wg_split="n"),
        # 128-row CTAs of two 64-row consumers: at T=128 Zipf the largest expert's 94 rows fit one tile, so
        # its weights are read once, and a consumer whose half of a small expert's tile is empty issues no
        # MMA. On the H200 (2026-11-30) the second won down T=128 Zipf and lost gate_up's.
        C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="m"),
        C(block_m=64, block_n=256, block_k=64, max_concurrent_steps=4, wg_split="m"),
    ],
    "compute_bound": [
        C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n"),
        C(block_m=64, block_n=256, block_k=64, max_concurrent_steps=4, wg_split="m"),
        C(block_m=128, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="n"),
        C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n", grid_tile_width=16),
        C(
            block_m=128,
            block_n=128,
            block_k=64,
            max_concurrent_steps=4,
            wg_split="n",
            grid_minor_dim="n",
            grid_tile_width=8,
        ),
        C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=3, wg_split="n"),
        C(block_m=128, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="n", grid_tile_width=16),
        C(block_m=64, block_n=256, block_k=64, max_concurrent_steps=4, wg_split="m", grid_tile_width=16),
        C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n", grid_tile_width=4),
        # For the rows where torch._grouped_mm had been ahead (H200, 2026-11-30). down at
        # T=1024 Zipf takes 288 tiles of 128x256, 2.18 waves of 132 CTAs, so a third wave runs on 24 SMs;
        # as 64x256 or 128x128 CTAs it takes 4.24-4.36 waves of half-length tiles (2.5 long tiles' time).
        C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n"),
        C(block_m=64, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="n"),
        C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="m"),
        C(block_m=128, block_n=64, block_k=64, max_concurrent_steps=6, wg_split="n"),
        # Tile order for Zipf routing, where a strip of 8 row tiles spans two or three experts' weights: the
        # plain orders first, then "expert", whose strips never leave an expert.
        C(**WIDE, block_k=64, max_concurrent_steps=4, grid_minor_dim="n", grid_tile_width=16),
        C(**WIDE, block_k=64, max_concurrent_steps=4, grid_tile_width=2),
        C(**WIDE, block_k=64, max_concurrent_steps=4, **EXPERT),
        C(**WIDE, block_k=64, max_concurrent_steps=4, grid_tile_width=4, **EXPERT),
        C(**WIDE, block_k=64, max_concurrent_steps=3, **EXPERT),
        C(**WIDE, block_k=128, max_concurrent_steps=2, **EXPERT),
        C(block_m=64, block_n=256, block_k=64, max_concurrent_steps=4, wg_split="m", **EXPERT),
        C(block_m=128, block_n=64, block_k=64, max_concurrent_steps=6, wg_split="n", **EXPERT),
    ],
}
MGPU_DEFAULT = dict(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, grid_block_n=1)
MGPU_SWEEP = [
    dict(block_m=128, block_n=128, block_k=64, max_concurrent_steps=5, grid_block_n=8),
    dict(block_m=64, block_n=256, block_k=64, max_concurrent_steps=4, grid_block_n=4),
]
# --mgpu-sweep full: ragged_dot_mgpu's tiles (rows, columns, stages at block_k 64) whose stages and output
# tile fit 227 KB of shared memory, each at grid widths 1 and 8, then the small sweep's: 20 configs beside the
# default: the peer column is ragged_dot_mgpu at its best, not only at its default.
MGPU_FULL_TILES = (
    (64, 128, 3), (64, 128, 4), (64, 128, 5), (64, 256, 3), (64, 256, 4),
    (128, 128, 3), (128, 128, 4), (128, 128, 5), (128, 256, 2), (128, 256, 3),
)  # fmt: skip
MGPU_FULL_SWEEP = [
    dict(block_m=bm, block_n=bn, block_k=64, max_concurrent_steps=steps, grid_block_n=width)
    for bm, bn, steps in MGPU_FULL_TILES
    for width in (1, 8)
]
MGPU_FULL_SWEEP = [p for p in MGPU_FULL_SWEEP if p != MGPU_DEFAULT]
MGPU_FULL_SWEEP += [p for p in MGPU_SWEEP if p not in MGPU_FULL_SWEEP]
MGPU_SWEEPS = {"small": MGPU_SWEEP, "full": MGPU_FULL_SWEEP}
# Cheap and most important first: a spent budget skips the tail of this list.
METHODS = (
    "cublas_torch",
    "torch_grouped_mm",
    "moetune",
    "mgpu_default",
    "mgpu_best",
    "xla_ragged_dot",
    "cublas_xla",
    "dense_einsum",
)


def pack_winners(path: str) -> dict:
    """Problem key -> the pack's winning config (a pack of another kernel source still names configs
    worth trying; the sweep's recorded time is not used). Entries of ops with a Config of their own (the
    decode block's) are no GEMM's and are left out."""
    from moetune.kernels import packs
    from moetune.kernels.backends.mosaic_gpu.backend import MosaicGpuBackend

    own = MosaicGpuBackend.op_configs
    return {e.problem.key: C.from_dict(e.config) for e in packs.load(path).entries if e.problem.op not in own}


def regime(shape: Shape) -> str:
    return "memory_bound" if shape.m / moe_shapes.EXPERTS <= 64 else "compute_bound"


def _summary(samples: list[float], **extra) -> dict:
    return {**torch_timing.summary(samples), **extra}


def measure_bandwidth() -> dict:
    """HBM read bandwidth: a 4 GiB bf16 array summed (read once, tiny write), by XLA and by PyTorch."""
    import jax
    import jax.numpy as jnp

    result = {}
    x = jnp.ones((1 << 31,), jnp.bfloat16)
    nbytes = x.nbytes
    total = jax.jit(lambda v: jnp.sum(v, dtype=jnp.float32))
    samples = time_jax(total, (x,))
    result["xla_sum_read_GBps"] = nbytes / statistics.median(samples) / 1e9
    x.delete()
    try:
        result.update(_torch_bandwidth())
    except Exception as e:  # torch is optional: record why it is missing
        result["torch_error"] = f"{type(e).__name__}: {e}"
    result["read_GBps"] = max(v for k, v in result.items() if k.endswith("read_GBps"))
    return result


def _torch_bandwidth() -> dict:
    import torch

    src = torch.ones(1 << 31, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    summed, how = torch_timing.time_torch(lambda: src.sum(dtype=torch.float32))
    copied, _ = torch_timing.time_torch(lambda: dst.copy_(src))
    return {
        "torch_sum_read_GBps": src.nbytes / statistics.median(summed) / 1e9,
        "torch_copy_read_plus_write_GBps": 2 * src.nbytes / statistics.median(copied) / 1e9,
        "torch_timing": how,
    }


class Runner:
    """Holds inputs for one projection and times every method on one (shape, routing)."""

    def __init__(
        self,
        proj: str,
        deadline: float,
        candidates: dict,
        mgpu_sweep: list[dict],
        mgpu_sweep_min_tokens: int,
        tuned: dict | None = None,
    ):
        self.proj = proj
        self.tuned = tuned or {}  # problem key -> the pack's winner
        self.mgpu_sweep_min_tokens = mgpu_sweep_min_tokens
        self.deadline = deadline
        self.candidates = candidates
        self.mgpu_sweep = mgpu_sweep
        self.weights = moe_shapes.make_weights(proj)
        self.compiled: dict[tuple, object] = {}
        self._torch_weights = None

    def torch_weights(self):
        """[G, K, N] bf16 weights in PyTorch, row-major and K-major (made on first use)."""
        if self._torch_weights is None:
            import torch

            k, n = moe_shapes.PROJECTIONS[self.proj]
            w = (torch.randn(moe_shapes.EXPERTS, k, n, device="cuda") * 0.02).to(torch.bfloat16)
            self._torch_weights = (w, w.transpose(1, 2).contiguous().transpose(1, 2))
        return self._torch_weights

    def _jax(self, key, fn, args):
        import jax

        if key not in self.compiled:
            self.compiled[key] = jax.jit(fn).lower(*args).compile()
        return time_jax(self.compiled[key], args)

    def moetune(self, shape, lhs, gs):
        import jax
        import jax.numpy as jnp

        from moetune.kernels import registry
        from moetune.kernels.problem import Problem

        backend = registry.get("mosaic_gpu")
        problem = Problem("grouped_matmul", m=shape.m, k=shape.k, n=shape.n, g=moe_shapes.EXPERTS)
        # Checked against XLA's bf16 ragged_dot (the float32 reference of the GPU tests would need
        # tens of GB at T=16384); two bf16 roundings stay far below the 1e-2 bound.
        ref = jax.jit(jax.lax.ragged_dot)(lhs, self.weights, gs).astype(jnp.float32)
        ref_norm = float(jnp.linalg.norm(ref.ravel()))
        best, tried = None, []
        pack_winner = self.tuned.get(problem.key)
        configs = [pack_winner] if pack_winner is not None else []
        configs += [c for c in self.candidates[regime(shape)] if c != pack_winner]
        for config in configs:
            if time.monotonic() > self.deadline:
                break
            try:
                fn = backend.build(problem, config)
                samples = self._jax(("moetune", shape, config), fn, (lhs, self.weights, gs))
                out = self.compiled[("moetune", shape, config)](lhs, self.weights, gs).astype(jnp.float32)
                err = float(jnp.linalg.norm((out - ref).ravel())) / ref_norm
                del out
            except Exception as e:  # a candidate failing is data, not the end of the benchmark
                tried.append({"config": config.to_dict(), "error": f"{type(e).__name__}: {e}"[:500]})
                continue
            med = statistics.median(samples)
            tried.append(
                {
                    "config": config.to_dict(),
                    "median_ms": med * 1e3,
                    "rel_err_vs_xla": err,
                    "from_pack": config == pack_winner,
                }
            )
            if not err < 1e-2:
                continue
            if best is None or med < statistics.median(best[1]):
                best = (config, samples)
        if best is None:
            raise RuntimeError(f"no moetune candidate ran: {tried}")
        return _summary(best[1], config=best[0].to_dict(), tried=tried)

    def xla_ragged_dot(self, shape, lhs, gs):
        import jax

        return _summary(self._jax(("xla", shape), jax.lax.ragged_dot, (lhs, self.weights, gs)))

    def dense_einsum(self, shape, lhs, gs):
        import jax.numpy as jnp

        def dense(x, w, sizes):
            every = jnp.einsum("mk,gkn->gmn", x, w)
            expert = jnp.searchsorted(jnp.cumsum(sizes), jnp.arange(x.shape[0]), side="right")
            expert = jnp.minimum(expert, w.shape[0] - 1)
            return every[expert, jnp.arange(x.shape[0])]

        if moe_shapes.EXPERTS * shape.m * shape.n * 2 > 24 << 30:
            raise RuntimeError("the all-experts intermediate would exceed 24 GiB")
        return _summary(self._jax(("dense", shape), dense, (lhs, self.weights, gs)))

    def _mgpu(self, shape, lhs, gs, params):
        from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

        if shape.n % (params["block_n"] * params["grid_block_n"]):
            raise ValueError(f"N={shape.n} is not a multiple of block_n * grid_block_n for {params}")
        fn = functools.partial(_mgpu_call, ragged_dot_mgpu.ragged_dot, params=params)
        return self._jax(("mgpu", shape, tuple(sorted(params.items()))), fn, (lhs, self.weights, gs))

    def mgpu_default(self, shape, lhs, gs):
        return _summary(self._mgpu(shape, lhs, gs, MGPU_DEFAULT), config=MGPU_DEFAULT)

    def mgpu_best(self, shape, lhs, gs):
        best, tried = None, []
        sweep = self.mgpu_sweep if shape.tokens >= self.mgpu_sweep_min_tokens else []
        for params in [MGPU_DEFAULT, *sweep]:
            if time.monotonic() > self.deadline:
                break
            try:
                samples = self._mgpu(shape, lhs, gs, params)
            except Exception as e:  # e.g. shared memory exceeded for this shape
                tried.append({"config": params, "error": f"{type(e).__name__}: {e}"[:300]})
                continue
            tried.append({"config": params, "median_ms": statistics.median(samples) * 1e3})
            if best is None or statistics.median(samples) < statistics.median(best[1]):
                best = (params, samples)
        if best is None:
            raise RuntimeError(f"no ragged_dot_mgpu config ran: {tried}")
        return _summary(best[1], config=best[0], tried=tried)

    def torch_grouped_mm(self, shape, lhs, gs):
        import torch

        a = torch.randn(shape.m, shape.k, device="cuda", dtype=torch.bfloat16)
        offs = torch.cumsum(torch.tensor(list(map(int, gs)), device="cuda", dtype=torch.int32), 0).to(
            torch.int32
        )
        errors = []
        row_major, k_major = self.torch_weights()
        for layout, w in (("row_major_b", row_major), ("k_major_b", k_major)):
            try:
                samples, how = torch_timing.time_torch(lambda w=w: torch._grouped_mm(a, w, offs=offs))
                return _summary(samples, layout=layout, timing=how)
            except RuntimeError as e:
                errors.append(f"{layout}: {e}"[:300])
        raise RuntimeError("; ".join(errors))

    def cublas_torch(self, shape, lhs, gs):
        import torch

        a = torch.randn(shape.m, shape.k, device="cuda", dtype=torch.bfloat16)
        b = self.torch_weights()[0][0]
        samples, how = torch_timing.time_torch(lambda: torch.matmul(a, b))
        return _summary(samples, timing=how)

    def cublas_xla(self, shape, lhs, gs):
        import jax.numpy as jnp

        return _summary(self._jax(("dot", shape), lambda x, w: jnp.dot(x, w[0]), (lhs, self.weights)))


def _mgpu_call(ragged_dot, lhs, rhs, group_sizes, *, params):
    return ragged_dot(lhs, rhs, group_sizes=group_sizes, **params)


def run_case(runner: Runner, shape: Shape, routing: str, methods, bandwidth: dict) -> dict:
    import jax.numpy as jnp

    sizes = moe_shapes.group_sizes(shape, routing)
    gs = jnp.asarray(sizes, jnp.int32)
    lhs = moe_shapes.make_lhs(shape)
    touched = sum(1 for s in sizes if s > 0)
    weight_bytes = touched * shape.k * shape.n * 2
    case = {
        "shape": shape.name,
        "proj": shape.proj,
        "tokens": shape.tokens,
        "m": shape.m,
        "k": shape.k,
        "n": shape.n,
        "routing": routing,
        "group_sizes": sizes,
        "touched_experts": touched,
        "flops": shape.flops,
        "hbm_roofline_ms": weight_bytes / (bandwidth["read_GBps"] * 1e9) * 1e3,
        "methods": {},
    }
    for method in methods:
        if time.monotonic() > runner.deadline:
            case["methods"][method] = {"error": "skipped: budget spent"}
            continue
        start = time.monotonic()
        try:
            case["methods"][method] = getattr(runner, method)(shape, lhs, gs)
        except Exception as e:  # the edge where a failure becomes a record
            case["methods"][method] = {
                "error": f"{type(e).__name__}: {e}"[:1000],
                "traceback": traceback.format_exc()[-2000:],
            }
        # Compiles included: what the next run's --budget-s has to cover.
        case["methods"][method]["wall_s"] = round(time.monotonic() - start, 2)
    return case


def print_table(cases: list[dict]) -> None:
    cols = ("moetune", "torch_grouped_mm", "mgpu_best", "mgpu_default", "xla_ragged_dot", "cublas_torch")
    print(
        "\nshape           routing   "
        + " ".join(f"{c[:14]:>14s}" for c in cols)
        + "   roofline   vs-peer  %cuBLAS  %roof"
    )
    for case in cases:
        ms = {c: case["methods"].get(c, {}).get("median_ms") for c in cols}
        cells = " ".join(f"{v:14.3f}" if v else f"{'-':>14s}" for v in ms.values())
        r = moe_shapes.target_ratios(case)
        vs_peer = f"{r['vs_peer']:7.3f}x" if r["vs_peer"] else "       -"
        vs_cublas = f"{r['vs_cublas'] * 100:7.1f}" if r["vs_cublas"] else "      -"
        vs_roof = f"{r['vs_roofline'] * 100:6.1f}" if r["vs_roofline"] else "     -"
        head = f"{case['shape']:15s} {case['routing']:9s} {cells}"
        print(f"{head} {case['hbm_roofline_ms']:10.3f} {vs_peer} {vs_cublas} {vs_roof}")


# --- The fine-grained development shapes (--models) ------------------------------------------------
# Per case (model, GEMM, T; dev_shapes.py): the mosaic_gpu heuristic's config (no tuned entry), the cost
# model's best configs of DEV_ALTERNATIVES other tile shapes, the shipped pack's winner where it has
# one, torch._grouped_mm and tokamax's ragged_dot(implementation="mosaic") on the same GEMM (for gate_up
# the [M, 2F] product, without the activation moetune fuses), jax.lax.ragged_dot, cuBLAS at the same
# FLOPs and the HBM roofline of the touched experts' weights. Every grouped output is checked against
# ragged_dot's float32 product (silu(gate) * up of it for gate_up). Inputs rotate over routings that touch
# more than twice the L2 of weights (dev_shapes.routings); lhs and weights are shared with PyTorch
# through DLPack, so every method multiplies the same data.

DEV_ALTERNATIVES = 2
XLA_EXPANSION_MAX_BYTES = 4 << 30  # jax.lax.ragged_dot's [G, M, K] (see _xla_expansion_bytes)
# Compiling is host work: a pool compiles the next cases between this case's timings, never during one
# (XLA's autotuner and tokamax's launch kernels while they compile; a CUPTI window would count them).
DEV_COMPILE_WORKERS = 8
DEV_METHODS = ("moetune", "torch_grouped_mm", "tokamax_mosaic", "xla_ragged_dot", "cublas_torch")


class _Gate:
    """Compiles run side by side; a timing runs alone. A waiting timing holds back new compiles."""

    def __init__(self):
        self._cond = threading.Condition()
        self._compiling = 0
        self._timing = False

    @contextlib.contextmanager
    def compiling(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._timing)
            self._compiling += 1
        try:
            yield
        finally:
            with self._cond:
                self._compiling -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def timing(self):
        with self._cond:
            self._timing = True
            self._cond.wait_for(lambda: self._compiling == 0)
        try:
            yield
        finally:
            with self._cond:
                self._timing = False
                self._cond.notify_all()


def _compile(gate, fn, args):
    import jax

    with gate.compiling():
        start = time.monotonic()
        executable = jax.jit(fn).lower(*args).compile()
        return executable, time.monotonic() - start


def _swiglu(product):
    import jax
    import jax.numpy as jnp

    gate, up = jnp.split(product, 2, axis=-1)
    return jax.nn.silu(gate) * up


def _reference(lhs, rhs, sizes: list[int], *, swiglu: bool):
    """(float32 [M, N] product, the op's float32 result), one expert at a time in PyTorch: XLA's
    ragged_dot asks for 112 GiB at DeepSeek-V3's T=4096 gate_up, a loop over experts for 1 GiB."""
    import jax
    import torch

    a, w = torch.from_dlpack(lhs), torch.from_dlpack(rhs)
    product = torch.zeros(a.shape[0], w.shape[-1], device=a.device, dtype=torch.float32)
    start = 0
    for expert, size in enumerate(sizes):
        end = min(start + size, a.shape[0])
        if end > start:
            product[start:end] = a[start:end].float() @ w[expert].float()
        start = end
    product = jax.dlpack.from_dlpack(product)
    return (product, _swiglu(product)) if swiglu else (product, product)


def _xla_expansion_bytes(problem) -> int:
    """XLA's ragged_dot on a GPU is one dense dot of lhs expanded to [G, M, K] (jax's ragged_dot lowering
    outside TPUs): past XLA_EXPANSION_MAX_BYTES it runs out of memory or for seconds, and it is no peer."""
    return problem.g * problem.m * problem.k * 2


def _xla_ragged_dot(lhs, rhs, group_sizes):
    import jax

    return jax.lax.ragged_dot(lhs, rhs, group_sizes)


def _rel_err(out, ref) -> float:
    import jax.numpy as jnp

    diff = jnp.linalg.norm((out.astype(jnp.float32) - ref).ravel())
    return float(diff / jnp.linalg.norm(ref.ravel()))


class DevRunner:
    """Times every method of the development-shape cases, compiling ahead on a thread pool."""

    def __init__(self, cases, deadline: float, bandwidth: dict, tuned: dict, workers: int):
        from concurrent.futures import ThreadPoolExecutor

        from moetune.kernels import registry
        from moetune.kernels.backends.mosaic_gpu import timer
        from moetune.kernels.device import current_fingerprint

        self.cases, self.deadline, self.bandwidth, self.tuned = cases, deadline, bandwidth, tuned
        self.backend = registry.get("mosaic_gpu")
        self.device = current_fingerprint()
        self.l2_bytes = timer.device_l2_bytes()
        self.timer = timer.CuptiTimer(min_rotation_bytes=0)  # the routings rotate the inputs
        self.pool = ThreadPoolExecutor(workers)
        self.gate = _Gate()
        self.done: dict[tuple, object] = {}  # (case, *key) -> (executable, compile seconds) or the error
        self.futures: dict[tuple, object] = {}
        self.weights: tuple | None = None  # (model, gemm) -> rhs, held for that pair's cases

    def configs(self, case) -> dict[str, C]:
        from moetune.kernels.backends.mosaic_gpu import space

        problem = case.problem
        named = {"heuristic": self.backend.heuristic(problem, self.device)}
        for i, config in enumerate(space.preferred(problem, self.device)[1 : 1 + DEV_ALTERNATIVES]):
            named[f"alt{i + 1}"] = config
        pack = self.tuned.get(problem.key)
        if pack is not None and pack not in named.values():
            named["pack"] = pack
        return named

    def tuned_method(self, case) -> str | None:
        """The method that runs the pack's winner for the case: `moetune_pack`, or the heuristic or
        alternative whose config it is."""
        pack = self.tuned.get(case.problem.key)
        named = [name for name, config in self.configs(case).items() if config == pack]
        return f"moetune_{named[0]}" if pack is not None and named else None

    def submit_all(self) -> None:
        """Queue every case's compiles in case order (the timing loop takes them in the same order)."""
        import jax
        import jax.numpy as jnp

        for case in self.cases:
            p = case.problem
            args = (
                jax.ShapeDtypeStruct((p.m, p.k), jnp.bfloat16),
                jax.ShapeDtypeStruct(p.rhs_shape, jnp.bfloat16),
                jax.ShapeDtypeStruct((p.g,), jnp.int32),
            )
            jobs = {("xla",): _xla_ragged_dot if _xla_expansion_bytes(p) <= XLA_EXPANSION_MAX_BYTES else None}
            for name, config in self.configs(case).items():
                try:
                    jobs[("moetune", name)] = self.backend.build(p, config)
                except Exception as e:  # a config the constraints refuse is a record, not a crash
                    jobs[("moetune", name)] = e
            try:
                jobs[("tokamax",)] = _tokamax_fn()
            except ImportError as e:  # the bundle lacks tokamax: its column says so
                jobs[("tokamax",)] = e
            for key, fn in jobs.items():
                if fn is None:
                    expanded = _xla_expansion_bytes(p) / 2**30
                    self.futures[(case, *key)] = RuntimeError(
                        f"skipped: XLA's ragged_dot would expand lhs to {expanded:.0f} GiB"
                    )
                elif isinstance(fn, Exception):
                    self.futures[(case, *key)] = fn
                else:
                    self.futures[(case, *key)] = self.pool.submit(_compile, self.gate, fn, args)

    def collect(self, case) -> None:
        """Wait for this case's compiles, outside any timing (a timing holds compiles back)."""
        for key in [k for k in self.futures if k[0] is case]:
            future = self.futures.pop(key)
            if not isinstance(future, Exception):
                try:
                    future = future.result(timeout=max(1.0, self.deadline - time.monotonic()))
                except Exception as e:  # a failed compile is that method's record
                    future = e
            self.done[key] = future

    def compiled(self, case, *key):
        result = self.done.pop((case, *key))
        if isinstance(result, Exception):
            raise result
        return result

    def inputs(self, case):
        import jax
        import jax.numpy as jnp

        p = case.problem
        if self.weights is None or self.weights[0] != (case.model.name, case.gemm):
            self.weights = None  # free the last pair's weights before making these
            # Drawn in bf16: DeepSeek-V3's gate_up weights are 15 GB, a float32 draw would be 30 more.
            rhs = jax.random.normal(jax.random.key(0), p.rhs_shape, jnp.bfloat16) * jnp.bfloat16(p.k**-0.5)
            self.weights = ((case.model.name, case.gemm), rhs)
        lhs = jax.random.normal(jax.random.key(case.tokens), (p.m, p.k), jnp.bfloat16)
        routings = dev_shapes.routings(case, 2 * self.l2_bytes)
        # Drawn before any timing: a draw still running would land in the first CUPTI window.
        lhs, rhs = jax.block_until_ready((lhs, self.weights[1]))
        return lhs, rhs, [jnp.asarray(r, jnp.int32) for r in routings], routings

    def run(self, case) -> dict:
        from moetune.kernels.backends.mosaic_gpu import cost_model as cost
        from moetune.kernels.backends.mosaic_gpu import timer
        from moetune.kernels.problem import GROUPED_MATMUL_SWIGLU

        p = case.problem
        lhs, rhs, sizes, routings = self.inputs(case)
        self.collect(case)
        touched = sum(1 for s in routings[0] if s)
        record = {
            "case": case.name,
            "model": case.model.name,
            "gemm": case.gemm,
            "tokens": case.tokens,
            "problem": p.to_dict(),
            "routings": len(routings),
            "group_sizes": routings[0],
            "touched_experts": touched,
            "tuned_method": self.tuned_method(case),
            "flops": p.flops,
            "hbm_roofline_ms": touched * p.k * p.n * 2 / (self.bandwidth["read_GBps"] * 1e9) * 1e3,
            "methods": {},
        }
        sets = [(lhs, rhs, s) for s in sizes]
        swiglu = p.op == GROUPED_MATMUL_SWIGLU
        plain_ref, ref = _reference(lhs, rhs, routings[0], swiglu=swiglu)
        methods = record["methods"]

        def guarded(name, fn):
            start = time.monotonic()
            if time.monotonic() > self.deadline:
                methods[name] = {"error": "skipped: budget spent"}
                return
            try:
                with self.gate.timing():
                    methods[name] = fn()
            except Exception as e:  # the edge where a failure becomes a record
                methods[name] = {
                    "error": f"{type(e).__name__}: {e}"[:1000],
                    "traceback": traceback.format_exc()[-1500:],
                }
            methods[name]["wall_s"] = round(time.monotonic() - start, 2)

        for name, config in self.configs(case).items():

            def moetune(name=name, config=config):
                exe, compile_s = self.compiled(case, "moetune", name)
                err = _rel_err(exe(*sets[0]), ref)
                if not err < 1e-2:
                    raise RuntimeError(f"relative error {err:.3e} against ragged_dot's float32 result")
                kernels = timer.CuptiSession().record(lambda: exe(*sets[0]))
                return _summary(
                    self.timer.time(exe, sets),
                    config=config.to_dict(),
                    rel_err=err,
                    compile_s=round(compile_s, 2),
                    estimate_ms=cost.estimate(p, config, self.device).seconds * 1e3,
                    kernels=[(k, round(ms, 4)) for k, ms in kernels],
                )

            guarded(f"moetune_{name}", moetune)

        def tokamax_mosaic():
            exe, compile_s = self.compiled(case, "tokamax")
            err = _rel_err(exe(*sets[0]), plain_ref)
            if not err < 1e-2:
                raise RuntimeError(f"relative error {err:.3e} against ragged_dot's float32 product")
            return _summary(
                self.timer.time(exe, sets), rel_err=err, compile_s=round(compile_s, 2), op="[M, N] product"
            )

        def xla_ragged_dot():
            exe, compile_s = self.compiled(case, "xla")
            err = _rel_err(exe(*sets[0]), plain_ref)
            if not err < 1e-2:
                raise RuntimeError(f"relative error {err:.3e} against the float32 product")
            return _summary(
                self.timer.time(exe, sets), rel_err=err, compile_s=round(compile_s, 2), op="[M, N] product"
            )

        guarded("tokamax_mosaic", tokamax_mosaic)
        guarded("torch_grouped_mm", lambda: _torch_grouped_mm(lhs, rhs, routings, plain_ref))
        guarded("xla_ragged_dot", xla_ragged_dot)
        guarded("cublas_torch", lambda: _cublas_torch(lhs, rhs))
        return record


def _tokamax_fn():
    import tokamax

    return functools.partial(_tokamax_call, tokamax.ragged_dot)


def _tokamax_call(ragged_dot, lhs, rhs, group_sizes):
    return ragged_dot(lhs, rhs, group_sizes, implementation="mosaic")


def _torch_grouped_mm(lhs, rhs, routings, plain_ref) -> dict:
    """torch._grouped_mm on the same lhs and weights (DLPack), each call on the next routing."""
    import itertools

    import jax
    import torch

    a, row_major = torch.from_dlpack(lhs), torch.from_dlpack(rhs)
    offsets = [
        torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32) for sizes in routings
    ]
    try:
        w, layout = row_major, "row_major_b"
        out = torch._grouped_mm(a, w, offs=offsets[0])
    except RuntimeError:  # some builds take only K-major weights: a copy in that layout
        w, layout = row_major.transpose(1, 2).contiguous().transpose(1, 2), "k_major_b"
        out = torch._grouped_mm(a, w, offs=offsets[0])
    err = _rel_err(jax.dlpack.from_dlpack(out.contiguous()), plain_ref)
    if not err < 1e-2:
        raise RuntimeError(f"relative error {err:.3e} against ragged_dot's float32 product")
    cycle = itertools.cycle(offsets)
    samples, how = torch_timing.time_torch(lambda: torch._grouped_mm(a, w, offs=next(cycle)))
    return _summary(samples, rel_err=err, timing=how, layout=layout, op="[M, N] product")


def _cublas_torch(lhs, rhs) -> dict:
    import torch

    a, b = torch.from_dlpack(lhs), torch.from_dlpack(rhs)[0]
    samples, how = torch_timing.time_torch(lambda: torch.matmul(a, b))
    return _summary(samples, timing=how)


def dev_ratios(record: dict) -> dict[str, float | None]:
    """The targets' ratios for one case: the heuristic against the best moetune config measured (out of
    the box within 15%), the faster peer (torch or tokamax) over the best moetune time, cuBLAS's
    same-FLOP time over it, and the HBM roofline over it."""
    ms = {name: m.get("median_ms") for name, m in record["methods"].items()}
    ours = [v for k, v in ms.items() if k.startswith("moetune_") and v]
    best = min(ours) if ours else None
    peers = [ms[k] for k in ("torch_grouped_mm", "tokamax_mosaic") if ms.get(k)]
    heuristic = ms.get("moetune_heuristic")
    return {
        "best_ms": best,
        "heuristic_vs_best": heuristic / best if heuristic and best else None,
        "peer_vs_best": min(peers) / best if peers and best else None,
        "cublas_vs_best": ms["cublas_torch"] / best if ms.get("cublas_torch") and best else None,
        "roofline_vs_best": record["hbm_roofline_ms"] / best if best else None,
    }


def print_dev_table(records: list[dict]) -> None:
    print(
        f"\n{'case':36s} {'heur':>8s} {'best':>8s} {'torch':>8s} {'tokamax':>8s} {'xla':>8s} {'cuBLAS':>8s}"
        f" {'roof':>8s} {'h/best':>7s} {'peer/b':>7s} {'%cuBL':>6s} {'%roof':>6s}"
    )
    for r in records:
        ms = {k: v.get("median_ms") for k, v in r["methods"].items()}
        q = dev_ratios(r)
        cells = [
            ms.get("moetune_heuristic"),
            q["best_ms"],
            ms.get("torch_grouped_mm"),
            ms.get("tokamax_mosaic"),
        ]
        cells += [ms.get("xla_ragged_dot"), ms.get("cublas_torch"), r["hbm_roofline_ms"]]
        text = " ".join(f"{v:8.3f}" if v else f"{'-':>8s}" for v in cells)
        fmt = lambda v, pct=False: (f"{v * 100:6.1f}" if pct else f"{v:6.3f}x") if v else "     -"  # noqa: E731
        tail = f"{fmt(q['heuristic_vs_best'])} {fmt(q['peer_vs_best'])} {fmt(q['cublas_vs_best'], True)}"
        print(f"{r['case']:36s} {text} {tail} {fmt(q['roofline_vs_best'], True)}")


def run_dev(args, tuned: dict) -> int:
    """The development-shape benchmark (--models); writes the JSON to --out as cases finish."""
    cases = dev_shapes.cases(args.models.split(","), tuple(map(int, args.dev_tokens.split(","))))
    deadline = time.monotonic() + args.budget_s
    payload = {"environment": moe_shapes.environment(), "cases": []}
    payload["bandwidth"] = bandwidth = measure_bandwidth()
    print(f"bandwidth: {bandwidth}", flush=True)
    runner = DevRunner(cases, deadline, bandwidth, tuned, args.workers)
    runner.submit_all()
    try:
        for case in cases:
            if time.monotonic() > deadline:
                payload["cases"].append({"case": case.name, "skipped": "budget spent", "methods": {}})
                continue
            try:
                record = runner.run(case)
            except Exception as e:  # inputs or the reference failed: the case is a record
                record = {"case": case.name, "error": f"{type(e).__name__}: {e}"[:1000], "methods": {}}
            payload["cases"].append(record)
            moe_shapes.write_json(args.out, payload)
            brief = {k: round(v["median_ms"], 3) for k, v in record["methods"].items() if "median_ms" in v}
            print(f"{case.name}: {brief}", flush=True)
    finally:
        runner.pool.shutdown(wait=False, cancel_futures=True)
        moe_shapes.write_json(args.out, payload)
    print_dev_table([r for r in payload["cases"] if "hbm_roofline_ms" in r])
    return 0


def compile_times(args) -> int:
    """Wall time of lowering and compiling one candidate at a time (nothing else compiling), for the
    heuristic and the cost model's next seeds of each case, and the walk schedule beside the heuristic's
    table where the space has no walk (compile time grows with G there)."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    from moetune.kernels import registry
    from moetune.kernels.backends.mosaic_gpu import space
    from moetune.kernels.device import current_fingerprint

    backend, device = registry.get("mosaic_gpu"), current_fingerprint()
    deadline = time.monotonic() + args.budget_s
    rows = []
    for case in dev_shapes.cases(args.models.split(","), tuple(map(int, args.dev_tokens.split(",")))):
        p = case.problem
        abstract = (
            jax.ShapeDtypeStruct((p.m, p.k), jnp.bfloat16),
            jax.ShapeDtypeStruct(p.rhs_shape, jnp.bfloat16),
            jax.ShapeDtypeStruct((p.g,), jnp.int32),
        )
        configs = {f"seed{i}": c for i, c in enumerate(space.preferred(p, device)[: 1 + DEV_ALTERNATIVES])}
        if configs["seed0"].tile_schedule == "table":
            configs["seed0_walk"] = dataclasses.replace(configs["seed0"], tile_schedule="walk")
        for name, config in configs.items():
            if time.monotonic() > deadline:
                rows.append({"case": case.name, "name": name, "error": "skipped: budget spent"})
                continue
            row = {"case": case.name, "name": name, "g": p.g, "config": config.to_dict()}
            try:
                # build() checks validity only: past 64 experts the walk is pruned, not refused.
                kernel = backend.build(p, config)
                start = time.monotonic()
                lowered = jax.jit(kernel).lower(*abstract)
                row["lower_s"] = round(time.monotonic() - start, 2)
                lowered.compile()
                row["lower_and_compile_s"] = round(time.monotonic() - start, 2)
            except Exception as e:  # a failed compile is a row of its own
                row["error"] = f"{type(e).__name__}: {e}"[:500]
            rows.append(row)
            print(json.dumps(row), flush=True)
    moe_shapes.write_json(args.out, {"environment": moe_shapes.environment(), "compiles": rows})
    print(f"\n{'case':36s} {'candidate':12s} {'lower s':>8s} {'compile s':>10s}")
    for row in rows:
        lower, both = row.get("lower_s", "-"), row.get("lower_and_compile_s", "-")
        print(f"{row['case']:36s} {row['name']:12s} {lower:>8} {both:>10}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=400.0)
    parser.add_argument("--tokens", default=",".join(map(str, moe_shapes.TOKENS)))
    parser.add_argument("--projs", default="gate_up,down")
    parser.add_argument("--routings", default=",".join(moe_shapes.ROUTINGS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--candidates", help="JSON {regime: [config dicts]} replacing the built-in lists")
    parser.add_argument(
        "--pack",
        default=str(moe_shapes.SHIPPED_PACK),
        help="tuned pack whose winner for each shape moetune tries first ('' for none)",
    )
    parser.add_argument("--no-mgpu-sweep", action="store_true", help="mgpu_best tries the default only")
    parser.add_argument(
        "--mgpu-sweep",
        choices=tuple(MGPU_SWEEPS),
        default="full",
        help="mgpu_best's configs beside the default: 20 (full: its best of its own sweep) or 2",
    )
    parser.add_argument("--mgpu-sweep-min-tokens", type=int, default=1, help="smaller T: default only")
    parser.add_argument(
        "--models",
        help=f"development models (comma-separated; {', '.join(dev_shapes.MODELS)}): their GEMMs at "
        "--dev-tokens instead of the Mixtral cases above",
    )
    parser.add_argument("--dev-tokens", default=",".join(map(str, dev_shapes.TOKENS)))
    parser.add_argument("--workers", type=int, default=DEV_COMPILE_WORKERS, help="compile threads (--models)")
    parser.add_argument(
        "--compile-times", action="store_true", help="with --models: time compiling candidates, one at a time"
    )
    args = parser.parse_args()
    if args.models:
        unknown = sorted(set(args.models.split(",")) - set(dev_shapes.MODELS))
        if unknown:
            parser.error(f"unknown models {unknown}; known: {', '.join(dev_shapes.MODELS)}")
        if args.compile_times:
            return compile_times(args)
        return run_dev(args, pack_winners(args.pack) if args.pack else {})

    candidates = CANDIDATES
    if args.candidates:
        with open(args.candidates) as f:
            candidates = {r: [C.from_dict(c) for c in cs] for r, cs in json.load(f).items()}
    tuned = pack_winners(args.pack) if args.pack else {}
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
    deadline = time.monotonic() + args.budget_s
    payload = {
        "environment": moe_shapes.environment(),
        "candidates": {r: [c.to_dict() for c in cs] for r, cs in candidates.items()},
        "pack": args.pack or None,
        "mgpu_default": MGPU_DEFAULT,
        "mgpu_sweep": [] if args.no_mgpu_sweep else MGPU_SWEEPS[args.mgpu_sweep],
        "cases": [],
    }
    payload["bandwidth"] = bandwidth = measure_bandwidth()
    print(f"bandwidth: {bandwidth}", flush=True)
    try:
        for proj in args.projs.split(","):
            runner = Runner(
                proj, deadline, candidates, payload["mgpu_sweep"], args.mgpu_sweep_min_tokens, tuned
            )
            for tokens in map(int, args.tokens.split(",")):
                for routing in args.routings.split(","):
                    case = run_case(runner, Shape(proj, tokens), routing, methods, bandwidth)
                    payload["cases"].append(case)
                    moe_shapes.write_json(args.out, payload)
                    brief = {
                        k: round(v["median_ms"], 3) for k, v in case["methods"].items() if "median_ms" in v
                    }
                    print(f"{case['shape']} {routing}: {brief}", flush=True)
            del runner
    finally:
        moe_shapes.write_json(args.out, payload)
    print_table(payload["cases"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
