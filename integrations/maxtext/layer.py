"""MaxText's routed MoE layer on its own, built from a config as MaxText's MoE decoders build it: what the
problem trace (trace.py) and the benchmark (lab/bench/bench_maxtext.py) run."""

from __future__ import annotations

from typing import Any


def routed_moe(config: Any, mesh: Any, seed: int = 0) -> Any:
    """A RoutedMoE of the config's experts, top-k, widths and dtypes on `mesh` (call it under the mesh and
    the config's logical axis rules; nnx.eval_shape of it makes no weights)."""
    from flax import nnx
    from maxtext.layers import moe
    from maxtext.layers.initializers import nd_dense_init

    return moe.RoutedMoE(
        config=config,
        num_experts=config.num_experts,
        num_experts_per_tok=config.num_experts_per_tok,
        mesh=mesh,
        kernel_init=nd_dense_init(1.0, "fan_in", "truncated_normal"),
        kernel_axes=("embed", None),
        intermediate_dim=config.moe_mlp_dim,
        dtype=config.dtype,
        weight_dtype=config.weight_dtype,
        rngs=nnx.Rngs(params=seed),
    )
