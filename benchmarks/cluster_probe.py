"""Does TMA multicast across a 2-CTA cluster speed up a compute-bound Hopper GEMM on this GPU?

JAX's own dense Hopper matmul (pallas/ops/gpu/hopper_matmul_mgpu) takes a `cluster_dimension`: with M,
two CTAs of a cluster share each weight tile (one TMA multicast instead of two loads from L2); with N
they share each lhs tile. This times it with no cluster, M and N on Mixtral-8x7B's dense-equivalent
GEMMs at T=4096 (gate_up 8192x4096 @ 4096x28672, down 8192x14336 @ 14336x4096) beside cuBLAS (jnp.dot),
CUPTI kernel time, median of --runs. It decides whether the grouped kernel should grow a cluster option.

    python3 benchmarks/cluster_probe.py --out $OUT/cluster_probe.json

hopper_matmul_mgpu imports jax's test utilities, which need absl-py: bundle it for the GPU machine with
`../shared/tools/device-bundle absl-py`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
import traceback

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

SHAPES = {"gate_up": (8192, 4096, 28672), "down": (8192, 14336, 4096)}


def _median_ms(fn, *args, runs: int) -> tuple[float, list[float]]:
    _, per_run = profiler.measure(fn, aggregate=True, iterations=runs)(*args)
    return statistics.median(per_run), list(per_run)


def _hopper_matmul():
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu  # needs absl-py (see above)

    return hopper_matmul_mgpu


def _configs():
    hm = _hopper_matmul()
    dims = hm.MatmulDimension
    # CTA tile 128x256 (two 128x128 consumers along N) and 256x128 (along M): the shapes cuBLAS and
    # CUTLASS pick for bf16 on Hopper; 3 stages so that every one fits shared memory with its epilogue.
    for (tile_m, tile_n, wg), cluster, width in itertools.product(
        [(128, 128, dims.N), (128, 128, dims.M)], [None, dims.M, dims.N], [8]
    ):
        yield hm.TuningConfig(
            tile_m=tile_m,
            tile_n=tile_n,
            tile_k=64,
            max_concurrent_steps=3 if wg == dims.N else 4,
            grid_minor_dim=dims.M,
            grid_tile_width=width,
            wg_dimension=wg,
            cluster_dimension=cluster,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    hm = _hopper_matmul()
    rows = []
    for name, (m, k, n) in SHAPES.items():
        a = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
        b = jax.random.normal(jax.random.key(1), (k, n), jnp.bfloat16)
        ref = jnp.dot(a, b, preferred_element_type=jnp.float32)
        flops = 2 * m * n * k
        ms, samples = _median_ms(jax.jit(lambda x, y: jnp.dot(x, y)), a, b, runs=args.runs)
        rows.append({"shape": name, "method": "cublas_xla", "median_ms": ms, "samples_ms": samples})
        print(f"{name} cublas_xla {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
        for config in _configs():
            tag = f"{config.wg_dimension}-wg cluster={config.cluster_dimension}"
            tag += f" stages={config.max_concurrent_steps}"
            try:
                fn = jax.jit(lambda x, y, config=config: hm.matmul(x, y, None, config))
                out = fn(a, b)
                err = float(jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
                ms, samples = _median_ms(fn, a, b, runs=args.runs)
            except Exception as e:  # one config failing must not lose the others' numbers
                traceback.print_exc()
                rows.append({"shape": name, "method": "hopper_matmul", "config": tag, "error": repr(e)[:500]})
                continue
            rows.append(
                {"shape": name, "method": "hopper_matmul", "config": tag, "median_ms": ms,
                 "samples_ms": samples, "rel_err": err}
            )  # fmt: skip
            print(f"{name} {tag}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s err {err:.1e}", flush=True)
    env = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device_kind": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "command": "python3 benchmarks/cluster_probe.py --out $OUT/cluster_probe.json",
    }
    with open(args.out, "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
