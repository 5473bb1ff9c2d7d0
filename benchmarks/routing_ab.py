"""Configs of one problem timed on several routings in one process: does the tuner's routing rank configs
as the model's routing does?

The tuner times every candidate on synthetic group sizes (`--routing balanced,zipf:1.2`: exactly M / G rows
per expert, and a skewed draw). The model's router gives near-balanced but ragged counts (930-1084 rows of
8192 per expert at T=4096), which `zipf:0` (a uniform multinomial draw) imitates. Each config's kernel is
built through the backend and CUPTI-timed (median of 10) on the same inputs under each routing's group sizes;
`--sizes` adds recorded ones (e.g. bench_model's rows_per_expert).

    python3 benchmarks/routing_ab.py --configs A.json,B.json --out ab.json \
        [--op grouped_matmul_swiglu --m 8192 --k 4096 --n 28672 --g 8] \
        [--routings balanced,zipf:0,zipf:1.2] [--draws 3] [--sizes 1031,1015,1084,996,1001,974,1049,1042]
A config file is a JSON object of MosaicGpuConfig fields, a pack entry ({"config": {...}, ...}), or a
pack (its entry for the problem).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from moetune.kernels.problem import Problem
from moetune.tuner.routing import parse_routings


def routing_draws(routings: str, m: int, g: int, draws: int, sizes: list[str]) -> dict[str, list[int]]:
    """Label -> group sizes: each routing's draws (seeds 0..draws-1; one for balanced), then --sizes."""
    out: dict[str, list[int]] = {}
    for routing in parse_routings(routings):
        for seed in range(1 if routing.kind == "balanced" else draws):
            label = str(routing) if routing.kind == "balanced" else f"{routing} seed {seed}"
            out[label] = [int(x) for x in routing.group_sizes(m, g, seed=seed)]
    for text in sizes:
        counts = [int(x) for x in text.split(",")]
        if len(counts) != g or sum(counts) > m or min(counts) < 0:
            raise SystemExit(f"--sizes {text}: need {g} non-negative counts summing to at most M={m}")
        out[f"sizes {text}"] = counts
    return out


def load_config(path: Path, problem: Problem) -> dict:
    """A config file's fields, or a pack's entry for `problem`."""
    data = json.loads(path.read_text())
    if "entries" in data:
        from moetune.kernels import packs

        entry = next((e for e in packs.load(path).entries if e.problem.key == problem.key), None)
        if entry is None:
            raise SystemExit(f"{path} has no entry for {problem.key}")
        return dict(entry.config)
    return data["config"] if "config" in data else data


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--configs", required=True, help="config JSON files, comma-separated")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--op", default="grouped_matmul_swiglu")
    parser.add_argument("--m", type=int, default=8192)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--n", type=int, default=28672)
    parser.add_argument("--g", type=int, default=8)
    parser.add_argument("--routings", default="balanced,zipf:0,zipf:1.2")
    parser.add_argument("--draws", type=int, default=3, help="draws of each random routing")
    parser.add_argument("--sizes", action="append", default=[], help="recorded group sizes, comma-separated")
    args = parser.parse_args()
    problem = Problem(args.op, m=args.m, k=args.k, n=args.n, g=args.g)
    draws = routing_draws(args.routings, args.m, args.g, args.draws, args.sizes)
    configs = {Path(p).name: load_config(Path(p), problem) for p in args.configs.split(",")}

    import jax
    import jax.numpy as jnp

    from moetune.kernels import registry
    from moetune.kernels.backends.mosaic_gpu.timer import CuptiTimer

    backend = registry.get("mosaic_gpu")
    kernels = {
        name: jax.jit(backend.build(problem, backend.config_cls.from_dict(c))) for name, c in configs.items()
    }
    key_l, key_r = jax.random.split(jax.random.key(0))
    lhs = jax.random.normal(key_l, (args.m, args.k), jnp.bfloat16)
    rhs = (jax.random.normal(key_r, (args.g, args.k, args.n), jnp.bfloat16) * args.k**-0.5).astype(
        jnp.bfloat16
    )
    timer = CuptiTimer()
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)}
    result |= {"device": jax.devices()[0].device_kind, "problem": problem.key, "configs": configs, "rows": []}
    for label, counts in draws.items():
        sizes = jnp.asarray(counts, jnp.int32)
        times = {
            name: float(np.median(timer.time(fn, [(lhs, rhs, sizes)]))) * 1e3 for name, fn in kernels.items()
        }
        first = next(iter(times.values()))
        result["rows"].append({"routing": label, "group_sizes": counts, "ms": times})
        cells = "  ".join(f"{name} {ms:.3f} ms ({ms / first:.3f}x)" for name, ms in times.items())
        print(f"{label:28s} {cells}", flush=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
