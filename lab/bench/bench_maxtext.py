"""MaxText's MoE on moetune's plug-in against the same MoE on MaxText's own grouped GEMM, in one process.

For a MaxText config (its YAML and key=value overrides, as MaxText's own commands take them), on the mesh
of the devices there are:
  * serve: the config's model in MaxText's inference engine (MaxEngine): prefill of one prompt of
    max_prefill_predict_length tokens, and decode steps of the engine's batch (per_device_batch_size per
    device), wall-clock per call as MaxText's inference microbenchmark measures them, and tokens/s;
  * layer: the routed MoE layer (RoutedMoE, weights drawn at random) on one batch of a shard's decode step
    (per_device_batch_size tokens), prefill (times max_prefill_predict_length) and training (times
    max_target_length): the forward, and for training the forward and backward;
  * step: the config's model (cut its layers with base_num_decoder_layers, which a model config only
    lets an override change with override_model_config=true, to fit one GPU): the loss and its gradients
    for one batch of training tokens.
Each runs with moetune's plug-in installed ("moetune") and without it ("maxtext": the route the config
names; MaxText's GPU model configs set megablox: false, jax.lax.ragged_dot), each compiled on its own,
outputs compared before anything is timed. --decode-mode is the plug-in's (moe_mlp's) for layers of up
to 32 tokens: "auto" (the default) runs the fused decode block where a sweep timed it faster, "kernel"
wherever it fits, "xla" never; each record's `decode_block` says what the plug-in decided and why.
Layer and step times are CUPTI kernel time (every kernel of a call), the median of --runs calls; serve
times are wall-clock, the median of --runs prefills and of --decode-steps decode steps.

    python3 lab/bench/bench_maxtext.py --out $OUT/maxtext.json -- .../maxtext/configs/base.yml \\
        model_name=mixtral-8x7b megablox=false weight_dtype=bfloat16 per_device_batch_size=1 \\
        max_target_length=4096 max_prefill_predict_length=2048 override_model_config=true \\
        base_num_decoder_layers=4 scan_layers=true param_scan_axis=0 attention=dot_product

lab/device/maxtext.sh runs it on one H200 as docs/maxtext.md reports it.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from moetune_lab.bench import moe_shapes
from moetune_lab.bench.bench_backward import rel_err, time_jax

WORKLOADS = ("decode", "prefill", "train")
CASES = ("serve", "layer", "step")
# Both paths sum the same float32 products in other orders, and round to the config's dtype.
PARITY_MAX_REL_ERR = {"float32": 1e-4, "bfloat16": 2e-2}
PATHS = ("moetune", "maxtext")


def route(config: Any) -> str:
    """The grouped GEMM MaxText's routed MoE calls under `config` when moetune's plug-in is not installed."""
    if config.use_tokamax_gmm:
        return "tokamax"
    return "megablox" if config.megablox else "ragged_dot"


def load_config(argv: list[str]) -> Any:
    from maxtext.configs import pyconfig

    given = {item.split("=", 1)[0] for item in argv[1:]}
    defaults = [
        f"{k}={v}"
        for k, v in (("run_name", "bench-maxtext"), ("enable_checkpointing", "False"))
        if k not in given
    ]
    return pyconfig.initialize([None, *argv, *defaults])


def _compiled(
    fn: Callable[..., Any], args: tuple, *, moetune: bool, decode_mode: str = "auto"
) -> tuple[Any, list, list]:
    """`fn` traced and compiled with the plug-in installed or not (the choice is made at trace time), the
    dispatches moetune made while it was traced (none without the plug-in) and the plug-in's decisions
    on its fused decode block."""
    import jax

    from moetune.integrations import maxtext as plugin
    from moetune.kernels import recording

    def fresh(*args: Any) -> Any:  # jax caches a function's trace by its identity: each path traces anew
        return fn(*args)

    with (
        _plugin(moetune, decode_mode),
        recording() as dispatched,
        plugin.decisions() as decided,
    ):
        return jax.jit(fresh).lower(*args).compile(), list(dispatched), list(decided)


def _plugin(moetune: bool, decode_mode: str) -> Any:
    from moetune.integrations import maxtext as plugin

    return plugin.installed(decode_mode) if moetune else contextlib.nullcontext()


def _decode_block(decided: list) -> list[str]:
    """The plug-in's decisions on its fused decode block, once each: which path ran a layer, and why."""
    return sorted({str(d) for d in decided})


def _tree_rel_err(out: Any, ref: Any) -> tuple[float, str]:
    """The largest relative error over the outputs' leaves, and which leaf it is (a gradient's path)."""
    import jax

    errors = jax.tree_util.tree_flatten_with_path(jax.tree.map(rel_err, out, ref))[0]
    path, worst = max(errors, key=lambda item: item[1])
    return worst, jax.tree_util.keystr(path)


def _engine_results_as_pytrees(maxengine: Any) -> None:
    """Without JetStream installed MaxText's engine returns its stand-in ResultTokens, which jax cannot
    return from a jitted call: registered here as the pytree JetStream's own class is."""
    import jax

    cls = maxengine.engine_api.ResultTokens
    if jax.tree_util.all_leaves([cls()]):  # not a pytree node yet
        static = ("tokens_idx", "valid_idx", "length_idx", "samples_per_slot")
        jax.tree_util.register_pytree_node(
            cls,
            lambda r: ((r.data, r.log_prob), tuple(getattr(r, k) for k in static)),
            lambda aux, kids: cls(data=kids[0], log_prob=kids[1], **dict(zip(static, aux, strict=True))),
        )


def _wall_samples(call: Callable[[], Any], runs: int) -> list[float]:
    import jax

    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(call())
        samples.append(time.perf_counter() - start)
    return samples


def serve_cases(config: Any, runs: int, decode_steps: int, decode_mode: str = "auto") -> list[dict]:
    """Prefill and decode in MaxText's engine, one engine per path (an engine's jitted steps are traced
    once, so the plug-in's choice sticks to it), both on the same random weights."""
    import jax
    from maxtext.inference.maxengine import maxengine

    from moetune.integrations import maxtext as plugin
    from moetune.kernels import recording

    _engine_results_as_pytrees(maxengine)
    prefill = {"name": "serve/prefill", "tokens": config.max_prefill_predict_length, "methods": {}}
    decode: dict[str, Any] = {"name": "serve/decode", "methods": {}}
    try:
        engines = {path: maxengine.MaxEngine(config) for path in PATHS}
        params = engines["maxtext"].load_params(rng=jax.random.PRNGKey(0))
        engines["moetune"].load_params(params=params)
        prompt = jax.random.randint(jax.random.PRNGKey(1), (prefill["tokens"],), 0, config.vocab_size)
        slots = engines["moetune"].max_concurrent_decodes
        decode["tokens"] = slots

        def prefill_call(engine: Any) -> Any:
            return engine.prefill(params=params, padded_tokens=prompt, true_length=prefill["tokens"])[0]

        states, first, dispatched = {}, {}, []
        for path, engine in engines.items():  # first calls compile: the plug-in is in place for moetune's
            with (
                _plugin(path == "moetune", decode_mode),
                recording() as d,
                plugin.decisions() as decided,
            ):
                first[path] = prefill_call(engine)["logits"]
                state = engine.init_decode_state()
                for slot in range(slots):
                    state = engine.insert(prefill_call(engine), state, slot)
                states[path] = engine.generate(params, state)[0]
            dispatched.append(list(d))
            if path == "moetune":
                prefill["decode_block"] = decode["decode_block"] = _decode_block(decided)
        prefill["dispatched"] = decode["dispatched"] = _dispatched(*dispatched)
        bound = _parity_bound(config)
        prefill["rel_err"] = rel_err(first["moetune"], first["maxtext"])
        decode["rel_err"] = rel_err(states["moetune"]["logits"], states["maxtext"]["logits"])
        for record in (prefill, decode):
            if not record["rel_err"] <= bound:
                raise RuntimeError(
                    f"{record['name']}: moetune's logits differ from MaxText's by {record['rel_err']:.3e} "
                    f"(> {bound})"
                )
        del first
        for path, engine in engines.items():
            prefill["methods"][path] = _summary(
                _wall_samples(lambda engine=engine: prefill_call(engine), runs), prefill["tokens"]
            )

            def step(engine: Any = engine, path: str = path) -> Any:
                states[path] = engine.generate(params, states[path])[0]
                return states[path]

            decode["methods"][path] = _summary(_wall_samples(step, decode_steps), slots)
        for record in (prefill, decode):
            record["speedup"] = _speedup(record["methods"])
    except Exception as e:  # the edge where a failure becomes the cases' record
        for record in (prefill, decode):
            if "speedup" not in record:
                record["error"] = f"{type(e).__name__}: {e}"[:1000]
    return [prefill, decode]


def _dispatched(moetune: list, maxtext: list) -> list[str]:
    """moetune's dispatches as text, once it is clear that the plug-in decided which path ran: the
    moetune path made some, MaxText's own none."""
    if not moetune or maxtext:
        raise RuntimeError("the plug-in did not decide which path ran: check the MaxText config's MoE route")
    return sorted({f"{e.problem.key} on {e.backend} ({e.source})" for e in moetune})


def _summary(samples: list[float], tokens: int | None = None) -> dict:
    """A path's samples in ms and their median; with `tokens` (what one sample processes), tokens/s."""
    median = statistics.median(samples)
    summary = {"median_ms": median * 1e3, "samples_ms": [s * 1e3 for s in samples]}
    return summary if tokens is None else summary | {"tokens_per_s": tokens / median}


def _speedup(methods: dict) -> float:
    return methods["maxtext"]["median_ms"] / methods["moetune"]["median_ms"]


def _parity_bound(config: Any) -> float:
    import jax.numpy as jnp

    return PARITY_MAX_REL_ERR.get(jnp.dtype(config.dtype).name, PARITY_MAX_REL_ERR["bfloat16"])


def layer_cases(
    config: Any,
    mesh: Any,
    workloads: tuple[str, ...],
    timer: Callable,
    runs: int,
    time_mismatched: bool = False,
    decode_mode: str = "auto",
) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from moetune.integrations.maxtext.layer import routed_moe

    graphdef, params, rest = nnx.split(routed_moe(config, mesh), nnx.Param, ...)

    def forward(params: Any, rest: Any, x: Any) -> Any:
        return nnx.merge(graphdef, params, rest)(x)[0]

    def forward_and_backward(params: Any, rest: Any, x: Any) -> Any:
        loss = lambda p, x: jnp.sum(forward(p, rest, x).astype(jnp.float32))  # noqa: E731
        return jax.grad(loss, argnums=(0, 1))(params, x)

    records = []
    batch = config.global_batch_size_to_train_on
    for workload in workloads:
        seq = {"decode": 1, "prefill": config.max_prefill_predict_length, "train": config.max_target_length}
        x = jax.random.normal(jax.random.key(1), (batch, seq[workload], config.emb_dim), config.dtype)
        fn = forward_and_backward if workload == "train" else forward
        name = f"layer/{workload}/{'forward+backward' if workload == 'train' else 'forward'}"
        tokens = batch * seq[workload]
        records.append(
            _compare(name, fn, (params, rest, x), config, timer, runs, tokens, time_mismatched, decode_mode)
        )
    return records


def step_case(
    config: Any,
    mesh: Any,
    timer: Callable,
    runs: int,
    time_mismatched: bool = False,
    decode_mode: str = "auto",
) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from maxtext.utils import model_creation_utils

    model = model_creation_utils.from_config(config, mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    batch, length = config.global_batch_size_to_train_on, config.max_target_length
    tokens = jax.random.randint(jax.random.key(0), (batch, length), 0, config.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    segments = jnp.ones((batch, length), jnp.int32)

    def loss_and_grads(params: Any, rest: Any, tokens: Any) -> Any:
        def loss(params: Any) -> Any:
            logits = nnx.merge(graphdef, params, rest)(
                tokens, positions, decoder_segment_ids=segments, enable_dropout=False
            )
            targets = jnp.roll(tokens, -1, axis=1)
            picked = jnp.take_along_axis(
                jax.nn.log_softmax(logits.astype(jnp.float32)), targets[..., None], -1
            )
            return -jnp.mean(picked)

        return jax.value_and_grad(loss)(params)

    return _compare(
        "step/train",
        loss_and_grads,
        (params, rest, tokens),
        config,
        timer,
        runs,
        batch * length,
        time_mismatched,
        decode_mode,
    )


def _compare(
    name: str,
    fn: Callable,
    args: tuple,
    config: Any,
    timer: Callable,
    runs: int,
    tokens: int,
    time_mismatched: bool = False,
    decode_mode: str = "auto",
) -> dict:
    """Both paths' executables, their outputs compared, then timed one after the other."""
    record: dict[str, Any] = {"name": name, "tokens": tokens, "methods": {}}
    try:
        compiled = {
            path: _compiled(fn, args, moetune=path == "moetune", decode_mode=decode_mode) for path in PATHS
        }
        exes = {path: exe for path, (exe, _, _) in compiled.items()}
        record["dispatched"] = _dispatched(compiled["moetune"][1], compiled["maxtext"][1])
        record["decode_block"] = _decode_block(compiled["moetune"][2])
        outs = {path: exe(*args) for path, exe in exes.items()}
        record["rel_err"], record["worst_output"] = _tree_rel_err(outs["moetune"], outs["maxtext"])
        del outs
        bound = _parity_bound(config)
        if not record["rel_err"] <= bound:
            message = (
                f"moetune's output differs from MaxText's by {record['rel_err']:.3e} (> {bound}), "
                f"most in {record['worst_output'] or 'the output'}"
            )
            if not time_mismatched:
                raise RuntimeError(message)
            record["parity_failed"] = message
        for path, exe in exes.items():
            record["methods"][path] = _summary(timer(exe, args, runs))
        record["speedup"] = _speedup(record["methods"])
    except Exception as e:  # the edge where a failure becomes the case's record
        record["error"] = f"{type(e).__name__}: {e}"[:1000]
    return record


def run(
    argv: list[str],
    cases: tuple[str, ...],
    workloads: tuple[str, ...],
    runs: int,
    timer: Callable = time_jax,
    decode_steps: int = 32,
    time_mismatched: bool = False,
    decode_mode: str = "auto",
) -> dict:
    from flax.linen import partitioning as nn_partitioning
    from maxtext.utils import maxtext_utils

    config = load_config(argv)
    mesh = maxtext_utils.get_mesh_from_config(config)
    payload = {
        "config": argv,
        "model_name": config.model_name,
        "layers": config.num_decoder_layers,
        "route": route(config),
        "decode_mode": decode_mode,
        "records": [],
    }
    if "serve" in cases:  # the engine builds its own mesh
        payload["records"] += serve_cases(config, runs, decode_steps, decode_mode)
    with mesh, nn_partitioning.axis_rules(config.logical_axis_rules):
        if "layer" in cases:
            payload["records"] += layer_cases(
                config, mesh, workloads, timer, runs, time_mismatched, decode_mode
            )
        if "step" in cases:
            payload["records"].append(step_case(config, mesh, timer, runs, time_mismatched, decode_mode))
    return payload


def print_table(payload: dict) -> None:
    print(f"{payload['model_name']}: ms, median (serve: wall-clock, else CUPTI); speedup: MaxText / moetune")
    for r in payload["records"]:
        if "error" in r:
            print(f"  {r['name']:<28} error: {r['error'][:200]}")
            continue
        m = r["methods"]
        ours, theirs = m["moetune"]["median_ms"], m["maxtext"]["median_ms"]
        print(
            f"  {r['name']:<28} tokens {r['tokens']:>7}  moetune {ours:9.3f}  maxtext {theirs:9.3f}  "
            f"speedup {r['speedup']:.2f}x  rel err {r['rel_err']:.1e}"
            + ("  (outputs differ)" if "parity_failed" in r else "")
            + "".join(
                f"  {path} {m[path]['tokens_per_s']:,.1f} tok/s"
                for path in PATHS
                if "tokens_per_s" in m[path]
            )
        )
        for decision in r.get("decode_block", []):
            print(f"    {decision}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated: {', '.join(CASES)}")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="the layer's token counts")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument(
        "--time-mismatched",
        action="store_true",
        help="layer and step: time both paths even where their outputs differ (the record names it)",
    )
    parser.add_argument("--decode-steps", type=int, default=32, help="serve: decode steps timed")
    parser.add_argument(
        "--decode-mode",
        default="auto",
        choices=("auto", "kernel", "interpret", "xla"),
        help="the plug-in's for layers of up to 32 tokens: when its fused decode block runs them",
    )
    parser.add_argument("config", nargs="+", help="the MaxText YAML, then its key=value overrides")
    args = parser.parse_args()
    cases, workloads = tuple(args.cases.split(",")), tuple(args.workloads.split(","))
    if set(cases) - set(CASES) or set(workloads) - set(WORKLOADS):
        parser.error(f"--cases from {', '.join(CASES)}; --workloads from {', '.join(WORKLOADS)}")
    start = time.monotonic()
    payload = run(
        args.config,
        cases,
        workloads,
        args.runs,
        decode_steps=args.decode_steps,
        time_mismatched=args.time_mismatched,
        decode_mode=args.decode_mode,
    )
    payload |= {
        "environment": moe_shapes.environment(),
        "command": " ".join(sys.argv),
        "wall_s": time.monotonic() - start,
    }
    moe_shapes.write_json(args.out, payload)
    print_table(payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
