"""The fixed configs of the GPU tests take their search space's domain values: a config the backend's build
refuses (ConfigInvalid) would fail those tests on the GPU for a reason a CPU can see first."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from moetune.kernels.backends.mosaic_gpu import space
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem

pytest.importorskip("jax")

GPU_TESTS = Path(__file__).resolve().parents[3] / "gpu"
H200 = DeviceFingerprint("NVIDIA H200", "gpu", 132, 150 << 30, "9.0", "", "", "", "")


def _fixed_configs(module) -> dict[str, MosaicGpuConfig]:
    """Module-level configs, alone or in a dict of them."""
    found = {}
    for name, value in vars(module).items():
        if isinstance(value, MosaicGpuConfig):
            found[name] = value
        elif isinstance(value, dict):
            found |= {f"{name}[{k}]": v for k, v in value.items() if isinstance(v, MosaicGpuConfig)}
    return found


@pytest.mark.parametrize("path", sorted(GPU_TESTS.glob("test_mosaic_gpu_*.py")), ids=lambda p: p.stem)
def test_every_fixed_config_of_the_gpu_tests_takes_its_domain_values(path):
    module = importlib.import_module(f"tests.gpu.{path.stem}")
    problem = Problem("grouped_matmul", m=1024, k=2048, n=2048, g=8)
    outside = {
        name: reason
        for name, config in _fixed_configs(module).items()
        if (reason := space.domain_values(problem, config, H200)) is not None
    }
    assert not outside, outside
