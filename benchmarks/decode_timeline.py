"""Where a decode token's time goes on the GPU (issue 7).

The model's jitted decode loop (moetune path, batch 1, a cache filled to --prompt) is timed by the host
clock around block_until_ready, and one more call of it is recorded by CUPTI, kernel by kernel. Per token:
  wall      the loop's time divided by its steps (what bench_model's decode tokens/s reads);
  kernels   the sum of the kernels' device times, and how many kernels ran;
  between   wall - kernels: the time the GPU spent between kernels (launch gaps, and host round trips
            of the while loop, if any); negative when kernels overlap (XLA's command buffers and
            programmatic dependent launch let the next kernel start before the last one ends).
Kernels are grouped by name with trailing numbers dropped (XLA's fusion.12 and fusion.13 are one group;
each Mosaic GPU kernel's name spells its config).

XLA reads its flags when jax starts, so each variant runs in a child process with its own XLA_FLAGS and
kernel choices (the model's KernelChoices fields, as xla_attention's decode_attention=xla);
with --gpus 0,1 two children run at once, one per GPU. --pack serves one config pack file alone
(no database), so that two packs can be compared on one GPU.

    python3 benchmarks/decode_timeline.py --out timeline.json [--variants default,no_command_buffers]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

# name -> XLA_FLAGS, appended to any already set, and KernelChoices fields as `moetune bench model`'s flags
# spell them (the parent imports no jax, so they are literals; the child parses them).
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "no_command_buffers": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="},
    "command_buffer_while": {
        "XLA_FLAGS": "--xla_gpu_enable_command_buffer="
        "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
    },
    # The dense projections' dots through cuBLAS rather than XLA's Triton GEMM fusions.
    "no_triton_gemm": {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false"},
    # Decode attention as XLA's einsums (the path before models/decode_attention.py).
    "xla_attention": {"decode_attention": "xla"},
    # The MoE layer's routing as XLA's reductions (the path before kernels/moe/routing_kernel.py).
    "xla_routing": {"routing": "xla"},
    "xla_attention_routing": {"decode_attention": "xla", "routing": "xla"},
    # The MoE block's RMSNorm and router dot as XLA's ops (before models/norm_router.py).
    "xla_norm_router": {"norm_router": "xla"},
    # The attention's wqkv (with its RMSNorm) and wo as XLA's ops (before models/gemv.py).
    "xla_gemv": {"gemv": "xla"},
    # The MoE block's norm, router, routing and gather as the two kernels and XLA's gather+pad they were
    # before norm_router.norm_route_gather.
    "xla_norm_route_gather": {"norm_route_gather": "xla"},
    # The decode attention kernel at other tilings than its default (block_k=64, splits=32).
    "attention_splits64": {"decode_attention_tiling": "block_k=64,splits=64"},
    "attention_k32_splits64": {"decode_attention_tiling": "block_k=32,splits=64"},
    "attention_k128_splits16": {"decode_attention_tiling": "block_k=128,splits=16"},
    "attention_warps2": {"decode_attention_tiling": "num_warps=2"},
    "attention_warps8": {"decode_attention_tiling": "num_warps=8"},
    "attention_stages3": {"decode_attention_tiling": "num_stages=3"},
    # A decode step's two residual adds as XLA kernels in the model's dtype, rather than a float32 stream
    # that wo's GEMV adds into (mixtral._carries_residual).
    "residual_add": {"decode_residual": "add"},
    # XLA's programmatic dependent launch forced on or off (a kernel may start before the previous ends).
    "pdl_on": {"XLA_FLAGS": "--xla_gpu_enable_pdl=true"},
    "pdl_off": {"XLA_FLAGS": "--xla_gpu_enable_pdl=false"},
    # None of the Pallas Triton kernels: the decode step as sessions 1-9 ran it.
    "xla_all": {
        "decode_attention": "xla",
        "routing": "xla",
        "norm_router": "xla",
        "gemv": "xla",
        "norm_route_gather": "xla",
    },
}


def child_env(variant: str, gpu: str) -> dict[str, str]:
    flags = f"{os.environ.get('XLA_FLAGS', '')} {VARIANTS[variant].get('XLA_FLAGS', '')}".strip()
    return os.environ | {"CUDA_VISIBLE_DEVICES": gpu, "XLA_FLAGS": flags}


def choices_of(variant: str) -> dict[str, str]:
    """The variant's kernel choices: its fields other than XLA_FLAGS."""
    return {name: value for name, value in VARIANTS[variant].items() if name != "XLA_FLAGS"}


def log(message: str) -> None:
    print(f"[timeline {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def kernel_group(name: str) -> str:
    """`loop_convert_fusion_3` and `loop_convert_fusion.12` -> `loop_convert_fusion`."""
    return re.sub(r"([._]\d+)+$", "", name)


def summarize(kernels: list[tuple[str, float]], steps: int, walls_s: list[float]) -> dict:
    """Per-token wall, kernel time, kernel count, and the kernel groups by time (device ms from CUPTI)."""
    groups: dict[str, list[float]] = collections.defaultdict(list)
    for name, ms in kernels:
        groups[kernel_group(name)].append(ms)
    wall_us = sorted(w / steps * 1e6 for w in walls_s)[len(walls_s) // 2]
    kernel_us = sum(ms for _, ms in kernels) * 1e3 / steps
    return {
        "wall_us_per_token": wall_us,
        "walls_us_per_token": [w / steps * 1e6 for w in walls_s],
        "tokens_per_s": 1e6 / wall_us,
        "kernel_us_per_token": kernel_us,
        "kernels_per_token": len(kernels) / steps,
        "between_us_per_token": wall_us - kernel_us,
        "groups": sorted(
            (
                {"name": g, "per_token": len(v) / steps, "us_per_token": sum(v) * 1e3 / steps}
                for g, v in groups.items()
            ),
            key=lambda row: -row["us_per_token"],
        ),
    }


def measure(variant: str, args: argparse.Namespace) -> dict:
    """In the child: build the model, time the loop, record its kernels."""
    import jax
    import jax.numpy as jnp

    from moetune.kernels.backends.mosaic_gpu.timer import CuptiSession
    from moetune.kernels.lookup import LOOKUP
    from moetune.models import mixtral
    from moetune.models.config import model_config
    from moetune.models.kernel_choices import KernelChoices
    from moetune.models.weights import init_params

    config = model_config(args.model, args.layers)
    choices = KernelChoices.parse(**choices_of(variant))
    params = init_params(config, seed=0)
    cache = mixtral.KVCache.empty(config, 1, args.prompt + (args.runs + 3) * args.steps)
    tokens = jnp.zeros((1,), jnp.int32)
    loop = functools.partial(
        mixtral.decode_loop, steps=args.steps, config=config, moe_path="moetune", choices=choices
    )
    pos = args.prompt

    def call() -> float:
        nonlocal cache, tokens, pos
        start = time.perf_counter()
        out, cache = loop(params, tokens, cache, pos)
        jax.block_until_ready((out, cache))
        tokens, pos = out[:, -1], pos + args.steps
        return time.perf_counter() - start

    log(f"{variant}: compile and warm up ({config.layers} layers, {args.steps} steps a call)")
    # Winners are looked up when the loop is traced, in its first call.
    with LOOKUP.using_pack_file(args.pack) if args.pack else contextlib.nullcontext():
        call()
    walls = [call() for _ in range(args.runs)]
    kernels = CuptiSession().record(call)
    row = {"variant": variant, "xla_flags": os.environ.get("XLA_FLAGS", ""), "pack": args.pack}
    row["choices"] = choices.resolved()
    return row | summarize(kernels, args.steps, walls)


def run_children(args: argparse.Namespace, variants: list[str]) -> list[dict]:
    """One child per variant, at most one per GPU of --gpus at a time."""
    pending, running, rows = list(variants), [], []
    while pending or running:
        busy = {gpu for gpu, *_ in running}
        for gpu in [g for g in args.gpus.split(",") if g not in busy]:
            if not pending:
                break
            variant = pending.pop(0)
            out = args.out.with_name(f"{args.out.stem}_{variant}.json")
            env = child_env(variant, gpu)
            child = [sys.executable, __file__, "--child", variant, "--out", str(out)]
            child += ["--model", args.model, "--prompt", str(args.prompt), "--steps", str(args.steps)]
            child += ["--runs", str(args.runs)] + (["--layers", str(args.layers)] if args.layers else [])
            child += ["--pack", args.pack] if args.pack else []
            running.append((gpu, variant, out, subprocess.Popen(child, env=env)))
        time.sleep(1)
        for entry in [e for e in running if e[3].poll() is not None]:
            running.remove(entry)
            _, variant, out, proc = entry
            if proc.returncode == 0 and out.exists():
                rows.append(json.loads(out.read_text()))
            else:
                rows.append({"variant": variant, "error": f"child exited {proc.returncode}"})
            log(f"{variant}: {describe(rows[-1])}")
    return rows


def describe(row: dict) -> str:
    if "error" in row:
        return row["error"]
    return (
        f"{row['tokens_per_s']:.1f} tokens/s: {row['wall_us_per_token']:.0f} us a token, kernels"
        f" {row['kernel_us_per_token']:.0f} us ({row['kernels_per_token']:.0f} of them),"
        f" between {row['between_us_per_token']:.0f} us"
    )


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", default="default,no_command_buffers", help=", ".join(VARIANTS))
    parser.add_argument("--gpus", default="0", help="GPU ids for the children, one child per GPU at a time")
    parser.add_argument("--model", default="mixtral_8x7b")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--prompt", type=int, default=2048, help="the cache position decoding starts at")
    parser.add_argument("--steps", type=int, default=64, help="decode steps per timed call")
    parser.add_argument("--runs", type=int, default=5, help="timed calls (the median is reported)")
    parser.add_argument("--pack", help="serve this config pack file alone (default: the shipped packs)")
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.out.write_text(json.dumps(measure(args.child, args), indent=1))
        return 0
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rows = run_children(args, variants)
    result = {"date": started, "command": " ".join(sys.argv), "steps": args.steps, "rows": rows}
    args.out.write_text(json.dumps(result, indent=1))
    for row in rows:
        print(f"{row['variant']:22s} {describe(row)}")
        for group in row.get("groups", [])[:12]:
            print(f"    {group['us_per_token']:8.1f} us  x{group['per_token']:6.1f}  {group['name'][:90]}")
    return 0 if all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
