"""The flydsl backend's contract: where it runs, what it accepts, and that importing it stays light."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from moetune.kernels import registry
from moetune.kernels.backends.flydsl import BACKEND, FlyDSLConfig, ffi, target_device
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.problem import Problem

CPU = DeviceFingerprint("cpu", "cpu", 2, 0, "x86_64", "", "", "0.11.2", "0.11.2")
H200 = DeviceFingerprint("NVIDIA H200", "gpu", 132, 140 << 30, "9.0", "580", "13.0", "0.11.2", "0.11.2")
MI300X = DeviceFingerprint(
    "AMD Instinct MI300X", "rocm", 304, 192 << 30, "gfx942:sramecc+:xnack-", "", "7.0", "0.11.2", "0.11.2"
)
MI250 = dataclasses.replace(MI300X, device_kind="AMD Instinct MI250X", compute_capability="gfx90a")


def test_registered_under_its_folder_name():
    assert registry.get("flydsl") is BACKEND and BACKEND.config_cls is FlyDSLConfig
    assert BACKEND.compile_targets == ("gfx942", "gfx950")


@pytest.mark.parametrize(
    ("device", "reason"),
    [
        (CPU, "needs an AMD GPU under ROCm; this device is cpu"),
        (H200, "needs an AMD GPU under ROCm; this device is gpu 'NVIDIA H200'"),
        (MI250, "compiles for gfx942, gfx950; this device is gfx90a"),
        (MI300X, "ROCm plugin"),  # the arch fits, but this jaxlib cannot launch code objects
    ],
)
def test_available_says_why_not(device, reason):
    assert reason in BACKEND.available(device)


def test_never_the_default_off_rocm():
    assert registry.available(CPU)["flydsl"] is not None
    assert registry.default_backend(CPU).name != "flydsl"


def test_on_a_rocm_device_with_launcher_and_toolchain_it_is_available(monkeypatch):
    from moetune.kernels.backends.flydsl import backend, toolchain

    monkeypatch.setattr(ffi, "launcher_available", lambda: None)
    monkeypatch.setattr(
        backend.toolchain, "toolchain", lambda: toolchain.Toolchain("py", "0.5.0", "lld", "", "/r")
    )
    assert BACKEND.available(MI300X) is None


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        (Problem("grouped_matmul", 64, 64, 64, 2, "float32", "float32", "float32"), "bf16, f16 or fp8"),
        (Problem("grouped_matmul", 64, 64, 64, 2, "bfloat16", "float16"), "equal operand dtypes"),
        (Problem("grouped_matmul", 64, 64, 64, 2, out_dtype="float32"), "writes bfloat16 or float16"),
        (
            Problem("grouped_matmul_swiglu", 64, 64, 64, 2),
            "serves op=grouped_matmul, grouped_matmul_fp8, not",
        ),
    ],
)
def test_check_declines_what_the_kernel_cannot_compute(problem, message):
    with pytest.raises(Unsupported, match=message):
        BACKEND.check(problem)


def test_build_declines_off_rocm_and_rejects_foreign_configs():
    problem = Problem("grouped_matmul", 64, 64, 64, 2)
    with pytest.raises(ConfigInvalid, match="FlyDSLConfig"):
        BACKEND.build(problem, object())
    with pytest.raises(Unsupported, match="gfx942/gfx950"):
        BACKEND.build(problem, FlyDSLConfig())


def test_target_device_is_a_compile_only_stand_in():
    device = BACKEND.target_device("gfx950")
    assert device == target_device("gfx950")
    assert (device.platform, device.compute_capability) == ("rocm", "gfx950")
    with pytest.raises(ConfigInvalid, match="gfx1100"):
        BACKEND.target_device("gfx1100")
    # The Backend default: a backend without compile-only targets has no stand-in device.
    with pytest.raises(Unsupported, match="backend xla has no stand-in device"):
        registry.get("xla").target_device("gfx942")


def test_importing_the_backend_loads_neither_flydsl_nor_torch_nor_hip():
    code = (
        "import sys, json, moetune.kernels.backends.flydsl, moetune.kernels.backends.flydsl.space;"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('flydsl', 'torch', 'hip', 'ray', 'optuna', 'sqlalchemy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []
