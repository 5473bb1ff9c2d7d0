"""The MoE weight gradient (grouped_matmul_drhs) on one GPU: moetune's Mosaic GPU kernel against XLA's
ragged_dot_general and torch._grouped_mm's weight-gradient form (2-D x 2-D with offsets along the
contracted rows), on the development shapes of lab/bench/dev_shapes.py, timed in one process.

Per case (model, GEMM, T): lhs [T*k, K] and dout [T*k, N] in bf16 with uniform random top-k routing; the
gradient is [G, K, N] in bf16. moetune runs its heuristic config and the next best configs of its cost
model's ranking (`--ranked`) and any configs given with `--config`, so the table shows how far the
heuristic is from the best measured. Every
moetune result is checked against XLA's before it is timed, and compared with torch's. With
`--half-full`, each case also runs on a buffer twice as tall as its rows (sum(group_sizes) = M/2): the
kernel walks only the real rows, so its time should match the exact-M call's. With `--dlhs`, each case
also times the input gradient (dout @ rhs[g]^T: the forward op on the other weight layout, k and n
swapped) beside the forward op of the same m, k, n on the usual layout, both on their heuristic configs.

Kernel time comes from CUPTI (jax's profiler for JAX, lab/bench/torch_timing.py for torch), the
prologue's prefix sums included. Run: python lab/bench/bench_backward.py --out drhs.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

from moetune_lab.bench import dev_shapes, moe_shapes, torch_timing

DEFAULT_MODELS = ("mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b")
DEFAULT_TOKENS = (4096, 16384)
# XLA's ragged_dot_general for a ragged contraction may materialise [M, G, K]: skip it past this size.
XLA_MAX_DENSE_BYTES = 24 << 30


def time_jax(fn, args, runs: int) -> list[float]:
    """CUPTI seconds of each of `runs` calls, one call per measurement: measuring all runs at once keeps
    every run's output alive, and ten 15 GB gradients (DeepSeek-V3's) do not fit on one GPU."""
    from jax.experimental.mosaic.gpu import profiler

    samples = []
    for _ in range(runs):
        out, timings_ms = profiler.measure(fn, iterations=1)(*args)
        del out
        if timings_ms is None:
            raise RuntimeError("no kernel ran")
        samples.append(sum(timings_ms) * 1e-3 if isinstance(timings_ms, list) else timings_ms * 1e-3)
    return samples


def summary(samples: list[float], flops: int, **extra) -> dict:
    median = statistics.median(samples)
    return {
        "median_ms": median * 1e3,
        "tflops": flops / median / 1e12,
        "samples_ms": [s * 1e3 for s in samples],
        **extra,
    }


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float32, as one fused reduction (a 15 GB gradient has no room for
    float32 copies of itself)."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def norms(a, b):
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        return jnp.sum((a - b) ** 2), jnp.sum(b**2)

    diff, base = norms(out, ref)
    return float(jnp.sqrt(diff) / (jnp.sqrt(base) + 1e-30))


def operands(m: int, k: int, n: int, seed: int):
    import jax
    import jax.numpy as jnp

    kl, kd = jax.random.split(jax.random.key(seed))
    lhs = jax.random.normal(kl, (m, k), jnp.bfloat16)
    dout = (jax.random.normal(kd, (m, n), jnp.float32) * 0.05).astype(jnp.bfloat16)
    return lhs, dout


def cotangent(case: dev_shapes.Case, part: str, m: int | None = None):
    """The case's "dlhs" or "drhs" problem as training dispatches it (kernels.api.cotangent_problems of
    the case's forward problem), on `m` rows if given."""
    from moetune.kernels.api import cotangent_problems

    problem = dict(cotangent_problems(case.problem))[part]
    return problem if m is None else problem.with_m(m)


def xla_drhs(lhs, dout, sizes):
    import jax.numpy as jnp
    from jax import lax

    from moetune.kernels.ops.grouped_matmul_drhs import RAGGED_CONTRACTION

    out = lax.ragged_dot_general(lhs, dout, sizes, RAGGED_CONTRACTION, preferred_element_type=jnp.float32)
    return out.astype(jnp.bfloat16)


def torch_drhs(lhs, dout, sizes: list[int], flops: int, runs: int) -> tuple[dict, object]:
    import torch

    a = torch.from_dlpack(lhs).t()  # [K, M], column-major: the wgrad form's lhs^T
    b = torch.from_dlpack(dout)
    offs = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
    out = torch._grouped_mm(a, b, offs=offs)
    samples, how = torch_timing.time_torch(lambda: torch._grouped_mm(a, b, offs=offs), runs=runs)
    return summary(samples, flops, timing=how), out


def run_case(case, args, records: list[dict]) -> None:
    import jax
    import jax.numpy as jnp

    from moetune.kernels import registry
    from moetune.kernels.backends.mosaic_gpu import space_drhs as space
    from moetune.kernels.device import current_fingerprint

    backend, device = registry.get("mosaic_gpu"), current_fingerprint()
    m = case.tokens * case.model.top_k
    problem = cotangent(case, "drhs", m)
    sizes = dev_shapes.top_k_group_sizes(case, seed=0)
    lhs, dout = operands(m, problem.k, problem.n, seed=case.tokens)
    gs = jnp.asarray(sizes, jnp.int32)
    record = {"case": case.name, "problem": problem.key, "m": m, "k": problem.k, "n": problem.n,
              "g": problem.g, "flops": problem.flops, "methods": {}}  # fmt: skip
    methods = record["methods"]

    ref = None
    dense_bytes = m * problem.g * max(problem.k, problem.n) * 2
    if dense_bytes <= XLA_MAX_DENSE_BYTES:
        try:
            fn = jax.jit(xla_drhs)
            ref = jax.block_until_ready(fn(lhs, dout, gs))
            methods["xla_ragged_dot"] = summary(time_jax(fn, (lhs, dout, gs), args.runs), problem.flops)
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
            methods["xla_ragged_dot"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    else:
        methods["xla_ragged_dot"] = {"skipped": f"would materialise ~{dense_bytes >> 30} GiB"}
    torch_ref = None
    try:
        methods["torch_grouped_mm"], torch_out = torch_drhs(lhs, dout, sizes, problem.flops, args.runs)
        torch_ref = jax.dlpack.from_dlpack(torch_out.contiguous())
        if ref is not None:
            methods["torch_grouped_mm"]["rel_err"] = rel_err(torch_ref, ref)
        del torch_out
    except Exception as e:  # noqa: BLE001
        methods["torch_grouped_mm"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}

    heuristic = backend.heuristic(problem, device)
    ranked = [c for c, _ in space.ranking(problem, device)]
    configs = {"heuristic": heuristic}
    for i, config in enumerate(c for c in ranked if c != heuristic):
        if i >= args.ranked:
            break
        configs[f"ranked{i + 2}"] = config
    for i, fields in enumerate(args.config):
        configs[f"config{i + 1}"] = dataclasses.replace(heuristic, **fields)
    for label, config in configs.items():
        entry = {"config": config.to_dict()}
        try:
            start = time.perf_counter()
            fn = jax.jit(backend.build(problem, config)).lower(lhs, dout, gs).compile()
            entry["compile_s"] = time.perf_counter() - start
            out = jax.block_until_ready(fn(lhs, dout, gs))
            if ref is not None:
                entry["rel_err"] = rel_err(out, ref)
                if not entry["rel_err"] < 2e-2:
                    raise RuntimeError(f"relative error {entry['rel_err']:.3e}")
            if torch_ref is not None:
                entry["rel_err_torch"] = rel_err(out, torch_ref)
            del out
            entry |= summary(time_jax(fn, (lhs, dout, gs), args.runs), problem.flops)
        except Exception as e:  # noqa: BLE001
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        methods[f"moetune_{label}"] = entry
    del ref, torch_ref, lhs, dout
    if args.half_full:
        methods["moetune_half_full"] = half_full(case, backend, device, args)
    if args.dlhs:
        methods["moetune_dlhs"] = dlhs_beside_forward(case, backend, device, sizes, args)
    records.append(record)
    print_record(record)


def half_full(case, backend, device, args) -> dict:
    """The heuristic config of the half-tokens problem, on its exact M and on a buffer of twice that
    (rows past sum(group_sizes) present but not walked)."""
    import jax
    import jax.numpy as jnp

    half_case = dev_shapes.Case(case.model, case.gemm, case.tokens // 2)
    m = half_case.tokens * case.model.top_k
    sizes = jnp.asarray(dev_shapes.top_k_group_sizes(half_case, seed=1), jnp.int32)
    out = {}
    for label, rows in (("exact", m), ("buffer_2x", 2 * m)):
        problem = cotangent(case, "drhs", rows)
        lhs, dout = operands(rows, problem.k, problem.n, seed=rows)
        config = backend.heuristic(cotangent(case, "drhs", m), device)
        try:
            fn = jax.jit(backend.build(problem, config)).lower(lhs, dout, sizes).compile()
            out[label] = summary(time_jax(fn, (lhs, dout, sizes), args.runs), problem.flops, rows=rows)
        except Exception as e:  # noqa: BLE001
            out[label] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        del lhs, dout
    if "median_ms" in out.get("exact", {}) and "median_ms" in out.get("buffer_2x", {}):
        out["buffer_over_exact"] = out["buffer_2x"]["median_ms"] / out["exact"]["median_ms"]
    return out


def dlhs_beside_forward(case, backend, device, sizes: list[int], args) -> dict:
    """The input gradient of the case's forward GEMM (its cotangent problem "dlhs") and the forward op of
    the same shape on the [G, K, N] layout, each on its heuristic config, checked against XLA's
    ragged_dot and timed."""
    import jax
    import jax.numpy as jnp

    from moetune.kernels import registry

    dlhs, xla = cotangent(case, "dlhs"), registry.get("xla")
    gs = jnp.asarray(sizes, jnp.int32)
    out = {"dlhs_problem": dlhs.key}
    for label, problem in (("dlhs", dlhs), ("forward", dataclasses.replace(dlhs, transpose_rhs=False))):
        kx, kw = jax.random.split(jax.random.key(problem.k))
        x = jax.random.normal(kx, (problem.m, problem.k), jnp.bfloat16)
        w = (jax.random.normal(kw, problem.rhs_shape, jnp.float32) * problem.k**-0.5).astype(jnp.bfloat16)
        config = backend.heuristic(problem, device)
        entry = {"config": config.to_dict()}
        try:
            fn = jax.jit(backend.build(problem, config)).lower(x, w, gs).compile()
            ref = jax.jit(xla.build(problem, xla.heuristic(problem, device)))(x, w, gs)
            entry["rel_err"] = rel_err(fn(x, w, gs), ref)
            del ref
            entry |= summary(time_jax(fn, (x, w, gs), args.runs), problem.flops)
        except Exception as e:  # noqa: BLE001
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        out[label] = entry
        del x, w
    if "median_ms" in out["dlhs"] and "median_ms" in out["forward"]:
        out["dlhs_over_forward"] = out["dlhs"]["median_ms"] / out["forward"]["median_ms"]
    return out


def print_record(record: dict) -> None:
    cells = []
    for name, entry in record["methods"].items():
        if "tflops" in entry:
            cells.append(f"{name} {entry['tflops']:.0f} TF/s ({entry['median_ms']:.3f} ms)")
        elif "buffer_over_exact" in entry:
            cells.append(f"{name} x{entry['buffer_over_exact']:.3f}")
        elif "dlhs_over_forward" in entry:
            dlhs, forward = entry["dlhs"]["tflops"], entry["forward"]["tflops"]
            cells.append(f"{name} {dlhs:.0f} TF/s, forward {forward:.0f} (x{entry['dlhs_over_forward']:.3f})")
        else:
            cells.append(f"{name} {entry.get('error') or entry.get('skipped') or entry}")
    print(f"{record['case']}: " + "; ".join(cells), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=list(DEFAULT_MODELS), choices=sorted(dev_shapes.MODELS)
    )
    parser.add_argument("--tokens", nargs="+", type=int, default=list(DEFAULT_TOKENS))
    parser.add_argument("--gemms", nargs="+", default=list(dev_shapes.GEMMS), choices=dev_shapes.GEMMS)
    parser.add_argument(
        "--ranked", type=int, default=3, help="configs of the cost model's ranking after the heuristic"
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        type=json.loads,
        help='a weight-gradient config to time beside the heuristic, as JSON ({"block_n": 256, ...}: the '
        "heuristic's other fields); repeatable",
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--half-full", action="store_true")
    parser.add_argument("--dlhs", action="store_true", help="also time dlhs beside the forward op")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    records: list[dict] = []
    cases = [
        dev_shapes.Case(dev_shapes.MODELS[m], gemm, t)
        for m in args.models
        for gemm in args.gemms
        for t in args.tokens
    ]
    for case in cases:
        try:
            run_case(case, args, records)
        except Exception as e:  # noqa: BLE001 - one case's failure (memory) leaves the others
            print(f"{case.name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            records.append({"case": case.name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        args.out.write_text(json.dumps({"environment": moe_shapes.environment(), "cases": records}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
