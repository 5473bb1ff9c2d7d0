"""The Hopper kernel run by Pallas's GPU interpreter on the CPU takes seconds to minutes per case: those
modules are the second tier (marked slow here, by file). The space, config, cost model and backend tests
stay in the fast tier."""

from __future__ import annotations

import pytest

INTERPRETED = {
    "test_mosaic_gpu_kernel_cpu.py",
    "test_mosaic_gpu_swiglu_cpu.py",
    "test_mosaic_gpu_fp8_cpu.py",
    "test_mosaic_gpu_drhs_cpu.py",
    "test_mosaic_gpu_finegrained_cpu.py",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in INTERPRETED and item.path.parent.name == "mosaic_gpu":
            item.add_marker(pytest.mark.slow)
