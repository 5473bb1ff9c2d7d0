"""Chained tile pipelines on and off, on the same config in the same process (issue 5).

A persistent warp-specialized CTA chains its tiles' pipelines when k_steps is a multiple of the stages
(`kernel_sm90.chains`): the producer loads the next tile's first stages while the consumers finish a tile.
For every shipped-pack entry that chains, with at least `--min-rows` rows, this compiles the entry's config
twice, as shipped and with `chains` forced off, and times both on balanced routing with the CUPTI timer,
alternating A and B for `--rounds` rounds. Sweep times from different sessions cannot show a 1-2% effect;
this can.

    python3 benchmarks/chain_ab.py --out chain_ab.json [--min-rows 2048] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from pathlib import Path

import jax
import moe_shapes
import numpy as np

from moetune.kernels import packs
from moetune.kernels.backends.mosaic_gpu import kernel_sm90
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.backends.mosaic_gpu.timer import CuptiTimer
from moetune.kernels.problem import GROUPED_MATMUL_SWIGLU


@contextlib.contextmanager
def unchained():
    """Trace inside this and the kernel is built as before chaining: every tile drains its pipeline."""
    original = kernel_sm90.chains
    kernel_sm90.chains = lambda problem, config: False
    try:
        yield
    finally:
        kernel_sm90.chains = original


def chained_entries(pack: packs.Pack, min_rows: int) -> list[tuple[packs.PackEntry, MosaicGpuConfig]]:
    """(entry, its config) for the entries of at least `min_rows` rows whose config chains."""
    configs = [(e, MosaicGpuConfig.from_dict(e.config)) for e in pack.entries if e.problem.m >= min_rows]
    return [(e, c) for e, c in configs if kernel_sm90.chains(e.problem, c)]


def compiled(op, config: MosaicGpuConfig, num_sms: int, args: tuple):
    """`op` with `config` compiled for `args`, traced afresh (a new jit), so it chains or not as
    kernel_sm90.chains says at this moment."""
    return jax.jit(functools.partial(op, config=config, num_sms=num_sms)).lower(*args).compile()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pack", type=Path, default=moe_shapes.SHIPPED_PACK)
    parser.add_argument("--min-rows", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    num_sms = int(getattr(jax.devices()[0], "core_count", 132))
    timer = CuptiTimer()
    rows = []
    for entry, config in chained_entries(packs.load(args.pack), args.min_rows):
        p = entry.problem
        proj = "gate_up" if p.k == moe_shapes.PROJECTIONS["gate_up"][0] else "down"
        shape = moe_shapes.Shape(proj, p.m // moe_shapes.TOP_K)
        lhs, rhs = moe_shapes.make_lhs(shape), moe_shapes.make_weights(proj)
        sizes = jax.numpy.asarray(moe_shapes.group_sizes(shape, "balanced"), jax.numpy.int32)
        op = (
            kernel_sm90.grouped_matmul_swiglu if p.op == GROUPED_MATMUL_SWIGLU else kernel_sm90.grouped_matmul
        )
        chained = compiled(op, config, num_sms, (lhs, rhs, sizes))
        with unchained():
            drained = compiled(op, config, num_sms, (lhs, rhs, sizes))
        outputs = [np.asarray(fn(lhs, rhs, sizes), np.float32) for fn in (chained, drained)]
        same = float(np.max(np.abs(outputs[0] - outputs[1])))
        samples = {"chained": [], "drained": []}
        for _ in range(args.rounds):
            for name, fn in (("chained", chained), ("drained", drained)):
                samples[name] += timer.time(fn, [(lhs, rhs, sizes)])
        med = {k: float(np.median(v)) for k, v in samples.items()}
        row = {
            "problem": p.key,
            "config": kernel_sm90.kernel_name(config, p.op),
            "max_abs_diff": same,
            "median_ms": {k: v * 1e3 for k, v in med.items()},
            "drained_over_chained": med["drained"] / med["chained"],
            "samples_ms": {k: [s * 1e3 for s in v] for k, v in samples.items()},
        }
        rows.append(row)
        print(
            f"[chain_ab] {p.op[-6:]} m={p.m:6d} k={p.k:5d} {row['config']:55s}"
            f" chained {med['chained'] * 1e3:8.4f} ms  drained {med['drained'] * 1e3:8.4f} ms"
            f"  ratio {row['drained_over_chained']:.4f}  diff {same:.1e}",
            file=sys.stderr,
            flush=True,
        )
        del lhs, rhs
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
        "environment": moe_shapes.environment(),
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
