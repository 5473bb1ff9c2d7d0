"""The MoE layer's forward and backward on one GPU: moetune's `moe_mlp` under `jax.grad` against the same
layer on XLA's `jax.lax.ragged_dot` and a PyTorch layer built from `torch._grouped_mm` (autograd, its
weight-gradient form included), timed in one process.

A step is the loss mean(out^2) of the routed SwiGLU MoE MLP and its gradients with respect to the tokens,
the router and both expert weights; bf16 parameters, uniform random routing from random logits. The time
is the CUPTI kernel time of a whole step (every kernel: routing, permutation, the GEMMs, the combine).
moetune's and XLA's gradients are compared before timing. moetune runs twice: with the SwiGLU fused into
the gate_up GEMM (its backward recomputes the product h) and with `fuse=False` (h kept for the backward,
one GEMM fewer, [T*k, 2F] more activation memory: what the torch layer does).

    python3 lab/bench/bench_layer_grad.py --models mixtral-8x7b qwen3-30b-a3b --tokens 4096 --out layer.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from moetune_lab.bench import dev_shapes, moe_shapes, torch_timing
from moetune_lab.bench.bench_backward import rel_err, time_jax

DEFAULT_MODELS = ("mixtral-8x7b", "qwen3-30b-a3b")


def parameters(model: dev_shapes.Model, tokens: int, seed: int = 0):
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(seed), 4)
    e, h, f = model.experts, model.hidden, model.ffn
    x = jax.random.normal(keys[0], (tokens, h), jnp.float32).astype(jnp.bfloat16)
    router = (jax.random.normal(keys[1], (h, e), jnp.float32) * h**-0.5).astype(jnp.bfloat16)
    w_gate_up = (jax.random.normal(keys[2], (e, h, 2 * f), jnp.float32) * h**-0.5).astype(jnp.bfloat16)
    w_down = (jax.random.normal(keys[3], (e, f, h), jnp.float32) * f**-0.5).astype(jnp.bfloat16)
    return x, router, w_gate_up, w_down


def jax_step(model: dev_shapes.Model, path: str):
    """jit(value_and_grad) of the layer's loss on moetune's moe_mlp ("moetune": the SwiGLU fused into the
    gate_up GEMM, its product recomputed in the backward; "moetune_unfused": fuse=False, the product kept,
    as the torch layer keeps it) or on jax.lax.ragged_dot ("xla")."""
    import jax
    import jax.numpy as jnp

    from moetune.kernels.moe.layer import moe_mlp, moe_mlp_using

    def layer(x, router, w_gate_up, w_down):
        logits = x @ router
        if path.startswith("moetune"):
            fuse = path == "moetune"  # moetune_unfused: h = x @ w_gate_up kept for the backward
            return moe_mlp(x, logits, w_gate_up, w_down, top_k=model.top_k, routing_mode="xla", fuse=fuse)
        ragged = lambda a, b, s: jax.lax.ragged_dot(a, b, s, preferred_element_type=a.dtype)  # noqa: E731
        return moe_mlp_using(ragged, x, logits, w_gate_up, w_down, top_k=model.top_k, routing_mode="xla")

    def loss(*params):
        return jnp.mean(layer(*params).astype(jnp.float32) ** 2)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))


def torch_step(model: dev_shapes.Model, params):
    """The same layer in PyTorch on the same parameters (DLPack copies that require grad)."""
    import torch

    x, router, w_gate_up, w_down = (torch.from_dlpack(p).clone().requires_grad_(True) for p in params)
    f, k = model.ffn, model.top_k

    def step():
        logits = x @ router
        weights, experts = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        order = torch.argsort(experts.flatten(), stable=True)
        token = order // k
        counts = torch.bincount(experts.flatten(), minlength=model.experts)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        h = torch._grouped_mm(x[token], w_gate_up, offs=offs)
        a = torch.nn.functional.silu(h[:, :f]) * h[:, f:]
        y = torch._grouped_mm(a, w_down, offs=offs) * weights.flatten()[order][:, None]
        out = torch.zeros_like(x).index_add(0, token, y)
        loss = (out.float() ** 2).mean()
        return torch.autograd.grad(loss, (x, router, w_gate_up, w_down))

    return step


def run_case(model: dev_shapes.Model, tokens: int, runs: int) -> dict:
    import jax

    params = parameters(model, tokens)
    flops = 3 * 2 * 3 * tokens * model.top_k * model.hidden * model.ffn  # fwd + 2x bwd, three GEMMs
    record: dict = {"model": model.name, "tokens": tokens, "gemm_flops": flops, "methods": {}}
    grads = {}
    for path in ("moetune", "moetune_unfused", "xla"):
        try:
            step = jax_step(model, path).lower(*params).compile()
            loss, grads[path] = jax.block_until_ready(step(*params))
            samples = time_jax(step, params, runs)
            record["methods"][path] = summary(samples, loss=float(loss))
        except Exception as e:  # noqa: BLE001 - a path that fails is reported, not fatal
            record["methods"][path] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    names = ("x", "router", "w_gate_up", "w_down")
    for path in ("moetune", "moetune_unfused"):
        if path in grads and "xla" in grads:
            pairs = zip(names, grads[path], grads["xla"], strict=True)
            record["grad_rel_err" if path == "moetune" else f"{path}_grad_rel_err"] = {
                n: rel_err(a, b) for n, a, b in pairs
            }
    try:
        step = torch_step(model, params)
        samples, how = torch_timing.time_torch(step, runs=runs)
        record["methods"]["torch_grouped_mm"] = summary(samples, timing=how)
    except Exception as e:  # noqa: BLE001
        record["methods"]["torch_grouped_mm"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    ms = {n: m["median_ms"] for n, m in record["methods"].items() if "median_ms" in m}
    if "moetune" in ms:
        record["speedup"] = {peer: t / ms["moetune"] for peer, t in ms.items() if peer != "moetune"}
    return record


def summary(samples: list[float], **extra) -> dict:
    return {"median_ms": statistics.median(samples) * 1e3, "samples_ms": [s * 1e3 for s in samples], **extra}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=list(DEFAULT_MODELS), choices=sorted(dev_shapes.MODELS)
    )
    parser.add_argument("--tokens", nargs="+", type=int, default=[4096])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    records = []
    for name in args.models:
        for tokens in args.tokens:
            record = run_case(dev_shapes.MODELS[name], tokens, args.runs)
            records.append(record)
            times = {n: round(m["median_ms"], 3) for n, m in record["methods"].items() if "median_ms" in m}
            print(f"{name} T={tokens}: ms {times} speedup {record.get('speedup')}", flush=True)
            args.out.write_text(
                json.dumps({"environment": moe_shapes.environment(), "cases": records}, indent=1)
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
