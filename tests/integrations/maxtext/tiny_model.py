"""A tiny MaxText MoE model for the plug-in's tests: forward, loss, gradients and one SGD step, with
MaxText's own grouped GEMM and with moetune's, and how far apart the two land; and one of its routed MoE
layers at a decode step, where the plug-in may run moetune's fused decode block.

In a test process it is imported (one CPU device); for a mesh of several devices a test runs it as a
script (`on_host_devices`: `python tests/integrations/maxtext/tiny_model.py DEVICES CASES_JSON`), which
sets XLA's host device count before jax starts and prints one JSON line per case.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

# Two layers of 8 experts (top-2) over a 64-wide model: small enough to compile in seconds on a CPU. Dims
# are MaxText's base_* fields; a fully MoE model needs base_mlp_dim == base_moe_mlp_dim.
TINY = dict(
    run_name="moetune-tiny",
    enable_checkpointing=False,
    skip_jax_distributed_system=True,
    decoder_block="mixtral",
    num_experts=8,
    num_experts_per_tok=2,
    base_emb_dim=64,
    base_mlp_dim=96,
    base_moe_mlp_dim=96,
    base_num_query_heads=4,
    base_num_kv_heads=4,
    head_dim=16,
    base_num_decoder_layers=2,
    vocab_size=256,
    max_target_length=32,
    max_prefill_predict_length=16,
    per_device_batch_size=2,
    dtype="float32",
    weight_dtype="float32",
    attention="dot_product",
)
LEARNING_RATE = 0.1


def base_yml() -> str:
    import maxtext

    return os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")


def config(**overrides: Any) -> Any:
    from maxtext.configs import pyconfig

    return pyconfig.initialize([None, base_yml()], **(TINY | overrides))


def run(cfg: Any, *, moetune: bool) -> dict[str, Any]:
    """Logits, loss, gradients and the loss after one SGD step of the tiny model at a fixed seed, with
    moetune's plug-in installed or not, and the dispatches moetune made."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from flax.linen import partitioning as nn_partitioning
    from maxtext.utils import maxtext_utils, model_creation_utils

    from moetune.integrations import maxtext as moetune_maxtext
    from moetune.kernels import recording

    mesh = maxtext_utils.get_mesh_from_config(cfg)
    batch, length = cfg.global_batch_size_to_train_on, cfg.max_target_length
    tokens = jax.random.randint(jax.random.key(0), (batch, length), 0, cfg.vocab_size)
    targets = jnp.roll(tokens, -1, axis=1)
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    segments = jnp.ones((batch, length), jnp.int32)

    def loss_fn(model: Any) -> tuple[Any, Any]:
        logits = model(tokens, positions, decoder_segment_ids=segments, enable_dropout=False)
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)), targets[..., None], -1)
        return -jnp.mean(picked), logits

    def step(model: Any) -> tuple[Any, ...]:
        (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        params = nnx.state(model, nnx.Param)
        stepped = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, nnx.state(grads, nnx.Param))
        nnx.update(model, stepped)
        loss_after, _ = loss_fn(model)
        return loss, logits, nnx.state(grads, nnx.Param), loss_after

    plugin = moetune_maxtext.installed() if moetune else contextlib.nullcontext()
    with plugin, recording() as dispatched, mesh, nn_partitioning.axis_rules(cfg.logical_axis_rules):
        model = model_creation_utils.from_config(cfg, mesh=mesh, rngs=nnx.Rngs(params=0, dropout=1))
        # One program, as a training step runs: op by op, every primitive would compile on its own.
        loss, logits, grads, loss_after = nnx.jit(step)(model)
    return {
        "logits": logits,
        "loss": loss,
        "grads": grads,
        "loss_after": loss_after,
        "dispatched": list(dispatched),
    }


def compare(overrides: dict[str, Any], reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """moetune's run of the tiny model with `overrides` against MaxText's own with `reference` (the same
    overrides unless given: MaxText's own path cannot run some settings on a CPU)."""
    ours = run(config(**overrides), moetune=True)
    return differences(ours, run(config(**(overrides if reference is None else reference)), moetune=False))


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """How far moetune's run lands from MaxText's own (relative L2 errors), and what each dispatched."""
    import jax
    import numpy as np

    def rel(a: Any, b: Any) -> float:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

    grad_errors = jax.tree.leaves(jax.tree.map(rel, ours["grads"], theirs["grads"]))
    return {
        "logits": rel(ours["logits"], theirs["logits"]),
        "grads": max(grad_errors),
        "grad_leaves": len(grad_errors),
        "loss": [float(ours["loss"]), float(theirs["loss"])],
        "loss_after": [float(ours["loss_after"]), float(theirs["loss_after"])],
        "dispatched": sorted(
            {
                (e.problem.op, e.problem.m, e.problem.k, e.problem.n, e.problem.g, e.backend)
                for e in ours["dispatched"]
            }
        ),
        "maxtext_dispatched": len(theirs["dispatched"]),
    }


def decode_layer(cfg: Any, *, moetune: bool, decode_mode: str = "interpret", seq: int = 1) -> dict[str, Any]:
    """One routed MoE layer of the tiny model (integrations/maxtext/layer.py, fixed seed) on `seq` tokens
    of each of the global batch's sequences (one: a decode step), with moetune's plug-in installed at
    `decode_mode` or not: its output and load-balance loss, moetune's dispatches and the plug-in's
    decisions on its fused decode block."""
    import jax
    from flax import nnx
    from flax.linen import partitioning as nn_partitioning
    from maxtext.utils import maxtext_utils

    from moetune.integrations import maxtext as moetune_maxtext
    from moetune.integrations.maxtext.layer import routed_moe
    from moetune.kernels import recording

    mesh = maxtext_utils.get_mesh_from_config(cfg)
    x = jax.random.normal(jax.random.key(1), (cfg.global_batch_size_to_train_on, seq, cfg.emb_dim), cfg.dtype)
    plugin = moetune_maxtext.installed(decode_mode) if moetune else contextlib.nullcontext()
    with (
        plugin,
        recording() as dispatched,
        moetune_maxtext.decisions() as decided,
        mesh,
        nn_partitioning.axis_rules(cfg.logical_axis_rules),
    ):
        graphdef, params, rest = nnx.split(routed_moe(cfg, mesh), nnx.Param, ...)
        out, lb_loss, _ = jax.jit(lambda p, r, x: nnx.merge(graphdef, p, r)(x))(params, rest, x)
    return {"out": out, "lb_loss": lb_loss, "dispatched": list(dispatched), "decisions": list(decided)}


def decode_compare(
    overrides: dict[str, Any], reference: dict[str, Any] | None = None, decode_mode: str = "interpret"
) -> dict[str, Any]:
    """The decode layer with moetune's plug-in against MaxText's own (with `reference`'s overrides where
    given), as JSON: the output's relative L2 error, both load-balance losses, the ops moetune
    dispatched and the plug-in's decisions (fused or not, and why)."""
    import numpy as np

    ours = decode_layer(config(**overrides), moetune=True, decode_mode=decode_mode)
    theirs = decode_layer(config(**(overrides if reference is None else reference)), moetune=False)
    a, b = np.asarray(ours["out"], np.float64), np.asarray(theirs["out"], np.float64)
    return {
        "out": float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)),
        "lb_loss": [None if r["lb_loss"] is None else float(r["lb_loss"]) for r in (ours, theirs)],
        "ops": sorted({e.problem.op for e in ours["dispatched"]}),
        "fused": [d.fused for d in ours["decisions"]],
        "reasons": [d.reason for d in ours["decisions"]],
        "maxtext_dispatched": len(theirs["dispatched"]),
    }


def on_host_devices(devices: int, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """main() in a process of its own on `devices` CPU devices (their count is fixed when jax starts):
    each case's result, in order. A case runs `compare`, or with "decode" set `decode_compare`."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, __file__, str(devices), json.dumps(cases)],
        capture_output=True, text=True, timeout=600, cwd=root, env=os.environ | {"PYTHONPATH": str(root)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main(argv: list[str]) -> int:
    devices, cases = int(argv[1]), json.loads(argv[2])
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (
        f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    )
    for case in cases:
        run_case = decode_compare if case.get("decode") else compare
        print(json.dumps(run_case(case["overrides"], case.get("reference"))), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    sys.exit(main(sys.argv))
