"""The lab's GPU tests (the benchmark model's decode kernels) run only where jax sees a Hopper GPU
(compute capability 9.x); elsewhere they skip cleanly. On the GPU machine:
`python3 -m pytest lab/tests/gpu -m gpu -q`."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def hopper_or_reason() -> str:
    try:
        import jax

        gpus = jax.devices("gpu")
    except RuntimeError as e:  # jax raises RuntimeError when no GPU backend is present
        return f"jax has no GPU backend ({str(e).splitlines()[0]})"
    if any(str(getattr(d, "compute_capability", "")).startswith("9.") for d in gpus):
        return ""
    return "no Hopper GPU (compute capability 9.x) among: " + ", ".join(d.device_kind for d in gpus)


def pytest_collection_modifyitems(config, items):
    reason = hopper_or_reason()
    if reason:
        for item in items:
            if item.get_closest_marker("gpu") is not None:  # the marker, not a parametrize id
                item.add_marker(pytest.mark.skip(reason=reason))
