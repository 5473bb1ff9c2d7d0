"""The MoE layer at prefill size run for a while per path, with the GPU's SM clock and power sampled beside
it (nvidia-smi every 100 ms): whether the layer times of bench_model drift with the clock (issue 7).

For each path (moetune, ragged): `--seconds` of back-to-back calls of bench's MoE block loop (`--reps`
blocks each), recording each call's per-layer time; meanwhile nvidia-smi logs clocks.sm, power.draw,
temperature and the active clock-event reasons. Prints and writes per path: the layer times (first,
median, last), and the median SM clock and power while it ran.

    python3 benchmarks/layer_clocks.py --out clocks.json [--tokens 4096] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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

FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu"
# The field's name since driver 535; older drivers call it clocks_throttle_reasons.active.
REASONS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def visible_gpu_index() -> int:
    """nvidia-smi's index of the GPU this process runs on: the first of CUDA_VISIBLE_DEVICES, else 0.
    (Without -i, nvidia-smi logs every GPU of the host, and another job's GPU would mix into the medians.)"""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def sample_gpu(log: Path, index: int) -> subprocess.Popen:
    for reasons in REASONS:
        query = f"--query-gpu={FIELDS},{reasons}"
        probe = subprocess.run(
            ["nvidia-smi", "-i", str(index), query, "--format=csv", "-c", "1"], capture_output=True
        )
        if probe.returncode == 0:
            break
    command = ["nvidia-smi", "-i", str(index), query, "--format=csv,noheader,nounits", "-lms", "100"]
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.DEVNULL)


def read_samples(log: Path, start: float, end: float) -> dict[str, float]:
    """Median SM clock (MHz), power (W) and temperature (C) of the samples taken in [start, end]."""
    rows = []
    for line in log.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
        if start - 1 <= stamp <= end + 1:
            rows.append((float(parts[1]), float(parts[2]), float(parts[3]), parts[4]))
    if not rows:
        return {"samples": 0}
    clocks, power, temp, reasons = zip(*rows, strict=True)
    return {
        "samples": len(rows),
        "sm_clock_mhz_median": float(np.median(clocks)),
        "sm_clock_mhz_min": float(min(clocks)),
        "power_w_median": float(np.median(power)),
        "temperature_c_max": float(max(temp)),
        "event_reasons": sorted(set(reasons)),
    }


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--paths", default="moetune,ragged")
    parser.add_argument(
        "--gpu-index", type=int, default=None, help="nvidia-smi index to sample (default: visible_gpu_index)"
    )
    args = parser.parse_args()
    gpu_index = visible_gpu_index() if args.gpu_index is None else args.gpu_index
    config = model_config("mixtral_8x7b", 1)
    layer = init_params(config, seed=0).layers[0]
    x = jax.random.normal(jax.random.key(args.tokens), (args.tokens, config.hidden)).astype(jnp.bfloat16)
    reps = jnp.asarray(args.reps, jnp.int32)
    log = args.out.with_suffix(".smi.csv")
    smi = sample_gpu(log, gpu_index)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)}
    result |= {"device": jax.devices()[0].device_kind, "gpu_index": gpu_index, "tokens": args.tokens}
    result["paths"] = {}
    try:
        with LOOKUP.using_db(None):
            for path in args.paths.split(","):
                loop, _ = bench.compiled(bench.moe_block_loop, x, layer, reps, config=config, path=path)
                jax.block_until_ready(loop(x, layer, reps))
                times, start = [], time.time()
                while time.time() - start < args.seconds:
                    t0 = time.perf_counter()
                    jax.block_until_ready(loop(x, layer, reps))
                    times.append((time.perf_counter() - t0) / args.reps)
                end = time.time()
                time.sleep(1.5)  # let the next sample land before the window closes
                entry = {
                    "layer_ms": [t * 1e3 for t in times],
                    "first_ms": times[0] * 1e3,
                    "median_ms": float(np.median(times)) * 1e3,
                    "last_ms": times[-1] * 1e3,
                    "gpu": read_samples(log, start, end),
                }
                result["paths"][path] = entry
                print(
                    f"{path}: {len(times)} calls, layer ms first {entry['first_ms']:.3f} median "
                    f"{entry['median_ms']:.3f} last {entry['last_ms']:.3f}; gpu {entry['gpu']}",
                    flush=True,
                )
                time.sleep(5)  # cool down between paths
    finally:
        smi.terminate()
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
