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

    python3 benchmarks/bench_gemm.py --out $OUT/bench.json --budget-s 400
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
import traceback

import moe_shapes
import torch_timing
from device_kernel_check import time_jax
from moe_shapes import Shape

from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C

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
    worth trying; the sweep's recorded time is not used)."""
    from moetune.kernels import packs

    return {e.problem.key: C.from_dict(e.config) for e in packs.load(path).entries}


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
    args = parser.parse_args()

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
