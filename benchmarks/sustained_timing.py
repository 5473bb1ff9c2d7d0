"""Does a config's rank change once the GPU sits at its power cap? (issue 7: the T=4096 MoE layer loses
~15% to the H200's 700 W cap within a second, benchmarks/layer_clocks.py.)

For a few configs of the T=4096 gate_up GEMM (SwiGLU fused, and unfused with XLA's activation after): the
CUPTI median of 10 right after `--cool-s` idle seconds ("burst", as the sweeps time), and again right after
`--heat-s` seconds of running the same kernel back to back ("sustained"). Prints both ranks.

    python3 benchmarks/sustained_timing.py --out sustained.json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from moetune.kernels.backends.mosaic_gpu import kernel_sm90
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C
from moetune.kernels.backends.mosaic_gpu.timer import CuptiTimer
from moetune.kernels.moe.reference import gated_activation
from moetune.kernels.reference import relative_error

FUSED = [
    C(block_m=128, block_n=64, block_k=64, max_concurrent_steps=3, wg_split="n"),  # the shipped pack's
    C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=3, wg_split="m"),
    C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="m"),
    C(block_m=64, block_n=128, block_k=32, max_concurrent_steps=6, wg_split="m"),
]
UNFUSED = [
    C(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, wg_split="n"),
    C(block_m=128, block_n=128, block_k=128, max_concurrent_steps=2, wg_split="n"),
]


def _swiglu(h):
    return gated_activation("swiglu", h).astype(jnp.bfloat16)


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--cool-s", type=float, default=3.0)
    parser.add_argument("--heat-s", type=float, default=3.0)
    parser.add_argument("--reverse", action="store_true", help="time the variants in reverse order")
    args = parser.parse_args()
    num_sms = int(getattr(jax.devices()[0], "core_count", 132))
    m, hidden, inter, experts = 2 * args.tokens, 4096, 14336, 8
    x = jax.random.normal(jax.random.key(0), (m, hidden), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(jax.random.key(1), (experts, hidden, 2 * inter)) * hidden**-0.5).astype(
        jnp.bfloat16
    )
    sizes = jnp.full((experts,), m // experts, jnp.int32)
    ref = np.asarray(_swiglu(jax.lax.ragged_dot(x, w, sizes, preferred_element_type=jnp.float32)), np.float32)
    variants = [("fused", c, functools.partial(kernel_sm90.grouped_matmul_swiglu, config=c)) for c in FUSED]
    for c in UNFUSED:
        gemm = functools.partial(kernel_sm90.grouped_matmul, config=c)
        variants.append(
            ("unfused", c, lambda x, w, s, num_sms, gemm=gemm: _swiglu(gemm(x, w, s, num_sms=num_sms)))
        )
    if args.reverse:  # the card warms over the run: the other order shows what the order did
        variants.reverse()
    timer, rows = CuptiTimer(), []
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)}
    result |= {"device": jax.devices()[0].device_kind, "tokens": args.tokens, "rows": rows}
    for kind, config, fn in variants:
        name = f"{kind} {kernel_sm90.kernel_name(config)}"
        try:
            jitted = jax.jit(functools.partial(fn, num_sms=num_sms))
            out = np.asarray(jitted(x, w, sizes), np.float32)
            err = relative_error(out, ref)
            rotation = timer.rotation([(x, w, sizes)])
            time.sleep(args.cool_s)
            burst = float(np.median(timer.time(jitted, rotation)))
            start = time.time()
            while time.time() - start < args.heat_s:
                jax.block_until_ready([jitted(x, w, sizes) for _ in range(4)])
            sustained = float(np.median(timer.time(jitted, rotation)))
            rows.append(
                {"variant": name, "rel_err": err, "burst_ms": burst * 1e3, "sustained_ms": sustained * 1e3}
            )
            print(
                f"{name:70s} burst {burst * 1e3:.3f} ms  sustained {sustained * 1e3:.3f} ms  err {err:.1e}",
                flush=True,
            )
        except Exception as e:  # one broken variant must not lose the others
            rows.append({"variant": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(f"{name:70s} FAILED {rows[-1]['error'][:200]}", flush=True)
        args.out.write_text(json.dumps(result, indent=1))
    timed = [r for r in rows if "burst_ms" in r]
    for key in ("burst_ms", "sustained_ms"):
        result[f"rank_by_{key}"] = [r["variant"] for r in sorted(timed, key=lambda r: r[key])]
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
