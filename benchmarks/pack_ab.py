"""Two config packs on the same GPU in one process: bench_model's MoE layer (RMSNorm, router, MoE MLP
on Mixtral-8x7B's layer 0) at each token count, traced once per pack and timed in alternation, with XLA's
ragged_dot layer beside them for the ratio that issue 7's target reads.

Packs differ from one session to the next and so do the hosts: this separates the two. Each pack file is
served alone (no database, LOOKUP.using_pack_file); a pack tuned on another kernel source is used as it is
(the dispatcher logs it as stale).

    python3 benchmarks/pack_ab.py --packs OLD.json,NEW.json --out ab.json [--tokens 4096,1] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from moetune.kernels.lookup import LOOKUP
from moetune.models import bench
from moetune.models.config import model_config
from moetune.models.weights import init_params


def kernel_times(loop, args: tuple, reps: int) -> dict[str, float]:
    """One call recorded by CUPTI: ms per layer of each kernel group (decode_timeline's grouping), largest
    first."""
    from decode_timeline import kernel_group

    from moetune.kernels.backends.mosaic_gpu.timer import CuptiSession

    groups: dict[str, float] = {}
    for name, ms in CuptiSession().record(lambda: loop(*args)):
        groups[kernel_group(name)] = groups.get(kernel_group(name), 0.0) + ms / reps
    return dict(sorted(groups.items(), key=lambda item: -item[1]))


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--packs", required=True, help="pack files, comma-separated (the first is the base)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", default="4096,1")
    parser.add_argument("--rounds", type=int, default=7, help="alternating timed calls per arm")
    parser.add_argument("--model", default="mixtral_8x7b", help="model preset (tiny: a CPU rehearsal)")
    parser.add_argument(
        "--kernels", action="store_true", help="also record one call per arm with CUPTI: time per kernel"
    )
    args = parser.parse_args()
    packs = [Path(p) for p in args.packs.split(",")]
    missing = [str(p) for p in packs if not p.is_file()]
    if missing:
        parser.error(f"no such pack file: {', '.join(missing)}")
    if len({p.name for p in packs} | {"ragged"}) != len(packs) + 1:  # the arms are named by file name
        parser.error("the pack files need distinct names, none of them 'ragged'")
    config = model_config(args.model, 1)
    layer = init_params(config, seed=0).layers[0]
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)}
    result |= {"device": jax.devices()[0].device_kind, "packs": [str(p) for p in packs], "tokens": {}}
    for tokens in map(int, args.tokens.split(",")):
        x = jax.random.normal(jax.random.key(tokens), (tokens, config.hidden)).astype(jnp.bfloat16)
        reps = jnp.asarray(bench.layer_reps(tokens), jnp.int32)  # as bench_model's layer timing
        arms = {}
        for pack in packs:
            # Winners are looked up while tracing, and jit keeps a trace per function and static arguments:
            # without a fresh cache every pack would run the first pack's kernels.
            jax.clear_caches()
            with LOOKUP.using_pack_file(pack):
                arms[pack.name], _ = bench.compiled(
                    bench.moe_block_loop, x, layer, reps, config=config, path="moetune"
                )
        with LOOKUP.using_db(None):
            arms["ragged"], _ = bench.compiled(
                bench.moe_block_loop, x, layer, reps, config=config, path="ragged"
            )
        times: dict[str, list[float]] = {name: [] for name in arms}
        for loop in arms.values():
            jax.block_until_ready(loop(x, layer, reps))
        for _ in range(args.rounds):
            for name, loop in arms.items():
                start = time.perf_counter()
                jax.block_until_ready(loop(x, layer, reps))
                times[name].append((time.perf_counter() - start) / int(reps) * 1e3)
        medians = {name: float(np.median(t)) for name, t in times.items()}
        base = medians[packs[0].name]
        rows = {
            name: {
                "layer_ms": times[name],
                "median_ms": medians[name],
                "vs_first_pack": medians[name] / base,
                "ragged_over_this": medians["ragged"] / medians[name],
            }
            for name in arms
        }
        if args.kernels:
            for name, loop in arms.items():
                rows[name]["kernel_ms_per_layer"] = kernel_times(loop, (x, layer, reps), int(reps))
        result["tokens"][str(tokens)] = rows
        for name, row in rows.items():
            print(
                f"T={tokens:5d} {name:40s} {row['median_ms']:8.3f} ms  x{row['vs_first_pack']:.3f} of the"
                f" first pack  ragged/this {row['ragged_over_this']:.2f}"
            )
            for kernel, ms in list(row.get("kernel_ms_per_layer", {}).items())[:4]:
                print(f"        {ms:8.3f} ms  {kernel[:100]}")
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
