"""Check and time many mosaic_gpu variants in one GPU-machine call (device time is scarce).

For every case (Mixtral shape, routing) and every config of the chosen preset: build through the backend
(so the search-space constraints decide), compile, compare with jax.lax.ragged_dot in float32 on the
device (relative error, NaN, zero tail), then time with CUPTI (median of 10). One line per variant is
printed; the full record goes to --out as JSON. Work stops cleanly once --budget-s is spent.

    python3 lab/bench/device_kernel_check.py --preset sweep --out $OUT/check.json --budget-s 300
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback

from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C
from moetune_lab.bench import moe_shapes
from moetune_lab.bench.moe_shapes import Shape

PLAIN = dict(warp_specialized=False, wg_split="none")

PREFILL = [
    C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n"),
    C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n", grid_minor_dim="n"),
    C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n", grid_tile_width=16),
    C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n", grid_tile_width=4),
    C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n", persistent=False),
    C(block_m=64, block_n=256, block_k=64, max_concurrent_steps=4, wg_split="m"),
    C(block_m=64, block_n=256, block_k=64, max_concurrent_steps=4, wg_split="m", grid_minor_dim="n"),
    C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="m"),
    C(block_m=128, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="n"),
    C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=3, wg_split="n"),
    C(block_m=128, block_n=64, block_k=64, max_concurrent_steps=6, wg_split="n"),
    C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=6, wg_split="none"),
    C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, **PLAIN),
]
DECODE = [
    C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n"),
    C(block_m=64, block_n=64, block_k=128, max_concurrent_steps=4, wg_split="n"),
    C(block_m=64, block_n=128, block_k=128, max_concurrent_steps=3, **PLAIN),
    C(block_m=64, block_n=256, block_k=64, max_concurrent_steps=4, **PLAIN),
    C(block_m=64, block_n=128, block_k=128, max_concurrent_steps=4, wg_split="none"),
    C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n", persistent=False),
    C(block_m=64, block_n=64, block_k=128, max_concurrent_steps=6, **PLAIN),
    C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=6, wg_split="n"),
]
SPLIT_K = [
    C(block_m=64, block_n=64, block_k=128, max_concurrent_steps=4, wg_split="n", epi_tile_n=32, split_k=2),
    C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n", epi_tile_n=32, split_k=2),
]

PRESETS = {
    # (projection, tokens, configs): the regimes whose best configs seed bench_gemm.py's small sweeps.
    "sweep": [
        ("gate_up", 4096, PREFILL),
        ("down", 4096, [PREFILL[i] for i in (0, 1, 4, 5, 7, 8, 10, 12)]),
        ("gate_up", 16, DECODE),
        ("down", 16, DECODE),
        ("gate_up", 1, [DECODE[i] for i in (0, 1, 2, 4)]),
        ("down", 1, [DECODE[i] for i in (0, 1, 2, 4)] + SPLIT_K),
        ("gate_up", 512, [DECODE[0], PREFILL[0], PREFILL[5], PREFILL[10]]),
    ],
    "smoke": [("gate_up", 16, DECODE[:2]), ("down", 4096, PREFILL[:1])],
}


def _relative_error_on_device(out, ref) -> float:
    import jax.numpy as jnp

    diff = jnp.linalg.norm((out.astype(jnp.float32) - ref).ravel())
    norm = jnp.linalg.norm(ref.ravel())
    return float(diff / norm) if float(norm) > 0 else float(diff)


def time_jax(fn, args, runs: int = 10) -> list[float]:
    """CUPTI kernel time per call in seconds: the CuptiTimer method for one large argument set."""
    from jax.experimental.mosaic.gpu import profiler

    _, timings_ms = profiler.measure(fn, iterations=runs)(*args)
    if timings_ms is None:
        raise RuntimeError("no kernel ran")
    return [t * 1e-3 for t in (timings_ms if isinstance(timings_ms, list) else [timings_ms])]


def check_case(proj, tokens, configs, weights, deadline, records) -> None:
    import jax
    import jax.numpy as jnp

    from moetune.kernels import registry
    from moetune.kernels.errors import ConfigInvalid, ResourceExceeded
    from moetune.kernels.problem import Problem
    from moetune.kernels.reference import reference_grouped_matmul

    shape = Shape(proj, tokens)
    lhs = moe_shapes.make_lhs(shape)
    problem = Problem("grouped_matmul", m=shape.m, k=shape.k, n=shape.n, g=moe_shapes.EXPERTS)
    backend = registry.get("mosaic_gpu")
    routings = {r: jnp.asarray(moe_shapes.group_sizes(shape, r), jnp.int32) for r in moe_shapes.ROUTINGS}
    refs = {
        r: jax.block_until_ready(reference_grouped_matmul(lhs, weights, gs)) for r, gs in routings.items()
    }
    for config in configs:
        if time.monotonic() > deadline:
            records.append({"case": shape.name, "config": config.to_dict(), "status": "skipped_budget"})
            continue
        record = {"case": shape.name, "config": config.to_dict(), "m": shape.m, "k": shape.k, "n": shape.n}
        try:
            fn = backend.build(problem, config)
        except (ConfigInvalid, ResourceExceeded) as e:
            record.update(status="pruned", error=str(e))
            records.append(record)
            print(f"{shape.name:14s} PRUNED {config}: {e}", flush=True)
            continue
        try:
            jitted = jax.jit(fn)
            start = time.perf_counter()
            compiled = jitted.lower(lhs, weights, routings["balanced"]).compile()
            record["compile_s"] = time.perf_counter() - start
            for routing, gs in routings.items():
                jax.block_until_ready(jnp.full((shape.m, shape.n), jnp.nan, jnp.bfloat16)).delete()
                out = jax.block_until_ready(compiled(lhs, weights, gs))
                finite = bool(jnp.isfinite(out).all())
                err = _relative_error_on_device(out, refs[routing])
                samples = time_jax(compiled, (lhs, weights, gs))
                med = statistics.median(samples)
                record[routing] = {
                    "rel_err": err,
                    "finite": finite,
                    "ok": finite and err < 1e-2,
                    "median_ms": med * 1e3,
                    "min_ms": min(samples) * 1e3,
                    "max_ms": max(samples) * 1e3,
                    "tflops": shape.flops / med / 1e12,
                }
            record["status"] = "ok" if all(record[r]["ok"] for r in routings) else "wrong_result"
            b = record["balanced"]
            print(
                f"{shape.name:14s} {record['status']:12s} {b['median_ms']:9.3f} ms {b['tflops']:6.1f} TF/s "
                f"zipf {record['zipf']['median_ms']:9.3f} ms err {b['rel_err']:.1e} "
                f"compile {record['compile_s']:.1f}s {config}",
                flush=True,
            )
        except Exception as e:  # the edge where a failure becomes a record
            record.update(status="error", error=f"{type(e).__name__}: {e}"[:2000])
            record["traceback"] = traceback.format_exc()[-4000:]
            print(f"{shape.name:14s} ERROR {config}: {record['error'][:300]}", flush=True)
        records.append(record)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="sweep", choices=sorted(PRESETS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=300.0)
    args = parser.parse_args()

    deadline = time.monotonic() + args.budget_s
    records: list[dict] = []
    payload = {"environment": moe_shapes.environment(), "preset": args.preset, "records": records}
    weights = {}
    try:
        for proj, tokens, configs in PRESETS[args.preset]:
            if proj not in weights:
                weights[proj] = moe_shapes.make_weights(proj)
            check_case(proj, tokens, configs, weights[proj], deadline, records)
            moe_shapes.write_json(args.out, payload)
    finally:
        moe_shapes.write_json(args.out, payload)
    best: dict[str, dict] = {}
    for r in records:
        if r.get("status") != "ok":
            continue
        if r["case"] not in best or r["balanced"]["median_ms"] < best[r["case"]]["balanced"]["median_ms"]:
            best[r["case"]] = r
    print("\nbest per case (balanced routing):")
    for case, r in best.items():
        print(
            f"  {case:14s} {r['balanced']['median_ms']:9.3f} ms {r['balanced']['tflops']:6.1f} TF/s "
            f"{C.from_dict(r['config'])}"
        )
    bad = [r for r in records if r.get("status") in ("wrong_result", "error")]
    print(f"{len(records)} variants, {len(bad)} wrong or failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
