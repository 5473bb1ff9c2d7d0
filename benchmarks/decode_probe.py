"""Where a decode step's time goes (issue 7), on one GPU, in one run.

For each routing implementation of the moetune MoE layer ("sort": lax.top_k, argsort and scatters; "compare":
the pairwise-comparison routing moetune.kernels.moe uses for a few tokens), and for the GEMMs alone:
  layer   one MoE block (RMSNorm, router, MoE MLP) per step of a jitted fori_loop, `--reps` steps: the
          per-layer time, host dispatch excluded (as bench_model's MoE-layer timing);
  model   greedy decode of a Mixtral-shaped model with 4 and with 8 layers (`--gen` steps, one fori_loop,
          cache of 2048 + gen positions, decoding from position 2048): per-token time; the difference per
          layer and the intercept project the 32-layer model's tokens/s (session 5's call 2 timed one more
          variant, "qkv": the q, k and v projections as one GEMM, which the model now is);
  trace   jax.profiler traces of the layer loop and of 4 decode steps of the smallest model: every device
          kernel's count and time per layer, and the device's busy time (the rest is gaps between kernels).
`--xla-flags` runs the layer and model timings again in a child process per XLA_FLAGS value.

    python3 benchmarks/decode_probe.py --out probe.json [--trace-dir traces] [--xla-flags='--xla_a=1' ...]

Host wall clock around block_until_ready, median of `--runs`; the weights are random bf16 made on the GPU.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from moetune.kernels.api import grouped_matmul, grouped_matmul_swiglu  # noqa: E402
from moetune.kernels.lookup import LOOKUP  # noqa: E402
from moetune.kernels.moe import layer as moe  # noqa: E402
from moetune.models import bench, mixtral  # noqa: E402
from moetune.models.config import model_config  # noqa: E402
from moetune.models.weights import init_params  # noqa: E402

ROUTINGS = {"sort": (0, 0), "compare": (moe.COMPARE_MAX_EXPERTS, moe.COMPARE_MAX_ROWS)}


def log(message: str) -> None:
    print(f"[probe {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def routing(name: str):
    """Trace with one routing implementation; jit caches are cleared so nothing traced before is reused."""
    saved = moe.COMPARE_MAX_EXPERTS, moe.COMPARE_MAX_ROWS
    moe.COMPARE_MAX_EXPERTS, moe.COMPARE_MAX_ROWS = ROUTINGS[name]
    jax.clear_caches()
    mixtral._shared_moe.cache_clear()
    try:
        yield
    finally:
        moe.COMPARE_MAX_EXPERTS, moe.COMPARE_MAX_ROWS = saved


def gemms_loop(config):
    """`reps` steps of the two grouped GEMMs alone, in a fori_loop on one layer's weights: a fixed routing
    (each token's rows to experts 0 and 1) plus the row copy and sum that feed them; the RMSNorm as in
    bench.moe_block_loop, which times the whole MoE block the same way."""

    def block(layer, x):
        h = mixtral.rms_norm(x, layer.moe_norm, config.norm_eps)
        tokens = h.shape[0]
        rows = jnp.concatenate([h, h])  # expert 0's rows, then expert 1's
        sizes = jnp.zeros((config.experts,), jnp.int32).at[:2].set(tokens)
        hidden = grouped_matmul_swiglu(rows, layer.w_gate_up, sizes)
        down = grouped_matmul(hidden, layer.w_down, sizes)
        return (down[:tokens].astype(jnp.float32) + down[tokens:]).astype(h.dtype)

    @jax.jit
    def loop(x, layer, reps):
        return jax.lax.fori_loop(0, reps, lambda _, x: block(layer, x), x)

    return loop


def time_layers(config, layer, tokens: int, reps: int, runs: int, variants: list[str]) -> dict[str, Any]:
    out = {}
    x = jax.random.normal(jax.random.key(tokens), (tokens, config.hidden)).astype(jnp.bfloat16)
    for variant in variants:
        with routing("compare" if variant == "gemms" else variant):
            if variant == "gemms":
                loop = gemms_loop(config)
            else:
                loop = functools.partial(bench.moe_block_loop, config=config, path="moetune")
            n = jnp.asarray(reps, jnp.int32)
            samples, _ = bench.timed(lambda loop=loop, n=n: loop(x, layer, n), runs)
            samples = [s / reps for s in samples]
        out[variant] = {
            "median_ms": float(np.median(samples)) * 1e3,
            "samples_ms": [s * 1e3 for s in samples],
        }
        log(f"layer T={tokens} {variant}: {out[variant]['median_ms']:.4f} ms")
    return out


def decode_program(config, params, gen: int):
    cache = mixtral.KVCache.empty(config, 1, 2048 + gen)
    first = jnp.zeros((1,), jnp.int32)
    pos = jnp.asarray(2048 - 1, jnp.int32)
    decode, compile_s = bench.compiled(
        mixtral.decode_loop, params, first, cache, pos, steps=gen, config=config, moe_path="moetune"
    )
    state = {"cache": cache}

    def run():
        tokens, state["cache"] = decode(params, first, state["cache"], pos)
        return tokens

    return run, compile_s


def time_model(
    model: str, layers: int, gen: int, runs: int, variants: list[str], trace_dir: Path | None
) -> dict[str, Any]:
    """Per-token decode time of each routing variant ("sort", "compare"). With `trace_dir`, also a trace
    of 4 steps of each."""
    config = model_config(model, layers)
    params = init_params(config, seed=0)
    out = {}
    for variant in variants:
        with routing("sort" if variant == "sort" else "compare"):
            run, compile_s = decode_program(config, params, gen)
            samples, tokens = bench.timed(run, runs)
            tokens = np.asarray(tokens)[0, :16].tolist()
            if trace_dir is not None:
                short, _ = decode_program(config, params, 4)
                jax.block_until_ready(short())
                with jax.profiler.trace(
                    str(trace_dir / f"model{layers}_{variant}"), create_perfetto_trace=True
                ):
                    jax.block_until_ready(short())
        per_token = float(np.median(samples)) / gen
        out[variant] = {
            "per_token_ms": per_token * 1e3,
            "samples_s": samples,
            "compile_s": compile_s,
            "tokens": tokens,
        }
        if trace_dir is not None:
            out[variant]["trace"] = kernel_table(trace_dir / f"model{layers}_{variant}", 4 * layers)
        log(
            f"model {layers} layers {variant}: {per_token * 1e3:.3f} ms per token ({1 / per_token:.1f} tok/s)"
        )
    return out


def kernel_table(trace_dir: Path, reps: int) -> dict[str, Any]:
    """Device kernels of a perfetto trace: per name, count and time per layer; and the device idle share."""
    files = sorted(trace_dir.rglob("*.trace.json.gz")) or sorted(trace_dir.rglob("perfetto_trace.json.gz"))
    if not files:
        return {"error": f"no trace file under {trace_dir}"}
    events = json.load(gzip.open(files[-1])).get("traceEvents", [])
    process = {
        e["pid"]: e["args"].get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    thread = {
        (e["pid"], e["tid"]): e["args"].get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    spans = []
    for e in events:
        if e.get("ph") != "X" or "GPU" not in process.get(e.get("pid"), ""):
            continue
        if "stream" not in thread.get((e["pid"], e.get("tid")), "").lower():
            continue
        by_name[e["name"]].append(float(e.get("dur", 0)))
        spans.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))))
    gpu_threads = sorted({name for (pid, _), name in thread.items() if "GPU" in process.get(pid, "")})
    if not spans:
        return {
            "error": "no device stream events",
            "processes": sorted(set(process.values())),
            "threads": gpu_threads,
        }
    spans.sort()
    busy, end = 0.0, spans[0][0]
    for a, b in spans:  # union of the kernels' intervals
        if b > end:
            busy += b - max(a, end)
            end = b
    span = spans[-1][1] - spans[0][0]
    table = sorted(
        ({"name": n[:120], "count": len(d), "us_per_layer": sum(d) / reps} for n, d in by_name.items()),
        key=lambda row: -row["us_per_layer"],
    )
    return {
        "span_us_per_layer": span / reps,
        "busy_us_per_layer": busy / reps,
        "threads": gpu_threads,
        "kernels": table[:40],
    }


def trace_layers(config, layer, trace_dir: Path, reps: int, tokens: int = 1) -> dict[str, Any]:
    """Kernel tables of the MoE block loop at `tokens` tokens, per routing (only "compare" past
    COMPARE_MAX_ROWS rows, where both routings take the argsort path), and the routing's rows per expert."""
    out = {}
    x = jax.random.normal(jax.random.key(1), (tokens, config.hidden)).astype(jnp.bfloat16)
    routed = bench.moe_block_routing(x, layer, reps=1, config=config, path="moetune")
    out["rows_per_expert"] = np.asarray(routed[0]).tolist()
    small = tokens * config.top_k <= moe.COMPARE_MAX_ROWS
    for variant in ("sort", "compare") if small else ("compare",):
        with routing(variant):
            loop = functools.partial(bench.moe_block_loop, config=config, path="moetune")
            n = jnp.asarray(reps, jnp.int32)
            jax.block_until_ready(loop(x, layer, n))
            folder = trace_dir / f"{variant}_T{tokens}"
            with jax.profiler.trace(str(folder), create_perfetto_trace=True):
                jax.block_until_ready(loop(x, layer, n))
        out[variant] = kernel_table(folder, reps)
        log(f"trace {variant}: {json.dumps({k: v for k, v in out[variant].items() if k != 'kernels'})}")
    return out


def _csv(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="mixtral_8x7b", help="model preset ('tiny' for a CPU smoke run)")
    parser.add_argument("--tokens", default="1,8", help="token counts of the layer timing")
    parser.add_argument("--layer-variants", default="sort,compare,gemms")
    parser.add_argument("--reps", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--model-layers", default="4,8", help="layer counts of the model timing ('' skips)")
    parser.add_argument("--model-variants", default="sort,compare")
    parser.add_argument("--trace-dir", type=Path, help="trace the layer loop and the smallest model here")
    parser.add_argument("--trace-tokens", type=int, default=1, help="tokens of the traced layer loop")
    parser.add_argument(
        "--xla-flags",
        action="append",
        default=[],
        help="an XLA_FLAGS value to time the layer (compare, gemms) and the model (compare) under, in "
        "a child process (repeatable; write --xla-flags='--xla_...')",
    )
    args = parser.parse_args()
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }

    def save():
        args.out.write_text(json.dumps(result, indent=1))

    with LOOKUP.using_db(None):  # the shipped packs only
        config = model_config(args.model, 1)
        layer = init_params(config, seed=0).layers[0]
        variants = _csv(args.layer_variants)
        result["layer"] = {
            t: time_layers(config, layer, int(t), args.reps, args.runs, variants) for t in _csv(args.tokens)
        }
        save()
        if args.trace_dir:
            result["trace"] = trace_layers(config, layer, args.trace_dir, 8, args.trace_tokens)
            save()
        del layer
        result["model"] = {}
        counts = sorted(int(n) for n in _csv(args.model_layers))
        for layers in counts:
            trace = args.trace_dir if layers == counts[0] else None
            variants = _csv(args.model_variants)
            result["model"][str(layers)] = time_model(
                args.model, layers, args.gen, args.runs, variants, trace
            )
            save()
        if len(counts) >= 2:
            result["projection_32"] = project(result["model"], counts[0], counts[-1])
        save()
    for flags in args.xla_flags:
        child = args.out.with_name(f"{args.out.stem}_flags{len(result.setdefault('flags', []))}.json")
        env = {**os.environ, "XLA_FLAGS": flags}
        command = [sys.executable, __file__, "--out", str(child), "--model", args.model, "--tokens", "1"]
        command += ["--reps", str(args.reps), "--runs", str(args.runs), "--layer-variants", "compare,gemms"]
        command += [
            "--model-layers",
            args.model_layers,
            "--model-variants",
            "compare",
            "--gen",
            str(args.gen),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
        entry = {"xla_flags": flags, "rc": done.returncode, "stderr_tail": done.stderr[-1500:]}
        if child.exists():
            entry |= {
                k: v
                for k, v in json.loads(child.read_text()).items()
                if k in ("layer", "model", "projection_32")
            }
            child.unlink()
        result["flags"].append(entry)
        log(f"XLA_FLAGS={flags!r}: rc={done.returncode}")
        save()
    return 0


def project(model: dict[str, Any], lo: int, hi: int) -> dict[str, Any]:
    """The 32-layer decode time per variant, from the per-layer difference between `lo` and `hi` layers."""
    out = {}
    for variant in model[str(lo)]:
        a, b = (model[str(n)][variant]["per_token_ms"] for n in (lo, hi))
        per_layer = (b - a) / (hi - lo)
        t32 = a + (32 - lo) * per_layer
        out[variant] = {
            "per_layer_ms": per_layer,
            "outside_layers_ms": a - lo * per_layer,
            "per_token_ms": t32,
            "tokens_per_s": 1e3 / t32,
        }
        log(f"32 layers projected, {variant}: {1e3 / t32:.1f} tok/s ({per_layer:.4f} ms per layer)")
    return out


if __name__ == "__main__":
    sys.exit(main())
