"""FP8 grouped GEMMs of the development shapes on one H200: moetune's mosaic_gpu FP8 kernel beside its
peers, per scale layout.

Per case (model, GEMM, T; dev_shapes.py) and scale layout it times, with CUPTI device time (median of
10, inputs rotating over routings that touch more than twice the L2 of weights):
  moetune_fp8_<layout>    the mosaic_gpu FP8 op (SwiGLU fused for gate_up) with the heuristic's config,
                          and at T >= 1024 the cost model's next two tile shapes; under block scales
                          also the heuristic's tiles at one scale block per K step, and its config
                          with its two consumers staggered (lockstep, where it staggers them); the
                          best counts
  block_tiles_per_channel the block-scale heuristic's config on the row_channel data (T >= 1024): the
                          same tiles without the per-block promotion
  torch_scaled_grouped_mm torch._scaled_grouped_mm, FP8 rowwise (per-token x per-channel scales), on the
                          row_channel layout's data: the [M, N] product (no fused activation)
  moetune_bf16            moetune's bf16 op as a user gets it (the shipped pack, else the heuristic)
  torch_grouped_mm        torch._grouped_mm in bf16, the [M, N] product
  cublas_fp8              torch._scaled_mm on a dense [M, K] x [K, N] of the same FLOPs (T >= 1024)
and derives TF/s and, for the FP8 weights the routing touches, the HBM roofline. Each moetune FP8 result
is checked on up to 8 of its experts against the float32 product of the dequantized operands (the op
spec's tolerance, 8e-3). FP8 weights are the bf16 weights quantized in each layout, as [G, N, K] (Hopper's
8-bit wgmma reads K-major operands). One JSON record per case goes to --out as soon as it is done.

    python3 lab/bench/bench_fp8.py --models deepseek-v3,mixtral-8x7b --out $OUT/fp8.json --budget-s 400
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import time
import traceback

from moetune_lab.baselines.entries import (
    BLOCK_TILES_PER_CHANNEL,  # not a moetune_fp8_<layout>_ method: no layout's own
    BLOCK_VARIANTS,
)
from moetune_lab.bench import dev_shapes, moe_shapes, torch_timing
from moetune_lab.bench.bench_gemm import _summary

LAYOUTS = ("row_channel", "block_1x128_128x128")
ALTERNATIVES_MIN_TOKENS = 1024
CHECK_EXPERTS = 8
MAX_STEPS = 8  # the deepest pipeline the Mosaic GPU config accepts


def fp8_problem(case, layout: str):
    import dataclasses

    bf16 = case.problem
    op = bf16.op + "_fp8"
    return dataclasses.replace(
        bf16, op=op, lhs_dtype="float8_e4m3fn", rhs_dtype="float8_e4m3fn", transpose_rhs=True,
        scale_layout=layout,
    )  # fmt: skip


class Runner:
    def __init__(self, deadline: float, read_GBps: float, skip_variants=()):
        from moetune.kernels import registry
        from moetune.kernels.backends.mosaic_gpu import timer
        from moetune.kernels.device import current_fingerprint

        self.deadline, self.read_GBps = deadline, read_GBps
        self.skip_variants = frozenset(skip_variants)
        self.backend = registry.get("mosaic_gpu")
        self.device = current_fingerprint()
        self.l2_bytes = timer.device_l2_bytes()
        self.timer = timer.CuptiTimer(min_rotation_bytes=0)
        self.pair = None  # ((model, gemm), bf16 weights [G, K, N], {layout: (FP8 [G, N, K], scale)})

    def weights(self, case):
        import jax
        import jax.numpy as jnp

        from moetune.kernels.ops import fp8_scales

        key = (case.model.name, case.gemm)
        if self.pair is None or self.pair[0] != key:
            self.pair = None
            p = case.problem
            w = jax.random.normal(jax.random.key(0), p.rhs_shape, jnp.bfloat16) * jnp.bfloat16(p.k**-0.5)
            quantized = {}
            for layout in LAYOUTS:
                fp = fp8_problem(case, layout)
                block = fp8_scales.block_shape(fp, "rhs")
                quantized[layout] = jax.jit(
                    lambda w, block=block: fp8_scales.quantize(
                        jnp.swapaxes(w, 1, 2), block, jnp.float8_e4m3fn
                    )
                )(w)
            self.pair = (key, *jax.block_until_ready((w, quantized)))
        return self.pair[1], self.pair[2]

    def guarded(self, methods: dict, name: str, fn) -> None:
        if time.monotonic() > self.deadline:
            methods[name] = {"error": "skipped: budget spent"}
            return
        start = time.monotonic()
        try:
            methods[name] = fn()
        except Exception as e:  # one failed method is a record, not a lost run
            methods[name] = {
                "error": f"{type(e).__name__}: {e}"[:800],
                "traceback": traceback.format_exc()[-1200:],
            }
        methods[name]["wall_s"] = round(time.monotonic() - start, 2)

    def run(self, case, layouts) -> dict:
        import jax
        import jax.numpy as jnp

        from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
        from moetune.kernels.ops import fp8_scales

        p = case.problem
        w, quantized = self.weights(case)
        lhs = jax.random.normal(jax.random.key(case.tokens), (p.m, p.k), jnp.bfloat16)
        routings = dev_shapes.routings(case, 2 * self.l2_bytes)
        sizes = [jnp.asarray(r, jnp.int32) for r in routings]
        touched = sum(1 for s in routings[0] if s)
        record = {
            "case": case.name, "model": case.model.name, "gemm": case.gemm, "tokens": case.tokens,
            "routings": len(routings), "touched_experts": touched, "flops": p.flops,
            "hbm_roofline_fp8_ms": touched * p.k * p.n / (self.read_GBps * 1e9) * 1e3, "methods": {},
        }  # fmt: skip
        methods = record["methods"]
        activations = {}
        for layout in layouts:
            fp = fp8_problem(case, layout)
            activations[layout] = jax.block_until_ready(
                fp8_scales.quantize(lhs, fp8_scales.block_shape(fp, "lhs"), jnp.float8_e4m3fn)
            )
            lhs_q, lhs_scale = activations[layout]
            w_q, w_scale = quantized[layout]
            sets = [(lhs_q, lhs_scale, w_q, w_scale, s) for s in sizes]
            for name, config in self.configs(fp, case.tokens).items():
                self.guarded(
                    methods,
                    f"moetune_fp8_{layout}_{name}",
                    lambda fp=fp, c=config, sets=sets: self.moetune(fp, c, sets),
                )
        block = methods.get("moetune_fp8_block_1x128_128x128_heuristic", {})
        if "config" in block and "row_channel" in activations and case.tokens >= ALTERNATIVES_MIN_TOKENS:
            # The block-scale heuristic's tiles on the per-channel data: what the promotion costs them.
            config = MosaicGpuConfig.from_dict(block["config"])
            fp = fp8_problem(case, "row_channel")
            sets = [(*activations["row_channel"], *quantized["row_channel"], s) for s in sizes]
            self.guarded(methods, BLOCK_TILES_PER_CHANNEL, lambda: self.moetune(fp, config, sets))
        self.guarded(methods, "moetune_bf16", lambda: self.moetune_bf16(case, lhs, w, sizes))
        if "row_channel" in activations:
            self.guarded(
                methods, "torch_scaled_grouped_mm",
                lambda: torch_scaled(activations["row_channel"], quantized["row_channel"], routings),
            )  # fmt: skip
        self.guarded(methods, "torch_grouped_mm", lambda: torch_grouped(lhs, w, routings))
        if case.tokens >= ALTERNATIVES_MIN_TOKENS:
            self.guarded(methods, "cublas_fp8", lambda: cublas_fp8(p))
        record["ratios"] = ratios(record, layouts)
        return record

    def configs(self, problem, tokens: int) -> dict:
        from moetune.kernels.backends.mosaic_gpu import space

        named = {"heuristic": self.backend.heuristic(problem, self.device)}
        if tokens >= ALTERNATIVES_MIN_TOKENS:
            for i, config in enumerate(space.preferred(problem, self.device)[1:3]):
                named[f"alt{i + 1}"] = config
        search = space.space(problem, self.device)
        for name, variant in block_variants(problem, named["heuristic"]).items():
            if name not in self.skip_variants and search.violation(problem, variant, self.device) is None:
                named[name] = variant
        return named

    def moetune(self, problem, config, sets) -> dict:
        import jax

        fn = jax.jit(self.backend.build(problem, config))
        start = time.monotonic()
        out = jax.block_until_ready(fn(*sets[0]))
        compile_s = time.monotonic() - start
        err = check(problem, out, *sets[0])
        if not err < 8e-3:
            raise RuntimeError(f"relative error {err:.3e} against the dequantized float32 product")
        samples = self.timer.time(fn, sets)
        return _summary(samples, config=config.to_dict(), rel_err=err, compile_s=round(compile_s, 2))

    def moetune_bf16(self, case, lhs, w, sizes) -> dict:
        import jax

        import moetune.kernels as mk

        swiglu = case.gemm == "gate_up"
        call = mk.grouped_matmul_swiglu if swiglu else mk.grouped_matmul
        fn = jax.jit(lambda a, b, s: call(a, b, s))
        jax.block_until_ready(fn(lhs, w, sizes[0]))
        samples = self.timer.time(fn, [(lhs, w, s) for s in sizes])
        return _summary(samples, path=mk.explain(case.problem).backend)


def block_variants(problem, config) -> dict:
    """Under block scales, variants of the heuristic's config (entries.BLOCK_VARIANTS), each a pair with
    it that isolates one cost: `one_block_steps` its tiles with K steps of one scale block (twice the
    stages, the same shared memory, up to the pipeline's deepest), what one wgmma wait per two blocks is
    worth; `staggered` its two consumers taking turns at the tensor cores (`lockstep` not, where the
    heuristic staggers them), what hiding one's promotion under the other's wgmmas is worth."""
    import dataclasses

    from moetune.kernels.backends.mosaic_gpu import tiling

    out = {}
    if tiling.scale_blocks(problem, config) == 2:
        steps = min(2 * config.max_concurrent_steps, MAX_STEPS)
        out["one_block_steps"] = dataclasses.replace(
            config, block_k=tiling.SCALE_BLOCK, max_concurrent_steps=steps
        )
    if problem.scale_layout == tiling.BLOCK_SCALE_LAYOUT and config.consumers == 2:
        other = "lockstep" if config.stagger_consumers else "staggered"
        out[other] = dataclasses.replace(config, stagger_consumers=not config.stagger_consumers)
    return out


def check(problem, out, lhs_q, lhs_scale, w_q, w_scale, group_sizes) -> float:
    """Relative error of `out` on up to CHECK_EXPERTS experts with rows (spread over the experts)
    against the float32 product of their dequantized rows and weights. One compiled program serves every
    expert: each reads a window of the largest picked expert's row count, its foreign rows masked."""
    import numpy as np

    sizes = np.asarray(group_sizes)
    ends = np.cumsum(sizes)
    live = [int(e) for e in np.flatnonzero(sizes)]
    picks = live[:: max(1, len(live) // CHECK_EXPERTS)][:CHECK_EXPERTS]
    window = int(max((sizes[e] for e in picks), default=0))
    if not window:
        return 0.0
    gated = problem.spec.rhs_columns_per_out_column == 2
    num = den = 0.0
    for e in picks:
        first = int(ends[e] - sizes[e])
        start = min(first, out.shape[0] - window)
        bounds = np.asarray([first - start, first - start + int(sizes[e])], np.int32)
        err, ref = _expert_parts()(out, lhs_q, lhs_scale, w_q, w_scale, start, e, bounds, window, gated)
        num, den = num + float(err), den + float(ref)
    return (num / den) ** 0.5 if den else 0.0


@functools.cache
def _expert_parts():
    """(squared error, squared reference) of an expert's rows [start + bounds[0], start + bounds[1]),
    read through a window of `window` rows from `start`: one program for every expert of a case."""
    import jax
    import jax.numpy as jnp

    from moetune.kernels.ops import fp8_scales

    @functools.partial(jax.jit, static_argnums=(8, 9))
    def parts(out, lhs_q, lhs_scale, w_q, w_scale, start, expert, bounds, window, gated):
        per_row = lhs_scale.shape[0] != 1
        a = fp8_scales.dequantize(
            jax.lax.dynamic_slice_in_dim(lhs_q, start, window),
            jax.lax.dynamic_slice_in_dim(lhs_scale, start, window) if per_row else lhs_scale,
        )
        w = fp8_scales.dequantize(
            jax.lax.dynamic_index_in_dim(w_q, expert, keepdims=False),
            jax.lax.dynamic_index_in_dim(w_scale, expert, keepdims=False),
        )
        ref = jnp.dot(a, w.T, precision=jax.lax.Precision.HIGHEST)
        if gated:
            gate, up = jnp.split(ref, 2, axis=-1)
            ref = jax.nn.silu(gate) * up
        got = jax.lax.dynamic_slice_in_dim(out, start, window).astype(jnp.float32)
        row = jnp.arange(window)[:, None]
        mine = (row >= bounds[0]) & (row < bounds[1])
        return jnp.sum(jnp.where(mine, got - ref, 0) ** 2), jnp.sum(jnp.where(mine, ref, 0) ** 2)

    return parts


def _offsets(routings):
    import torch

    return [torch.tensor(s, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32) for s in routings]


def torch_scaled(activations, weights, routings) -> dict:
    """torch._scaled_grouped_mm rowwise on the row_channel data: a [M, K] FP8 with per-token scales,
    b [G, K, N] (the K-major [G, N, K] weights viewed transposed) with per-channel scales."""
    import torch

    a, scale_a = (torch.from_dlpack(x) for x in activations)
    w, scale_w = (torch.from_dlpack(x) for x in weights)
    b, scale_a, scale_b = w.transpose(1, 2), scale_a.reshape(-1), scale_w.reshape(w.shape[0], -1)
    cycle = itertools.cycle(_offsets(routings))

    def call():
        return torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=next(cycle), out_dtype=torch.bfloat16)

    samples, how = torch_timing.time_torch(call)
    return _summary(samples, timing=how, op="[M, N] product")


def torch_grouped(lhs, w, routings) -> dict:
    import torch

    a, b = torch.from_dlpack(lhs), torch.from_dlpack(w)
    cycle = itertools.cycle(_offsets(routings))
    samples, how = torch_timing.time_torch(lambda: torch._grouped_mm(a, b, offs=next(cycle)))
    return _summary(samples, timing=how, op="[M, N] product")


def cublas_fp8(problem) -> dict:
    """A dense FP8 GEMM of the problem's FLOPs: [M, K] x [K, N] (cuBLAS through torch._scaled_mm)."""
    import torch

    a = torch.randn(problem.m, problem.k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(problem.n, problem.k, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    samples, how = torch_timing.time_torch(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))
    return _summary(samples, timing=how)


def ratios(record: dict, layouts) -> dict:
    """Per layout: the best moetune FP8 time, its TF/s, and the peers' times over it."""
    ms = {k: v.get("median_ms") for k, v in record["methods"].items()}
    out = {}
    for layout in layouts:
        ours = [v for k, v in ms.items() if k.startswith(f"moetune_fp8_{layout}_") and v]
        if not ours:
            continue
        best = min(ours)
        entry = {"best_ms": best, "tflops": record["flops"] / best / 1e9}
        for peer in ("torch_scaled_grouped_mm", "moetune_bf16", "torch_grouped_mm", "cublas_fp8"):
            if ms.get(peer):
                entry[f"{peer}_over_moetune"] = ms[peer] / best
        entry["hbm_roofline_share"] = record["hbm_roofline_fp8_ms"] / best
        out[layout] = entry
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="deepseek-v3,qwen3-30b-a3b,mixtral-8x7b")
    parser.add_argument("--tokens", default="4096,16384,1024,1,16,128")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--gemms", default=",".join(dev_shapes.GEMMS))
    parser.add_argument(
        "--skip-variants",
        default="",
        help=f"block-scale variants not to time (comma-separated: {', '.join(BLOCK_VARIANTS)}), "
        "e.g. a kernel whose GPU tests failed",
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=400)
    args = parser.parse_args()
    import bench_gemm

    deadline = time.monotonic() + args.budget_s
    layouts = tuple(args.layouts.split(","))
    gemms = args.gemms.split(",")
    skipped = [name for name in args.skip_variants.split(",") if name]
    unknown = [name for name in args.models.split(",") if name not in dev_shapes.MODELS]
    known = set(layouts) <= set(LAYOUTS) and set(gemms) <= set(dev_shapes.GEMMS)
    if unknown or not known or not set(skipped) <= set(BLOCK_VARIANTS):
        print(
            f"bench_fp8: unknown models {unknown}, layouts {layouts}, GEMMs {gemms} or variants {skipped}; "
            f"known: {', '.join(sorted(dev_shapes.MODELS))}; {', '.join(LAYOUTS)}; "
            f"{', '.join(dev_shapes.GEMMS)}; {', '.join(BLOCK_VARIANTS)}",
            file=sys.stderr,
        )
        return 2
    bandwidth = bench_gemm.measure_bandwidth()
    runner = Runner(deadline, bandwidth["read_GBps"], skipped)
    payload = {
        "environment": moe_shapes.environment(),
        "bandwidth": bandwidth,
        "layouts": layouts,
        "cases": [],
    }
    tokens = tuple(int(t) for t in args.tokens.split(","))
    for case in dev_shapes.cases(args.models.split(","), tokens):
        if case.gemm not in gemms:
            continue
        if time.monotonic() > deadline:
            break
        record = runner.run(case, layouts)
        payload["cases"].append(record)
        moe_shapes.write_json(args.out, payload)
        summary = "  ".join(
            f"{layout[:5]} {r['best_ms']:.4f} ms {r['tflops']:.0f} TF/s "
            f"vs torch-fp8 {r.get('torch_scaled_grouped_mm_over_moetune', float('nan')):.2f}x "
            f"vs bf16 {r.get('moetune_bf16_over_moetune', float('nan')):.2f}x "
            f"roof {r['hbm_roofline_share']:.0%}"
            for layout, r in record["ratios"].items()
        )
        print(f"{case.name:36s} {summary}", flush=True)
        for name, method in record["methods"].items():
            if "error" in method:
                print(f"    {name}: {method['error'][:300]}", flush=True)
    print(json.dumps({"cases": len(payload["cases"]), "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
