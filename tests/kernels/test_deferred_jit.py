"""kernels/deferred_jit.py: the function is jitted (traced once per static arguments) at its first call."""

from __future__ import annotations

import jax.numpy as jnp

from moetune.kernels.deferred_jit import deferred_jit


def test_a_deferred_function_traces_once_per_static_arguments_and_computes_as_jitted():
    traces = []

    @deferred_jit(static_argnames=("scale",))
    def scaled(x, scale):
        traces.append(scale)  # runs while tracing only
        return x * scale

    x = jnp.arange(4.0)
    assert traces == []  # nothing traced at definition
    assert scaled(x, scale=2.0).tolist() == [0.0, 2.0, 4.0, 6.0]
    assert scaled(x + 1, scale=2.0).tolist() == [2.0, 4.0, 6.0, 8.0]
    assert scaled(x, scale=3.0).tolist() == [0.0, 3.0, 6.0, 9.0]
    assert traces == [2.0, 3.0]
    assert scaled.__name__ == "scaled"
