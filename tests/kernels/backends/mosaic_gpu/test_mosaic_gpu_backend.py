"""The mosaic_gpu backend's contract on machines without a Hopper GPU (CI): it declines with a reason."""

from __future__ import annotations

import dataclasses

import pytest

from moetune.kernels import registry
from moetune.kernels.backends.mosaic_gpu import MosaicGpuConfig
from moetune.kernels.backends.mosaic_gpu.timer import CuptiTimer
from moetune.kernels.device import DeviceFingerprint, current_fingerprint
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.problem import Problem

HOPPER = DeviceFingerprint("NVIDIA H200", "gpu", 132, 0, "9.0", "", "", "", "")
PROBLEM = Problem("grouped_matmul", m=256, k=1024, n=2048, g=8)


@pytest.fixture
def backend():
    return registry.get("mosaic_gpu")


def test_registered_by_folder_with_the_highest_priority(backend):
    assert "mosaic_gpu" in registry.names()
    assert backend.name == "mosaic_gpu"
    assert backend.config_cls is MosaicGpuConfig
    assert registry.default_backend(HOPPER) is backend


@pytest.mark.parametrize(
    "device, reason",
    [
        (
            dataclasses.replace(HOPPER, platform="cpu", device_kind="cpu", compute_capability=""),
            "needs an NVIDIA GPU",
        ),
        (
            dataclasses.replace(HOPPER, device_kind="NVIDIA A100", compute_capability="8.0"),
            "written for Hopper",
        ),
        (dataclasses.replace(HOPPER, device_kind="NVIDIA B200", compute_capability="10.0"), "is 10.0"),
        (dataclasses.replace(HOPPER, core_count=0), "no SM count"),
    ],
)
def test_available_gives_a_reason_off_hopper(backend, device, reason):
    assert reason in backend.available(device)


def test_available_on_hopper(backend):
    assert backend.available(HOPPER) is None


def test_this_machine_is_declined_not_crashed(backend):
    device = current_fingerprint()
    if device.platform == "gpu" and device.compute_capability.startswith("9."):
        pytest.skip("this machine has a Hopper GPU")
    assert isinstance(backend.available(device), str)
    with pytest.raises(Unsupported):
        backend.build(PROBLEM, MosaicGpuConfig())


def test_check_declines_float32(backend):
    with pytest.raises(Unsupported, match="bfloat16 or float16"):
        backend.check(dataclasses.replace(PROBLEM, lhs_dtype="float32", rhs_dtype="float32"))


def test_build_needs_its_own_config(backend, fake_backend):
    with pytest.raises(ConfigInvalid, match="needs a MosaicGpuConfig"):
        backend.build(PROBLEM, fake_backend.config_cls())


def test_timer_is_cupti(backend):
    assert isinstance(backend.timer(), CuptiTimer)


def test_source_hash_covers_the_backend_folder(backend):
    digest = backend.source_hash()
    assert len(digest) == 16 and digest == backend.source_hash()
