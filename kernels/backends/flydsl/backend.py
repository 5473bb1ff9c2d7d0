"""The `flydsl` backend: moetune's own FlyDSL grouped-GEMM kernel for AMD CDNA3/CDNA4 GPUs.

Compiles on any Linux machine with the FlyDSL toolchain (toolchain.py), runs only on ROCm devices whose
arch is gfx942 or gfx950 and whose jaxlib carries the ROCm kernel-call launcher (ffi.py). On CPU and
NVIDIA devices `available` returns the reason, so dispatch never picks it there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from moetune.kernels.backend import Backend, KernelFn, StaticCompile
from moetune.kernels.backends.flydsl import toolchain
from moetune.kernels.backends.flydsl.config import FlyDSLConfig
from moetune.kernels.backends.flydsl.plan import ARCHS, OUT_DTYPES, operand_dtypes
from moetune.kernels.config import KernelConfig
from moetune.kernels.device import DeviceFingerprint, compile_only_device
from moetune.kernels.errors import ConfigInvalid, Unsupported
from moetune.kernels.problem import Problem
from moetune.kernels.timing import Timer


def device_arch(device: DeviceFingerprint) -> str | None:
    """'gfx942' for a ROCm device (features such as ':sramecc+:xnack-' dropped), else None."""
    capability = device.compute_capability.split(":", 1)[0]
    if device.platform in ("rocm", "gpu") and capability.startswith("gfx"):
        return capability
    return None


def target_device(arch: str) -> DeviceFingerprint:
    """A stand-in fingerprint for compile-only sweeps of `arch` on a machine without that GPU.

    Search spaces and heuristics read only the arch from it; it is never a timing fingerprint.
    """
    if arch not in ARCHS:
        raise ConfigInvalid(f"arch={arch!r} is not one of {', '.join(ARCHS)}")
    return compile_only_device(f"AMD {arch} (compile-only)", "rocm", arch)


def _device_arch() -> str:
    from moetune.kernels.device import current_fingerprint

    arch = device_arch(current_fingerprint())
    if arch not in ARCHS:
        raise Unsupported(f"flydsl builds only on a gfx942/gfx950 device, not {arch or 'this device'}")
    return arch


@functools.lru_cache(maxsize=256)
def _compiled(problem: Problem, config: FlyDSLConfig, arch: str):
    from moetune.kernels.backends.flydsl.compile import compile_one

    return compile_one(problem, config, arch)


class FlyDSLBackend(Backend):
    name = "flydsl"
    config_cls = FlyDSLConfig
    # Above xla wherever it can run at all; only ROCm devices get that far.
    priority = 20
    compiles_without_device = True
    compile_targets = tuple(ARCHS)
    # Ray treats AMD GPUs as "GPU" only where it detects ROCm; AMD nodes declare one `amd_gpu` per GPU.
    device_resource = "amd_gpu"
    visible_devices_env = "HIP_VISIBLE_DEVICES"
    # kernel.build turns a KernelPlan into the FlyDSL kernel; the compile worker runs it (compile.py).
    # Its buffer descriptors end at row M of lhs, so rows past M are never read (the backend contract).
    # Its FP8 kernel multiplies FP8 values with no scale operands: the GEMM of grouped_matmul_fp8 under
    # per-tensor scales (one scalar per operand and expert, applied to the float32 sum), which compiles
    # for compile-only sweeps; it does not run until the kernel takes the scales (`build` declines).
    kernels = {"grouped_matmul": "build", "grouped_matmul_fp8": "build"}
    kernel_module = "moetune.kernels.backends.flydsl.kernel"

    def available(self, device: DeviceFingerprint) -> str | None:
        arch = device_arch(device)
        if arch is None:
            return (
                f"flydsl needs an AMD GPU under ROCm; this device is {device.platform} {device.device_kind!r}"
            )
        if arch not in ARCHS:
            return f"flydsl compiles for {', '.join(ARCHS)}; this device is {arch}"
        from moetune.kernels.backends.flydsl import ffi

        reason = ffi.launcher_available()
        if reason is not None:
            return reason
        try:
            toolchain.toolchain()
        except Unsupported as e:
            return str(e)
        return None

    def check_problem(self, problem: Problem) -> None:
        if problem.lhs_dtype != problem.rhs_dtype:
            raise Unsupported(
                f"flydsl needs equal operand dtypes, not {problem.lhs_dtype} x {problem.rhs_dtype}"
            )
        if all(problem.lhs_dtype not in operand_dtypes(arch) for arch in ARCHS):
            raise Unsupported(f"flydsl takes bf16, f16 or fp8 e4m3 operands, not {problem.lhs_dtype}")
        if problem.out_dtype not in OUT_DTYPES:
            raise Unsupported(f"flydsl writes {' or '.join(OUT_DTYPES)}, not {problem.out_dtype}")
        if problem.scale_layout not in ("none", "tensor"):
            raise Unsupported(
                f"flydsl's FP8 kernel has no per-row or block scales, only per-tensor: "
                f"not scale_layout={problem.scale_layout}"
            )

    def search_space(self, problem: Problem, device: DeviceFingerprint):
        from moetune.kernels.backends.flydsl import space as flydsl_space

        return flydsl_space.space(problem, device)

    def heuristic(self, problem: Problem, device: DeviceFingerprint) -> FlyDSLConfig:
        from moetune.kernels.backends.flydsl import space as flydsl_space

        return flydsl_space.heuristic(problem, device)

    def build(self, problem: Problem, config: KernelConfig) -> KernelFn:
        from moetune.kernels.backends.flydsl import ffi

        self.check(problem)
        if problem.scale_layout != "none":
            raise Unsupported(
                f"flydsl's FP8 kernel takes no scale operands yet: {problem.op} compiles "
                "(moetune tune --compile-only) but does not run on flydsl"
            )
        if not isinstance(config, FlyDSLConfig):
            raise ConfigInvalid(f"flydsl needs a FlyDSLConfig, not {type(config).__qualname__}")
        result = _compiled(problem, config, _device_arch())
        spec = ffi.LaunchSpec(
            kernel_name=result.kernel_name,
            hsaco_path=result.hsaco_path,
            grid=result.grid,
            block=result.block,
            out_shape=problem.out_shape,
            out_dtype=problem.out_dtype,
        )
        return ffi.kernel_fn(spec)

    def timer(self) -> Timer:
        from moetune.kernels.backends.flydsl.timer import HipEventTimer

        return HipEventTimer()

    def executable(
        self, problem: Problem, config: KernelConfig, compiled: Callable[..., Any]
    ) -> Callable[..., Any]:
        """The JAX executable with the code object it launches, which `HipEventTimer` times."""
        from moetune.kernels.backends.flydsl.compile import plan_for
        from moetune.kernels.backends.flydsl.timer import CodeObjectKernel

        arch = _device_arch()
        result = _compiled(problem, config, arch)
        return CodeObjectKernel(
            compiled, plan_for(problem, config, arch), result.hsaco_path, result.kernel_name
        )

    def compile_only(self, problem: Problem, config: KernelConfig, target: str) -> StaticCompile:
        from moetune.kernels.backends.flydsl.compile import compile_one, prune_reason

        self.check(problem)
        if not isinstance(config, FlyDSLConfig):
            raise ConfigInvalid(f"flydsl needs a FlyDSLConfig, not {type(config).__qualname__}")
        result = compile_one(problem, config, target)
        metrics = {k: v for k, v in result.metrics.to_dict().items() if k != "args"}
        return StaticCompile(result.binary_hash, metrics, result.compile_s, prune_reason(result, config))

    def target_device(self, target: str) -> DeviceFingerprint:
        return target_device(target)
