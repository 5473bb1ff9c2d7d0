"""The MoE implementations a model can run, by name; all take the same weights, so one copy serves all.

dense    every expert on every token (einsums), then a masked combine: the plain-JAX reference layer.
ragged   the routed layer with XLA's own grouped GEMM, jax.lax.ragged_dot: the untuned baseline.
moetune  the routed layer with moetune.kernels.grouped_matmul: tuned configs looked up at trace time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.moe import moe_mlp, moe_mlp_sorted, moe_mlp_using, pallas_mode
from moetune.kernels.moe.reference import moe_mlp_reference

Array = Any
# fn(x[T, H], router_logits[T, E], w_gate_up[E, H, 2F], w_down[E, F, H], *, top_k, routing_mode) -> [T, H];
# routing_mode: how the routed paths' top-k and sort run (moe_mlp's argument of that name).
MoeFn = Callable[..., Array]


def _dense(x: Array, router_logits: Array, w_gate_up: Array, w_down: Array, *, top_k: int, routing_mode: str):
    """The reference computes every expert and masks: it has no routing kernel to choose, so routing_mode
    is only checked."""
    pallas_mode.check(routing_mode, "routing_mode")
    return moe_mlp_reference(x, router_logits, w_gate_up, w_down, top_k=top_k)


MOE_PATHS: dict[str, MoeFn] = {
    "dense": _dense,
    "ragged": functools.partial(moe_mlp_using, jax.lax.ragged_dot),
    "moetune": moe_mlp,
}


# The paths that can also start from rows routed and gathered elsewhere (moe_mlp_sorted's arguments):
# fn(permuted[P, H], Routing, SortedRows, w_gate_up, w_down) -> [T, H].
SORTED_MOE_PATHS: dict[str, MoeFn] = {"moetune": moe_mlp_sorted}


def moe_path(name: str) -> MoeFn:
    if name not in MOE_PATHS:
        raise ConfigInvalid(f"unknown MoE path {name!r}; known: {', '.join(MOE_PATHS)}")
    return MOE_PATHS[name]
