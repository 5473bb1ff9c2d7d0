"""The fused MoE ops on the GPU machine: correctness against the float32 reference, and fused vs unfused
time, at Mixtral-8x7B's shapes (H=4096, F=14336, E=8, top_k=2).

  check      "grouped_matmul_swiglu" on mosaic_gpu for several configs (the heuristic and fixed ones),
             both weight layouts and two routings (balanced, Zipf-skewed), against reference_of(problem)
             (ragged_dot in float32, then silu(gate) * up); NaN-poisoned outputs, rows past the routing.
  gate_up    CUPTI device time (kernels/backends/mosaic_gpu/timer.py's CuptiTimer) of the fused op against the
             unfused path: the dispatched grouped_matmul [2T, 28672] then the XLA SwiGLU; per config too.
  layer      the whole moe_mlp on mosaic_gpu, fuse=True against fuse=False, checked against each other
             and against the float32 dense reference, then timed.

Every step records its error and the script goes on; steps (and configs) past --budget-s are recorded
as skipped: set it well below the command's time limit, one step at T=4096 can take a minute.
The JSON (--out) is rewritten after every step, so a killed run still leaves what it measured.

    python3 benchmarks/device_fused_check.py --out $OUT/fused.json --budget-s 500
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import moe_shapes
from moe_shapes import Shape

from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig as C

HIDDEN, INTERMEDIATE = moe_shapes.PROJECTIONS["down"][1], moe_shapes.PROJECTIONS["down"][0]
TOKENS = (1, 16, 512, 4096)
SWIGLU = "grouped_matmul_swiglu"
# Fixed fused configs beside the heuristic: both warp-specialized splits, one consumer, the plain pipeline.
CONFIGS = {
    "ws_n_128x64": C(block_m=128, block_n=64, block_k=64, max_concurrent_steps=3, wg_split="n"),
    "ws_m_64x128": C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=3, wg_split="m"),
    "ws_n_64x64": C(block_m=64, block_n=64, block_k=64, max_concurrent_steps=4, wg_split="n"),
    "ws_one_64x128": C(block_m=64, block_n=128, block_k=64, max_concurrent_steps=3, wg_split="none"),
    "plain_64x128": C(
        block_m=64, block_n=128, block_k=64, max_concurrent_steps=3, warp_specialized=False, wg_split="none"
    ),
}
TOLERANCE = 1e-2  # bf16 output against the float32 reference (kernels/reference.py)


class Budget:
    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def _summary(samples: list[float]) -> dict:
    return {
        "median_ms": statistics.median(samples) * 1e3,
        "min_ms": min(samples) * 1e3,
        "max_ms": max(samples) * 1e3,
        "samples_ms": [s * 1e3 for s in samples],
    }


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:800] + "\n" + traceback.format_exc(limit=4)[-1200:]


def _step(records: list, budget: Budget, kind: str, params: dict, fn: Callable[[], dict], save) -> None:
    """Run one step, recording its result, its error or that the budget was spent; never raises."""
    record: dict[str, Any] = {"kind": kind, **params}
    if budget.left() <= 0:
        record["skipped"] = "budget spent"
    else:
        t0 = time.monotonic()
        try:
            record.update(fn())
        except Exception as e:  # one failing config is data: record it and go on
            record["error"] = _error(e)
        record["wall_s"] = round(time.monotonic() - t0, 2)
    records.append(record)
    status = record.get("skipped") or (
        "ERROR " + record["error"].splitlines()[0] if "error" in record else "ok"
    )
    if "error" not in record and '"error"' in json.dumps(record, default=str):
        status += " (some parts failed: see the JSON)"
    print(f"[{budget.left():7.1f}s left] {kind} {params}: {status}", file=sys.stderr, flush=True)
    save()


def _time(fn, args, timer) -> list[float]:
    import jax

    compiled = jax.jit(fn).lower(*args).compile()
    return timer.time(compiled, [args], runs=10)


def _rel_err(out, ref) -> float:
    from moetune.kernels.reference import relative_error

    return relative_error(out, ref)


class Inputs:
    """Weights and activations made once and shared by every step."""

    def __init__(self):
        self._cache: dict[tuple, Any] = {}

    def get(self, key: tuple, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def gate_up_weights(self, transpose: bool):
        return self.get(
            ("w_gate_up", transpose), lambda: moe_shapes.make_weights("gate_up", transpose=transpose)
        )

    def down_weights(self):
        return self.get(("w_down",), lambda: moe_shapes.make_weights("down", seed=2))

    def drop(self, prefix: str) -> None:
        for key in [k for k in self._cache if k[0] == prefix]:
            del self._cache[key]


def check_fused(
    inputs: Inputs, tokens: int, transpose: bool, routing: str, configs: dict, budget: Budget
) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from moetune.kernels import registry
    from moetune.kernels.device import current_fingerprint
    from moetune.kernels.problem import Problem
    from moetune.kernels.reference import reference_of

    shape = Shape("gate_up", tokens)
    problem = Problem(SWIGLU, m=shape.m, k=shape.k, n=shape.n, g=moe_shapes.EXPERTS, transpose_rhs=transpose)
    backend = registry.get("mosaic_gpu")
    lhs = moe_shapes.make_lhs(shape)
    rhs = inputs.gate_up_weights(transpose)
    sizes = moe_shapes.group_sizes(shape, routing)
    sizes[-1] = max(0, sizes[-1] - 3)  # three rows past sum(group_sizes) must come out zero
    gs = jnp.asarray(sizes, jnp.int32)
    ref = np.asarray(jax.block_until_ready(reference_of(problem)(lhs, rhs, gs)))
    total = sum(sizes)
    heuristic = backend.heuristic(problem, current_fingerprint())
    results = {}
    for name, config in {"heuristic": heuristic, **configs}.items():
        if budget.left() <= 0:
            results[name] = {"config": config.to_dict(), "skipped": "budget spent", "ok": False}
            continue
        try:
            fn = jax.jit(backend.build(problem, config))
            jax.block_until_ready(jnp.full((problem.m, problem.out_n), jnp.nan, jnp.bfloat16)).delete()
            out = np.asarray(fn(lhs, rhs, gs).astype(jnp.float32))
            err = _rel_err(out, ref)
            tail_zero = not out[total:].any()
            results[name] = {
                "config": config.to_dict(),
                "rel_err": err,
                "finite": bool(np.isfinite(out).all()),
                "tail_zero": bool(tail_zero),
                "ok": bool(err < TOLERANCE and tail_zero),
            }
        except Exception as e:  # a config failing (compile, resources) is recorded per config
            results[name] = {"config": config.to_dict(), "error": _error(e), "ok": False}
    return {"problem": problem.key, "group_sizes": sizes, "configs": results}


def time_gate_up(inputs: Inputs, tokens: int, routing: str, configs: dict, timer, budget: Budget) -> dict:
    import jax.numpy as jnp

    from moetune.kernels import grouped_matmul, grouped_matmul_swiglu, registry
    from moetune.kernels.api import explain
    from moetune.kernels.moe.reference import gated_activation
    from moetune.kernels.problem import Problem

    shape = Shape("gate_up", tokens)
    lhs = moe_shapes.make_lhs(shape)
    rhs = inputs.gate_up_weights(False)
    gs = jnp.asarray(moe_shapes.group_sizes(shape, routing), jnp.int32)
    args = (lhs, rhs, gs)
    result: dict[str, Any] = {}

    def fused(x, w, sizes):
        return grouped_matmul_swiglu(x, w, sizes, backend="mosaic_gpu")

    def unfused(x, w, sizes):
        return gated_activation("swiglu", grouped_matmul(x, w, sizes, backend="mosaic_gpu"))

    def gemm_only(x, w, sizes):
        return grouped_matmul(x, w, sizes, backend="mosaic_gpu")

    for name, fn, op in (
        ("fused_dispatched", fused, SWIGLU),
        ("unfused_dispatched", unfused, "grouped_matmul"),
        ("unfused_gemm_only", gemm_only, "grouped_matmul"),
    ):
        try:
            chosen = explain(lhs, rhs, gs, op=op, backend="mosaic_gpu")
            result[name] = {
                **_summary(_time(fn, args, timer)),
                "config": chosen.config.to_dict(),
                "source": chosen.source,
            }
        except Exception as e:  # recorded; the other paths still run
            result[name] = {"error": _error(e)}
    problem = Problem(SWIGLU, m=shape.m, k=shape.k, n=shape.n, g=moe_shapes.EXPERTS)
    backend = registry.get("mosaic_gpu")
    per_config = {}
    for name, config in configs.items():
        if budget.left() <= 0:
            per_config[name] = {"config": config.to_dict(), "skipped": "budget spent"}
            continue
        try:
            per_config[name] = {
                "config": config.to_dict(),
                **_summary(_time(backend.build(problem, config), args, timer)),
            }
        except Exception as e:  # e.g. a config the problem's constraints refuse
            per_config[name] = {"config": config.to_dict(), "error": _error(e)}
    result["fused_configs"] = per_config
    fused_ms = [
        v["median_ms"] for v in [result["fused_dispatched"], *per_config.values()] if "median_ms" in v
    ]
    if fused_ms and "median_ms" in result.get("unfused_dispatched", {}):
        result["speedup_best_fused_vs_unfused"] = result["unfused_dispatched"]["median_ms"] / min(fused_ms)
    return result


def check_and_time_layer(inputs: Inputs, tokens: int, timer) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from moetune.kernels.moe import moe_mlp
    from moetune.kernels.moe.reference import moe_mlp_reference

    k1, k2 = jax.random.split(jax.random.key(tokens))
    x = jax.random.normal(k1, (tokens, HIDDEN), jnp.bfloat16)
    logits = jax.random.normal(k2, (tokens, moe_shapes.EXPERTS), jnp.float32)
    w_gate_up, w_down = inputs.gate_up_weights(False), inputs.down_weights()
    args = (x, logits, w_gate_up, w_down)
    result: dict[str, Any] = {}
    outs = {}
    for name, fuse in (("fused", True), ("unfused", False)):

        def layer(*a, fuse=fuse):
            return moe_mlp(*a, top_k=moe_shapes.TOP_K, backend="mosaic_gpu", fuse=fuse)

        try:
            outs[name] = np.asarray(jax.jit(layer)(*args).astype(jnp.float32))
            result[name] = _summary(_time(layer, args, timer))
        except Exception as e:  # recorded; the other path still runs
            result[name] = {"error": _error(e)}
    try:
        reference = jax.jit(lambda *a: moe_mlp_reference(*a, top_k=moe_shapes.TOP_K))
        ref = np.asarray(reference(*(a.astype(jnp.float32) for a in args)))
        for name, out in outs.items():
            result[name]["rel_err_vs_f32_reference"] = _rel_err(out, ref)
            result[name]["correct"] = bool(_rel_err(out, ref) < 2e-2)
    except Exception as e:  # the dense float32 reference is large; its failure is not the layer's
        result["reference_error"] = _error(e)
    if len(outs) == 2:
        result["rel_err_fused_vs_unfused"] = _rel_err(outs["fused"], outs["unfused"])
    if "median_ms" in result.get("fused", {}) and "median_ms" in result.get("unfused", {}):
        result["speedup_fused_vs_unfused"] = result["unfused"]["median_ms"] / result["fused"]["median_ms"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--budget-s", type=float, default=500.0, help="stop starting new steps after this")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--skip", nargs="*", default=[], choices=["check", "gate_up", "layer"])
    args = parser.parse_args()
    budget = Budget(args.budget_s)
    payload: dict[str, Any] = {"budget_s": args.budget_s, "tokens": args.tokens, "records": []}
    save = lambda: moe_shapes.write_json(args.out, payload)  # noqa: E731
    try:
        payload["environment"] = moe_shapes.environment()
    except Exception as e:  # the environment is metadata: its failure must not stop the checks
        payload["environment"] = {"error": _error(e)}
    save()
    from moetune.kernels.backends.mosaic_gpu.timer import CuptiTimer
    from moetune.kernels.lookup import LOOKUP

    timer = CuptiTimer()
    inputs = Inputs()
    records = payload["records"]

    def check(tokens, transpose, routing):
        params = {"tokens": tokens, "transpose_rhs": transpose, "routing": routing}
        run = lambda: check_fused(inputs, tokens, transpose, routing, CONFIGS, budget)  # noqa: E731
        _step(records, budget, "check_swiglu", params, run, save)

    with LOOKUP.using_db(None):  # winners from the shipped packs only, as on a fresh machine
        # The essentials first, per token count, so that a spent budget costs only the extra checks.
        for tokens in args.tokens:
            if "check" not in args.skip:
                check(tokens, False, "balanced")
            if "gate_up" not in args.skip:
                run = lambda t=tokens: time_gate_up(inputs, t, "balanced", CONFIGS, timer, budget)  # noqa: E731
                _step(
                    records,
                    budget,
                    "time_gate_up_swiglu",
                    {"tokens": tokens, "routing": "balanced"},
                    run,
                    save,
                )
            if "layer" not in args.skip:
                run = lambda t=tokens: check_and_time_layer(inputs, t, timer)  # noqa: E731
                _step(records, budget, "moe_mlp_fused_vs_unfused", {"tokens": tokens}, run, save)
        if "check" not in args.skip:
            inputs.drop("w_down")
            for tokens in args.tokens:
                check(tokens, False, "zipf")
            inputs.drop("w_gate_up")
            for tokens in args.tokens:
                for routing in moe_shapes.ROUTINGS:
                    check(tokens, True, routing)
    checks = [c for r in records if r["kind"] == "check_swiglu" for c in r.get("configs", {}).values()]
    payload["summary"] = {
        "checks_ok": sum(bool(c.get("ok")) for c in checks),
        "checks_failed": sum(not c.get("ok") for c in checks),
        "steps_with_error": sum("error" in r for r in records),
        "steps_skipped": sum("skipped" in r for r in records),
    }
    save()
    print(payload["summary"], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
