"""The child process of problems.planned_problems: MaxText's RoutedMoE traced for one Target.

    python -m moetune.integrations.maxtext.trace '{"config": "/path/base.yml", "overrides": [...]}'

It prints one line, RESULT_PREFIX and then JSON: {"problems": [...]} or {"error": "..."}. It runs on CPU
devices of XLA's host platform, as many as the config's mesh has: their count must be set before jax
starts its backend, so this process does nothing else with jax before it is.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

# XLA's host platform only: the count of its devices is set below, before the backend starts.
os.environ["JAX_PLATFORMS"] = "cpu"

# Overrides every trace needs unless the user's own set them: no distributed runtime to join, and the
# run name MaxText requires.
TRACE_DEFAULTS = {"skip_jax_distributed_system": "True", "run_name": "moetune-trace"}
PARALLELISM_PREFIXES = ("ici_", "dcn_")


def main(argv: list[str]) -> int:
    from moetune.integrations.maxtext.problems import RESULT_PREFIX, Target

    try:
        target = Target.from_dict(json.loads(argv[1]))
        result: dict[str, Any] = {"problems": [p.to_dict() for p in trace(target)]}
    except Exception as e:  # the edge where a failure becomes the one line the parent reports
        result = {"error": _one_line(e)}
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


def trace(target: Any) -> list[Any]:
    argv = [None, target.config, *target.overrides]
    given = {item.split("=", 1)[0] for item in target.overrides}
    argv += [f"{key}={value}" for key, value in TRACE_DEFAULTS.items() if key not in given]
    _host_devices(target.devices or _mesh_devices(target))

    from maxtext.configs import pyconfig
    from maxtext.utils import maxtext_utils

    config = pyconfig.initialize(argv)
    if config.num_experts <= 1:
        raise ValueError(f"num_experts={config.num_experts}: the config has no routed MoE layer")
    mesh = maxtext_utils.get_mesh_from_config(config)
    name = config.model_name if config.model_name != "default" else os.path.basename(target.config)
    planned = []
    for workload in target.workloads:
        planned += _workload(config, mesh, name, workload)
    return planned


def _workload(config: Any, mesh: Any, name: str, workload: str) -> list[Any]:
    """The problems one workload's RoutedMoE dispatches, forward (and backward for train), in order."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from flax.linen import partitioning as nn_partitioning

    from moetune.integrations.maxtext import decode, hook
    from moetune.integrations.maxtext.layer import routed_moe
    from moetune.integrations.maxtext.problems import TracedProblem
    from moetune.kernels.api import recording
    from moetune.kernels.ops import moe_decode_block

    seq = {"train": config.max_target_length, "prefill": config.max_prefill_predict_length, "decode": 1}[
        workload
    ]
    batch = config.global_batch_size_to_train_on
    x = jax.ShapeDtypeStruct((batch, seq, config.emb_dim), config.dtype)
    with (
        hook.installed(),
        recording() as dispatched,
        decode.decisions() as decided,
        mesh,
        nn_partitioning.axis_rules(config.logical_axis_rules),
    ):
        layer = nnx.eval_shape(lambda: routed_moe(config, mesh))
        graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

        def forward(params: Any, rest: Any, x: Any) -> Any:
            return nnx.merge(graphdef, params, rest)(x)[0]

        if workload == "train":
            loss = lambda p, r, x: jnp.sum(forward(p, r, x).astype(jnp.float32))  # noqa: E731
            jax.eval_shape(jax.grad(loss, argnums=(0, 2)), params, rest, x)
        else:
            jax.eval_shape(forward, params, rest, x)
        tp = layer.get_tensor_parallelism_size()
    # A shard's tokens: the batch is split over every device but the tensor-parallel ranks, which share
    # their tokens (each computes all of their rows, on its slice of each expert's ffn).
    tokens = max(1, batch * seq * tp // math.prod(mesh.devices.shape))
    rows = tokens * config.num_experts_per_tok
    planned: dict[Any, Any] = {}
    for explanation in dispatched:
        problem = explanation.problem
        if problem in planned or problem.op == moe_decode_block.NAME:  # the block's: from `decided`
            continue
        # Which weight: wi is [G, emb, ffn] and wo [G, ffn, emb]; a dlhs problem takes it as [G, n, k].
        weight_rows = problem.n if problem.transpose_rhs else problem.k
        part = "wi" if weight_rows == config.emb_dim else "wo"
        label = f"{name} {workload} T={tokens} {part} {_pass(problem)}"
        planned[problem] = TracedProblem(problem, label, tokens, min(problem.m, rows))
    # The fused decode block, where the plug-in would run it for this layer once a sweep timed it faster
    # (decode_mode 'auto'): its problem's m is the layer's tokens, the whole batch on every shard.
    for decision in decided:
        block = decision.problem
        if block is not None and block not in planned:
            planned[block] = TracedProblem(block, f"{name} {workload} T={block.m} block", block.m, None)
    return list(planned.values())


def _pass(problem: Any) -> str:
    """forward, dlhs (the other weight layout) or drhs (the weight gradient)."""
    if problem.spec.out_grouped:
        return "drhs"
    return "dlhs" if problem.transpose_rhs else "forward"


def _mesh_devices(target: Any) -> int:
    """The product of the config's positive ici_* and dcn_* parallelisms, overrides applied (-1 fills the
    devices there are; here there are no more than the rest need)."""
    import omegaconf
    from maxtext.configs import pyconfig

    load = getattr(pyconfig, "_load_config", omegaconf.OmegaConf.load)
    raw = omegaconf.OmegaConf.merge(load(target.config), omegaconf.OmegaConf.from_cli(list(target.overrides)))
    sizes = [
        int(value)
        for key, value in raw.items()
        if isinstance(key, str)
        and key.startswith(PARALLELISM_PREFIXES)
        and key.endswith("_parallelism")
        and isinstance(value, int)
        and value > 0
    ]
    return math.prod(sizes)


def _host_devices(count: int) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = " ".join(lines[:3]) if lines else type(error).__name__
    return f"{type(error).__name__}: {text}"[:600]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
