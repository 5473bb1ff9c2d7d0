"""GPU tests run only where jax sees a Hopper GPU (compute capability 9.x); elsewhere they skip cleanly.

Run them on the GPU machine with `python3 -m pytest tests/gpu -m gpu -q -o faulthandler_timeout=60`: a test
still running after 60 s then prints every thread's stack, which shows where a hung kernel or timer waits
(a run cut at a deadline otherwise leaves no trace of it). The whole suite takes longer than one device
call: `GPU_SHARD=i bash lab/device/gpu_tests.sh` runs one of four shards (pytest-shard's
`--shard-id i --num-shards 4`) and `lab/bench/gpu_test_counts.py` adds up their JUnit files.
"""

from __future__ import annotations

import functools

import pytest


@functools.cache
def hopper_device_or_reason() -> tuple[object | None, str]:
    try:
        import jax

        gpus = jax.devices("gpu")
    except RuntimeError as e:  # jax raises RuntimeError when no GPU backend is present
        return None, f"jax has no GPU backend ({str(e).splitlines()[0]})"
    for device in gpus:
        if str(getattr(device, "compute_capability", "")).startswith("9."):
            return device, ""
    kinds = ", ".join(f"{d.device_kind} ({getattr(d, 'compute_capability', '?')})" for d in gpus)
    return None, f"no Hopper GPU (compute capability 9.x) among: {kinds}"


def pytest_collection_modifyitems(config, items):
    device, reason = hopper_device_or_reason()
    if device is not None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        # The marker, not item.keywords: keywords also hold parametrize ids, and an id that says "gpu"
        # would silently skip a CPU test.
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
