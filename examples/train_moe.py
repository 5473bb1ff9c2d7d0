"""Train a small MoE transformer with moetune's kernels or with XLA's ragged_dot, and compare.

    python examples/train_moe.py --backend auto --steps 300     # moetune dispatch (tuned winners)
    python examples/train_moe.py --backend xla --steps 300      # jax.lax.ragged_dot, XLA's own kernel
    python examples/train_moe.py --steps 20 --json              # losses, step times, tokens/s as JSON
    python examples/train_moe.py --dim 512 --heads 8 --ffn 1024 --batch 64 --seq 512 --moe-dtype bfloat16

The model: token and position embeddings, `layers` pre-norm blocks of causal multi-head attention and
a routed MoE MLP (top-k of `experts` SwiGLU experts), a final RMSNorm and tied output logits; next-token
cross-entropy, optax's adamw. Parameters are float32; the experts' GEMMs run in `--moe-dtype` (float32,
or bfloat16, which moetune's Hopper kernels serve). The data are random token sequences that follow a
fixed random successor table (token t+1 = table[token t], from a random first token), so the loss has
something to learn and falls from log(vocab) towards zero.

With `--backend auto` the MoE MLP is `moetune.kernels.moe_mlp`: its gate_up (with the SwiGLU fused
where the backend serves it) and down GEMMs, and in the backward each GEMM's dlhs and drhs, are looked
up at trace time (tune them with `moetune tune --model M --with-backward`). With `--backend xla` the same
layer runs every GEMM as jax.lax.ragged_dot and differentiates it with jax's own rule. Both paths route
with XLA's ops (routing_mode="xla": a routing kernel has no gradient), start from the same parameters
and see the same batches, so their loss curves follow each other, apart by how each path rounds its
GEMMs (on a GPU, XLA's float32 matmuls may run at TensorFloat-32; bfloat16 rounds each GEMM's output).

Each step is timed from its batch being ready to its new parameters, optimizer state and loss being
ready. The first step compiles and is reported apart (first_step_s); step_times_s holds every later
step's wall time, step_s their median and tokens_per_s the batch's tokens over that median; kernels
lists each GEMM moetune dispatched (problem key, backend, where its config came from; none with
`--backend xla`). `--json`
prints them with the losses of every step, the config, and where the run ran (date, command, device,
versions): `python3 -m moetune_lab.baselines add-example` records an `auto` and an `xla` run of one
config as a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import platform
import shlex
import statistics
import sys
import time
from typing import Any, TextIO

import jax
import jax.numpy as jnp
import optax

from moetune.kernels import moe_mlp, recording
from moetune.kernels.device import current_fingerprint
from moetune.kernels.moe.layer import moe_mlp_using

BACKENDS = ("xla", "auto")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    vocab: int = 256
    dim: int = 64
    heads: int = 4
    layers: int = 2
    experts: int = 8
    top_k: int = 2
    ffn: int = 128
    seq: int = 64
    batch: int = 8
    lr: float = 3e-3
    weight_decay: float = 0.01
    steps: int = 300
    log_every: int = 25
    seed: int = 0
    moe_dtype: str = "float32"


def init_params(config: TrainConfig, key: jax.Array) -> dict[str, Any]:
    keys = iter(jax.random.split(key, 3 + 6 * config.layers))

    def normal(shape, fan_in):
        return jax.random.normal(next(keys), shape, jnp.float32) / jnp.sqrt(fan_in)

    d, e, f = config.dim, config.experts, config.ffn
    layers = [
        {
            "attn_norm": jnp.ones((d,)),
            "wqkv": normal((d, 3 * d), d),
            "wo": normal((d, d), d),
            "mlp_norm": jnp.ones((d,)),
            "router": normal((d, e), d),
            "w_gate_up": normal((e, d, 2 * f), d),
            "w_down": normal((e, f, d), f),
        }
        for _ in range(config.layers)
    ]
    return {
        "embed": normal((config.vocab, d), d),  # tied: logits near unit size at the start
        "pos": normal((config.seq, d), d),
        "final_norm": jnp.ones((d,)),
        "layers": layers,
    }


def rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def attention(x: jax.Array, layer: dict[str, Any], heads: int) -> jax.Array:
    batch, seq, dim = x.shape
    q, k, v = jnp.split(x @ layer["wqkv"], 3, axis=-1)
    q, k, v = (t.reshape(batch, seq, heads, dim // heads) for t in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(dim // heads)
    causal = jnp.tril(jnp.ones((seq, seq), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e30), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, seq, dim) @ layer["wo"]


def _ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=lhs.dtype)


def moe_block(x: jax.Array, layer: dict[str, Any], config: TrainConfig, backend: str) -> jax.Array:
    tokens = x.reshape(-1, x.shape[-1])
    logits = tokens @ layer["router"]
    # The experts' GEMMs run in moe_dtype (their gradients flow back to the float32 parameters through
    # the casts); the router stays float32.
    dtype = jnp.dtype(config.moe_dtype)
    weights = (layer["w_gate_up"].astype(dtype), layer["w_down"].astype(dtype))
    tokens = tokens.astype(dtype)
    if backend == "auto":
        out = moe_mlp(tokens, logits, *weights, top_k=config.top_k, routing_mode="xla")
    else:
        out = moe_mlp_using(_ragged_dot, tokens, logits, *weights, top_k=config.top_k, routing_mode="xla")
    return out.astype(x.dtype).reshape(x.shape)


def loss_fn(params: dict[str, Any], batch: jax.Array, config: TrainConfig, backend: str) -> jax.Array:
    inputs, targets = batch[:, :-1], batch[:, 1:]
    x = params["embed"][inputs] + params["pos"][: inputs.shape[1]]
    for layer in params["layers"]:
        x = x + attention(rms_norm(x, layer["attn_norm"]), layer, config.heads)
        x = x + moe_block(rms_norm(x, layer["mlp_norm"]), layer, config, backend)
    logits = rms_norm(x, params["final_norm"]) @ params["embed"].T
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def batches(config: TrainConfig):
    """Sequences of seq + 1 tokens following a fixed random successor table; the same for every path."""
    key = jax.random.key(config.seed + 1)
    table_key, key = jax.random.split(key)
    table = jax.random.permutation(table_key, config.vocab)

    def follow(first):
        def step(token, _):
            return table[token], token

        return jax.lax.scan(step, first, None, length=config.seq + 1)[1]

    sequences = jax.jit(jax.vmap(follow))
    while True:
        key, draw = jax.random.split(key)
        yield sequences(jax.random.randint(draw, (config.batch,), 0, config.vocab))


def train(config: TrainConfig, backend: str, *, log: TextIO | None = None) -> dict[str, Any]:
    """Train for config.steps: the losses of every step, the wall time of each step after the first
    (which compiles), their median and tokens/s. Loss lines go to `log` (None: stdout)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    optimizer = optax.adamw(config.lr, weight_decay=config.weight_decay)
    params = init_params(config, jax.random.key(config.seed))
    state = optimizer.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, config, backend)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses, times = [], []
    data = batches(config)
    for index in range(config.steps):
        # The batch is drawn on the device too: wait for it, so that its draw is not timed as the step's.
        batch = jax.block_until_ready(next(data))
        started = time.perf_counter()
        # The first step traces the model: what moetune dispatched is recorded then.
        with recording() if index == 0 else contextlib.nullcontext([]) as calls:
            params, state, loss = jax.block_until_ready(step(params, state, batch))
        times.append(time.perf_counter() - started)
        if index == 0:
            kernels = list({(c.problem.key, c.backend, c.source): None for c in calls})
        losses.append(float(loss))
        if config.log_every and (index % config.log_every == 0 or index == config.steps - 1):
            print(f"[{backend}] step {index:4d}  loss {losses[-1]:.4f}", file=log, flush=True)
    step_times = times[1:]
    # A one-step run has only the compiling step; its step_s is that step's (and step_times_s is empty).
    step_s = statistics.median(step_times) if step_times else times[0]
    return {
        "backend": backend,
        "config": dataclasses.asdict(config),
        "losses": losses,
        "first_step_s": times[0],
        "step_times_s": step_times,
        "step_s": step_s,
        "tokens_per_s": config.batch * config.seq / step_s,
        "kernels": [{"problem": key, "backend": name, "source": source} for key, name, source in kernels],
    }


def environment(argv: list[str]) -> dict[str, Any]:
    """Where a run ran, as lab/model/cli.py records it: date, command, device, versions."""

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": shlex.join(["python3", "examples/train_moe.py", *argv]),
        "device": current_fingerprint().to_dict(),
        "versions": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "jaxlib": version("jaxlib"),
            "optax": version("optax"),
            "moetune": version("moetune"),
        },
    }


# The flags that set TrainConfig fields, with their help; each defaults to the field's default.
FLAGS = {
    "steps": "steps to train; the first compiles and is not among step_times_s",
    "log_every": "print the loss every N steps (0: never)",
    "batch": "sequences per step",
    "seq": "tokens per sequence",
    "dim": "model width",
    "heads": "attention heads (a divisor of --dim)",
    "layers": "transformer blocks",
    "experts": "experts per MoE MLP",
    "top_k": "experts each token is routed to",
    "ffn": "each expert's hidden width",
    "seed": "parameters' and data's seed",
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: moetune dispatch")
    for field, text in FLAGS.items():
        default = getattr(TrainConfig, field)
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, default=default, help=text)
    parser.add_argument(
        "--moe-dtype",
        choices=("float32", "bfloat16"),
        default=TrainConfig.moe_dtype,
        help="dtype of the experts' GEMMs (moetune's Hopper kernels serve bfloat16)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the result as one JSON object (loss lines to stderr)"
    )
    args = parser.parse_args(argv)
    for field in FLAGS:
        least = {"seed": None, "log_every": 0}.get(field, 1)
        if least is not None and getattr(args, field) < least:
            parser.error(f"--{field.replace('_', '-')} must be at least {least}")
    if args.dim % args.heads:
        parser.error(f"--dim {args.dim} is not a multiple of --heads {args.heads}")
    if args.top_k > args.experts:
        parser.error(f"--top-k {args.top_k} is more than --experts {args.experts}")
    config = TrainConfig(**{field: getattr(args, field) for field in FLAGS}, moe_dtype=args.moe_dtype)
    result = train(config, args.backend, log=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result | environment(argv)))
    else:
        print(
            f"[{args.backend}] final loss {result['losses'][-1]:.4f}; step {result['step_s'] * 1e3:.1f} ms "
            f"(first, compiling: {result['first_step_s']:.1f} s); {result['tokens_per_s']:.0f} tokens/s"
        )


if __name__ == "__main__":
    main()
