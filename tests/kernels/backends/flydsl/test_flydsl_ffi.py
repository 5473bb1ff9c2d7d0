"""JAX dispatch of a FlyDSL kernel: lowered for ROCm on this CPU machine, with jaxlib's kernel-call
module replaced by a recording stand-in (the real one exists only in jaxlib's ROCm plugin)."""

from __future__ import annotations

import dataclasses
import zlib

import jax
import jax.numpy as jnp
import pytest

from moetune.kernels.backends.flydsl import ffi
from moetune.kernels.errors import Unsupported


@dataclasses.dataclass
class RecordingKernelCallLib:
    kernels: list = dataclasses.field(default_factory=list)
    calls: list = dataclasses.field(default_factory=list)

    def TritonKernel(self, *args):  # noqa: N802 - jaxlib's name
        self.kernels.append(args)
        return ("kernel", args)

    def create_array_parameter(self, bytes_to_zero, divisibility):
        return ("array", bytes_to_zero, divisibility)

    def TritonKernelCall(self, kernel, gx, gy, gz, params):  # noqa: N802
        recorder = self

        class Call:
            def to_proto(self, name, metadata):
                recorder.calls.append((kernel, (gx, gy, gz), params, name))
                return f"proto:{name}:{gx}".encode()

        return Call()


SPEC = ffi.LaunchSpec(
    kernel_name="moetune_flydsl_gmm_0",
    hsaco_path="/cache/abc.hsaco",
    grid=(2880, 1, 1),
    block=(256, 1, 1),
    out_shape=(4096, 28672),
    out_dtype="bfloat16",
)
ARGS = (
    jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16),
    jax.ShapeDtypeStruct((8, 4096, 28672), jnp.bfloat16),
    jax.ShapeDtypeStruct((8,), jnp.int32),
)


@pytest.fixture
def recording_lib(monkeypatch):
    lib = RecordingKernelCallLib()
    monkeypatch.setattr(ffi, "kernel_call_lib", lambda: lib)
    return lib


def export_for_rocm(fn):
    return jax.export.export(
        jax.jit(fn),
        platforms=["rocm"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(ffi.CALL_TARGET)],
    )(*ARGS)


def test_rocm_lowering_is_a_kernel_call_of_the_code_object(recording_lib):
    exported = export_for_rocm(ffi.kernel_fn(SPEC))
    text = exported.mlir_module()
    assert f"stablehlo.custom_call @{ffi.CALL_TARGET}" in text
    assert "tensor<4096x28672xbf16>" in text
    (kernel,) = recording_lib.kernels
    assert kernel == ("moetune_flydsl_gmm_0", 4, 1, 0, "/cache/abc.hsaco", "", 0)
    (call,) = recording_lib.calls
    _, grid, params, name = call
    assert grid == (2880, 1, 1)
    # lhs, rhs, group_sizes, out: four 16-byte-aligned buffers, none zeroed by the launcher
    assert params == [("array", 0, ffi.POINTER_DIVISIBILITY)] * 4
    assert zlib.decompress(ffi.serialized_call(SPEC, 3, name)) == f"proto:{name}:2880".encode()
    assert exported.out_avals[0].shape == (4096, 28672)


def test_cpu_lowering_declines_with_a_reason(recording_lib):
    with pytest.raises(Unsupported, match="runs only on ROCm"):
        jax.jit(ffi.kernel_fn(SPEC)).lower(*ARGS)


def test_without_the_rocm_plugin_the_launcher_is_unavailable():
    # The CPU jaxlib here has no ROCm kernel-call module.
    assert "ROCm plugin" in (ffi.launcher_available() or "")


def test_launch_spec_rejects_a_block_the_launcher_cannot_make():
    with pytest.raises(ValueError, match="64 \\* num_warps"):
        dataclasses.replace(SPEC, block=(100, 1, 1))
