"""The forward MoE block on one GPU, moetune's beside tokamax's, XLA's and PyTorch's, and stage by stage.

moetune's `moe_mlp` is timed against the same block on tokamax's and XLA's grouped GEMMs and in PyTorch on
`torch._grouped_mm`, and each stage of moetune's block on its own, in one process, on the development
shapes of lab/bench/dev_shapes.py.

The block is route (top-k of the router logits, renormalised over the chosen k), sort by expert, permute
(the row gather), the gate_up GEMM with SwiGLU, the down GEMM and the weighted combine: [T, H] tokens and
[T, E] logits in, [T, H] out, bf16 tokens and weights (bench_layer_grad.parameters). The logits, the
block's input, are computed once per case from a bf16 router in float32, so that no two experts tie and
every method routes each token to the same experts. Methods:
  * moetune: `moe_mlp` as a model calls it (routing_mode and decode_mode "auto", the SwiGLU fused into
    the gate_up GEMM where the backend serves that op): what a user gets;
  * moetune_unfused: `moe_mlp` with decode_mode "xla", the block as separate kernels (route, sort,
    permute, the two grouped GEMMs, combine);
  * moetune_fused: `moe_mlp` with decode_mode "kernel", the fused decode block (two kernels, routing
    included; kernels/moe/decode_block.py), where it fits (T <= its bound) and a skipped record elsewhere;
  * tokamax: `moe_mlp_using` on tokamax.ragged_dot(implementation="mosaic"), the surroundings identical;
  * xla: `moe_mlp_using` on jax.lax.ragged_dot, skipped past a ~40 GB [G, M, K] expansion;
  * torch_grouped_mm: the block in PyTorch (no autograd) on DLPack views of the same arrays.
Each peer's output is compared with moetune's before it is timed; one off by more than PARITY_MAX_REL_ERR
is an error record. Each JAX method's record also has its kernel count (the kernels of one call), each
kernel's median CUPTI time (where the block's time goes) and
its share of the HBM roofline: the bytes of the touched experts' weights (gate_up and down of every
expert some token chose) over the part's HBM read rate, against its median time. The stages are
moetune's own functions (kernels/moe/layer.py), each jitted on the materialised outputs of the stage
before, so that their sum can be read beside the whole block. Times
are CUPTI kernel time (every kernel of a call), the median over --runs calls. With --span, each JAX
method's record also has its span (block_span.py: the block chained as a model's layers run, by the wall
clock), which counts the gaps between its kernels and no overlap twice, and its share of the roofline.

    python3 lab/bench/bench_block.py --models qwen3-30b-a3b deepseek-v3 --tokens 1 128 4096 --out block.json
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import time
from pathlib import Path

from moetune_lab.bench import block_span, dev_shapes, moe_shapes, torch_timing
from moetune_lab.bench.bench_backward import rel_err, time_jax
from moetune_lab.bench.bench_layer_grad import parameters

DEFAULT_MODELS = ("qwen3-30b-a3b", "deepseek-v3", "deepseek-v3-ep8", "qwen3-next-80b-a3b")
DEFAULT_TOKENS = (1, 128, 4096)
METHODS = ("moetune", "moetune_unfused", "moetune_fused", "tokamax", "xla", "torch_grouped_mm")
STAGES = ("route", "permute", "gate_up", "down", "combine")
PEERS_OF_INTEREST = ("tokamax", "torch_grouped_mm")  # the fast peers; xla is the slow baseline
# bf16 blocks: the paths round the gate_up product and sum the GEMMs in different places and orders.
PARITY_MAX_REL_ERR = 2e-2
# jax.lax.ragged_dot on a GPU expands the rows over every expert ([G, M, K]) before one dense dot.
XLA_MAX_EXPANSION_BYTES = 40 * 10**9


# --- planning and records (no GPU needed) --------------------------------------------------------------


def xla_expansion_bytes(model: dev_shapes.Model, tokens: int) -> int:
    return tokens * model.top_k * model.experts * model.hidden * 2


def xla_skip_reason(model: dev_shapes.Model, tokens: int) -> str | None:
    expansion = xla_expansion_bytes(model, tokens)
    if expansion <= XLA_MAX_EXPANSION_BYTES:
        return None
    return f"ragged_dot would expand the rows to ~{expansion / 1e9:.0f} GB"


def ratios(ms: dict[str, float]) -> dict:
    """Each peer's time over moetune's (above 1: moetune is faster), and the faster of tokamax and torch
    over moetune's; empty without a moetune time."""
    if "moetune" not in ms:
        return {}
    out: dict = {"speedup": {peer: t / ms["moetune"] for peer, t in ms.items() if peer != "moetune"}}
    fast_peers = [ms[p] for p in PEERS_OF_INTEREST if p in ms]
    if fast_peers:
        out["peer_vs_moetune"] = min(fast_peers) / ms["moetune"]
    return out


def error_record(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}"[:300]}


def timed_ms(entries: dict[str, dict]) -> dict[str, float]:
    return {name: entry["median_ms"] for name, entry in entries.items() if "median_ms" in entry}


def case_record(
    model: dev_shapes.Model, tokens: int, methods: dict, stages: dict, roofline_ms: float | None = None
) -> dict:
    """One case of the JSON: the shape, every method's and stage's entry, the stages' sum (where every
    stage was timed), the HBM roofline and each timed method's share of it, and the ratios to moetune."""
    record = {"model": model.name, "tokens": tokens, "top_k": model.top_k, "experts": model.experts,
              "hidden": model.hidden, "ffn": model.ffn, "methods": methods, "stages": stages}  # fmt: skip
    if roofline_ms is not None:
        record["roofline_ms"] = roofline_ms
        for entry in methods.values():
            if "median_ms" in entry:
                entry["roofline_share"] = roofline_ms / entry["median_ms"]
            if entry.get("span_ms", 0) > 0:
                entry["span_roofline_share"] = roofline_ms / entry["span_ms"]
    stage_ms = timed_ms(stages)
    if set(stage_ms) == set(STAGES):
        record["stage_sum_ms"] = sum(stage_ms.values())
    return record | ratios(timed_ms(methods))


def skipped_record(model: dev_shapes.Model, tokens: int, reason: str) -> dict:
    return {"model": model.name, "tokens": tokens, "skipped": reason}


def case_line(record: dict) -> str:
    head = f"{record['model']} T={record['tokens']}:"
    if "methods" not in record:
        return f"{head} {record.get('skipped') or record.get('error')}"
    cells = []
    for name, entry in record["methods"].items():
        if "median_ms" in entry:
            cell = f"{entry['median_ms']:.3f} ms"
            extras = [f"{entry['kernels']} kernels"] if "kernels" in entry else []
            extras += [f"{entry['roofline_share']:.0%} of roofline"] if "roofline_share" in entry else []
            extras += [f"span {entry['span_ms']:.3f} ms"] if "span_ms" in entry else []
            cell += f" ({', '.join(extras)})" if extras else ""
        else:
            cell = entry.get("skipped") or entry["error"]
        cells.append(f"{name} {cell}")
    stage_sum, peer = record.get("stage_sum_ms"), record.get("peer_vs_moetune")
    cells.append("stages " + (f"{stage_sum:.3f} ms" if stage_sum is not None else "incomplete"))
    cells.append("peer/moetune " + (f"{peer:.3f}" if peer is not None else "-"))
    return f"{head} " + "; ".join(cells)


# --- the blocks and the stages -------------------------------------------------------------------------


def peer_gemm(method: str):
    """The grouped GEMM `moe_mlp_using` runs for a peer, returning the lhs's dtype as moetune's does."""
    import jax

    if method == "tokamax":
        import tokamax  # here, so that a missing tokamax is this method's error record

        # bench_gemm.py's calling convention (_tokamax_call).
        return lambda a, b, s: tokamax.ragged_dot(a, b, s, implementation="mosaic").astype(a.dtype)
    return lambda a, b, s: jax.lax.ragged_dot(a, b, s, preferred_element_type=a.dtype)


def jax_block(model: dev_shapes.Model, method: str):
    """jit of the block (x, logits, w_gate_up, w_down) -> [T, H] for a JAX method."""
    import jax

    from moetune.kernels.moe.layer import moe_mlp, moe_mlp_using

    own = {"moetune": "auto", "moetune_unfused": "xla", "moetune_fused": "kernel"}
    if method in own:
        return jax.jit(functools.partial(moe_mlp, top_k=model.top_k, decode_mode=own[method]))
    return jax.jit(functools.partial(moe_mlp_using, peer_gemm(method), top_k=model.top_k))


def fused_gate_up(permuted, rows, w_gate_up):
    """moetune's gate_up with SwiGLU as moe_mlp_sorted dispatches it: the fused op where the backend
    serves it, else the plain GEMM then the activation."""
    import jax

    from moetune.kernels import ops
    from moetune.kernels.api import call_op, grouped_matmul
    from moetune.kernels.moe.layer import _gate_up, serves

    m = rows.row_token.shape[0]
    fused_op, fused = ops.fusing("swiglu"), None
    lhs = jax.ShapeDtypeStruct((m, permuted.shape[1]), permuted.dtype)
    if fused_op is not None and serves(fused_op.name, lhs, w_gate_up):
        fused = functools.partial(call_op, fused_op.name, rows=m)
    gemm = functools.partial(grouped_matmul, rows=m)
    return _gate_up(gemm, permuted, rows, w_gate_up, "swiglu", fused)


def stage_fns(model: dev_shapes.Model) -> dict:
    """moetune's block cut at its stages, each jitted on what the stage before it produced."""
    import jax

    from moetune.kernels.api import grouped_matmul
    from moetune.kernels.moe.layer import _down_and_combine, _permute, route_rows

    def identity_gemm(h, w, s):  # the down output is given: _down_and_combine then only combines
        return h

    return {
        "route": jax.jit(lambda logits: route_rows(logits, model.top_k, renormalize=True)),
        "permute": jax.jit(_permute),
        "gate_up": jax.jit(fused_gate_up),
        "down": jax.jit(grouped_matmul),
        "combine": jax.jit(
            lambda down, rows, routing: _down_and_combine(identity_gemm, down, rows, None, routing)
        ),
    }


def stage_inputs(fns: dict, x, logits, w_gate_up, w_down) -> tuple[dict, object]:
    """Each stage's arguments, materialised by running the stages before it, and the last stage's output
    (the block's)."""
    routing, rows = fns["route"](logits)
    permuted = fns["permute"](x, rows)
    hidden = fns["gate_up"](permuted, rows, w_gate_up)
    down = fns["down"](hidden, w_down, rows.group_sizes)
    args = {
        "route": (logits,),
        "permute": (x, rows),
        "gate_up": (permuted, rows, w_gate_up),
        "down": (hidden, w_down, rows.group_sizes),
        "combine": (down, rows, routing),
    }
    return args, fns["combine"](down, rows, routing)


def torch_block(model: dev_shapes.Model):
    """The block in PyTorch, forward only: softmax over the experts in float32, top-k renormalised over
    the chosen k (moe_mlp's renormalize=True), a stable sort by expert, torch._grouped_mm twice, and the
    weighted index_add combine in float32, as moe_mlp sums."""
    import torch

    f, k = model.ffn, model.top_k

    def block(x, logits, w_gate_up, w_down):
        weights, experts = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)
        token = order // k
        offs = torch.cumsum(torch.bincount(flat, minlength=model.experts), 0).to(torch.int32)
        gate_up = torch._grouped_mm(x[token], w_gate_up, offs=offs)
        hidden = torch.nn.functional.silu(gate_up[:, :f]) * gate_up[:, f:]
        rows = torch._grouped_mm(hidden, w_down, offs=offs).float() * weights.flatten()[order][:, None]
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        return out.index_add_(0, token, rows).to(x.dtype)

    return block


# --- measuring -----------------------------------------------------------------------------------------


def parity(out, reference) -> dict:
    """{"rel_err": ...} of a peer's block output against moetune's (nothing without a reference); raises
    past PARITY_MAX_REL_ERR, so that a wrong block is an error record and is not timed."""
    if reference is None:
        return {}
    err = rel_err(out, reference)
    if not err < PARITY_MAX_REL_ERR:
        raise RuntimeError(f"relative error {err:.3e} against moetune's block")
    return {"rel_err": err}


def kernel_profile(fn, args, calls: int = 5) -> list[tuple[str, float]]:
    """(name, median ms over `calls` calls) of each kernel one call of `fn` runs, in order (CUPTI): where
    a block's time goes, kernel by kernel, on the inputs the block is timed on."""
    import statistics

    from jax.experimental.mosaic.gpu import profiler

    measured = []
    for _ in range(calls):
        out, timings = profiler.measure(fn, aggregate=False)(*args)
        del out
        measured.append(by_occurrence(timings))
    # CUPTI's records need not come in the same order every call: a kernel's times are matched by its
    # name and how many kernels of that name came before it, never by position alone.
    return [(key[0], statistics.median(t[key] for t in measured)) for key in measured[0]]


def by_occurrence(timings: list[tuple[str, float]]) -> dict[tuple[str, int], float]:
    """{(name, n): ms} of one call's kernels, n counting the earlier kernels of that name, in order."""
    seen: dict[str, int] = {}
    keyed = {}
    for name, ms in timings:
        keyed[(name, seen.get(name, 0))] = ms
        seen[name] = seen.get(name, 0) + 1
    return keyed


def touched_experts(logits, top_k: int) -> int:
    """How many experts some token routes to: the experts whose weights the block must read."""
    import jax
    import numpy as np

    return int(np.unique(np.asarray(jax.lax.top_k(logits, top_k)[1])).size)


def touched_weight_bytes(model: dev_shapes.Model, logits, itemsize: int = 2) -> int:
    """The gate_up and down weight bytes of the experts some token routes to: what the block must read."""
    return touched_experts(logits, model.top_k) * 3 * model.hidden * model.ffn * itemsize


def roofline_ms(model: dev_shapes.Model, logits) -> float:
    """The block's HBM bound: the touched experts' gate_up and down weights (bf16) over the part's HBM
    read rate."""
    import jax

    from moetune.kernels.backends.mosaic_gpu.hardware import hbm_bytes_per_s

    device = jax.devices()[0]
    rate = hbm_bytes_per_s(device.device_kind, str(getattr(device, "compute_capability", "")))
    return touched_weight_bytes(model, logits) / rate * 1e3


def measure_jax(model, method, args, runs, reference, timer, counter) -> tuple[dict, object]:
    """A JAX method's entry and its output: compiled, checked against `reference`, timed, its kernels
    profiled by `counter(fn, args)` ((name, ms) of each kernel of one call)."""
    import jax

    fn = jax_block(model, method).lower(*args).compile()
    out = jax.block_until_ready(fn(*args))
    checked = parity(out, reference)
    profile = counter(fn, args)
    counted = {
        "kernels": len(profile),
        "kernel_names": [name for name, _ in profile],
        "kernel_ms": [round(ms, 6) for _, ms in profile],
    }
    return torch_timing.summary(timer(fn, args, runs)) | checked | counted, out


def fused_skip_reason(model: dev_shapes.Model, args) -> str | None:
    """Why moe_mlp with decode_mode="kernel" does not run the fused block on these operands (None: it
    does)."""
    from moetune.kernels.moe.layer import decode_choice

    x, logits, w_gate_up, _ = args
    choice = decode_choice(x, logits, w_gate_up, model.top_k, decode_mode="kernel")
    return None if choice.config is not None else choice.reason


def block_decision(model: dev_shapes.Model, method: str, args) -> dict:
    """What moe_mlp ran for one of moetune's own methods: the fused block's config and where it came
    from (a tuned winner, the nearest tuned T, the heuristic), or why it kept the unfused path; a row of
    the block table is then reproducible and the block's cost model can be set beside it."""
    from moetune.kernels.moe.layer import decode_choice

    mode = {"moetune": "auto", "moetune_fused": "kernel"}.get(method)
    if mode is None:
        return {}
    x, logits, w_gate_up, _ = args
    choice = decode_choice(x, logits, w_gate_up, model.top_k, decode_mode=mode)
    if choice.config is None:
        return {"block": {"fused": False, "reason": choice.reason}}
    block = {"fused": True, "config": choice.config.to_dict(), "reason": choice.reason}
    if choice.explanation is not None:
        block["source"] = choice.explanation.source
    return {"block": block}


def measure_torch(model, args, runs, reference) -> dict:
    """The PyTorch block's entry, on DLPack views of the JAX arrays."""
    import jax
    import torch

    tensors = [torch.from_dlpack(a) for a in args]
    block = torch_block(model)
    out = jax.dlpack.from_dlpack(block(*tensors).contiguous())
    checked = parity(out, reference)
    samples, how = torch_timing.time_torch(lambda: block(*tensors), runs=runs)
    return torch_timing.summary(samples) | checked | {"timing": how}


def measure_methods(model, tokens, args, runs, methods, timer, counter) -> dict:
    """Every method's entry; moetune first, its output the reference the others are checked against."""
    entries, reference = {}, None
    for method in [m for m in METHODS if m in methods]:
        if method == "xla" and (reason := xla_skip_reason(model, tokens)):
            entries[method] = {"skipped": reason}
            continue
        if method == "moetune_fused" and (reason := fused_skip_reason(model, args)):
            entries[method] = {"skipped": f"the fused block does not run: {reason}"}
            continue
        try:
            if method == "torch_grouped_mm":
                entries[method] = measure_torch(model, args, runs, reference)
                continue
            entries[method], out = measure_jax(model, method, args, runs, reference, timer, counter)
            entries[method] |= block_decision(model, method, args)
            if method == "moetune":
                reference = out
        except Exception as e:  # noqa: BLE001 - a method that fails is a record, not the end of the run
            entries[method] = error_record(e)
    return entries


def measure_spans(model, args, entries: dict, runs: int, l2_bytes: int, clock=block_span.wall_seconds):
    """Each timed JAX method's span (block_span.py) added to its entry, on weight copies made once for
    the case; a case whose copies do not fit gets the reason instead."""
    import jax.numpy as jnp

    x, logits, w_gate_up, w_down = args
    count = block_span.copy_count(touched_weight_bytes(model, logits, w_down.dtype.itemsize), l2_bytes)
    timed = [m for m, e in entries.items() if m != "torch_grouped_mm" and "median_ms" in e]
    reason = block_span.copies_skip_reason(count, w_gate_up.nbytes + w_down.nbytes)
    if reason is not None:
        for method in timed:
            entries[method]["span_skipped"] = reason
        return
    try:
        copies = [(w_gate_up, w_down)]
        copies += [(jnp.array(w_gate_up, copy=True), jnp.array(w_down, copy=True)) for _ in range(count - 1)]
    except Exception as e:  # noqa: BLE001 - copies that do not fit in memory leave the CUPTI times
        for method in timed:
            entries[method]["span_error"] = error_record(e)["error"]
        return
    for method in timed:
        try:
            entries[method] |= block_span.span_ms(jax_block(model, method), x, logits, copies, runs, clock)
        except Exception as e:  # noqa: BLE001 - a span that fails leaves the method's CUPTI time
            entries[method]["span_error"] = error_record(e)["error"]


def measure_stages(model, args, runs, timer) -> dict:
    """Every stage's entry, each compiled and timed on materialised inputs."""
    try:
        fns = stage_fns(model)
        inputs, _ = stage_inputs(fns, *args)
    except Exception as e:  # noqa: BLE001 - the stages failing leaves the whole blocks' times
        return {stage: error_record(e) for stage in STAGES}
    entries = {}
    for stage in STAGES:
        try:
            fn = fns[stage].lower(*inputs[stage]).compile()
            entries[stage] = torch_timing.summary(timer(fn, inputs[stage], runs))
        except Exception as e:  # noqa: BLE001
            entries[stage] = error_record(e)
    return entries


def block_inputs(params, tokens: int) -> tuple:
    """(x, logits, w_gate_up, w_down) of the first `tokens` tokens; float32 logits: bf16 ones tie often
    among hundreds of experts, and torch.topk need not break ties as lax.top_k does."""
    import jax
    import jax.numpy as jnp

    x_all, router, w_gate_up, w_down = params
    x = x_all[:tokens]
    logits = jnp.dot(x, router, preferred_element_type=jnp.float32)
    return jax.block_until_ready((x, logits, w_gate_up, w_down))


def run_case(
    model,
    tokens: int,
    params,
    runs: int,
    methods,
    timer=time_jax,
    counter=kernel_profile,
    roofline=roofline_ms,
    spans=None,
) -> dict:
    """One (model, T) case's record; `timer(fn, args, runs)` gives the seconds of each call,
    `counter(fn, args)` the kernels of one call with their times, `roofline(model, logits)` the HBM
    bound in ms and `spans(model, args, entries, runs)`, where given, adds each method's span."""
    args = block_inputs(params, tokens)
    entries = measure_methods(model, tokens, args, runs, methods, timer, counter)
    if spans is not None:
        spans(model, args, entries, runs)
    stages = measure_stages(model, args, runs, timer)
    return case_record(model, tokens, entries, stages, roofline(model, args[1]))


# --- the command line ----------------------------------------------------------------------------------


def model_records(model, tokens_list: list[int], args, deadline: float):
    """The model's case records, one at a time, on one draw of its weights (for the largest T; a smaller T
    takes its first rows), freed before the next model's: DeepSeek-V3's gate_up alone is 15 GB."""
    if time.monotonic() > deadline:
        yield from (skipped_record(model, t, "budget spent") for t in tokens_list)
        return
    try:
        params = parameters(model, max(tokens_list))
    except Exception as e:  # noqa: BLE001 - a model that does not fit leaves the others
        yield from ({"model": model.name, "tokens": t} | error_record(e) for t in tokens_list)
        return
    spans = None
    if args.span:
        from moetune.kernels.backends.mosaic_gpu.timer import device_l2_bytes

        spans = functools.partial(measure_spans, l2_bytes=device_l2_bytes())
    for tokens in tokens_list:
        if time.monotonic() > deadline:
            yield skipped_record(model, tokens, "budget spent")
            continue
        try:
            yield run_case(model, tokens, params, args.runs, args.methods, spans=spans)
        except Exception as e:  # noqa: BLE001 - one case's failure (memory) leaves the others
            yield {"model": model.name, "tokens": tokens} | error_record(e)
    del params
    gc.collect()  # a traceback's frames may still hold the weights


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=list(DEFAULT_MODELS), choices=sorted(dev_shapes.MODELS)
    )
    parser.add_argument("--tokens", nargs="+", type=int, default=list(DEFAULT_TOKENS))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--budget-s", type=float, default=400.0, help="start no case past this many seconds")
    parser.add_argument(
        "--span", action="store_true", help="also each JAX method's span, chained as a model's layers run"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    payload = {"environment": moe_shapes.environment(), "cases": []}
    for name in args.models:
        for record in model_records(dev_shapes.MODELS[name], args.tokens, args, deadline):
            payload["cases"].append(record)
            args.out.write_text(json.dumps(payload, indent=1))
            print(case_line(record), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
