"""JAX dispatch of a compiled FlyDSL kernel on ROCm, through jaxlib's GPU kernel-call machinery.

    moetune.kernels.grouped_matmul(lhs, rhs, group_sizes)
      -> FlyDSLBackend.build(problem, config)          (trace time, Python)
      -> compile.compile_one(...)                      (FlyDSL worker -> HSACO file in the cache, by hash)
      -> kernel(lhs, rhs, group_sizes) binds `flydsl_grouped_matmul_p`
      -> ROCm lowering: stablehlo.custom_call @triton_kernel_call_ffi with a zlib-compressed
         jax_triton.TritonAnyKernelCall protobuf as `opaque` (what jax-triton emits for Triton kernels)
      -> at run time jaxlib's ROCm plugin reads the HSACO file, hipModuleLoadData, hipModuleGetFunction,
         hipModuleLaunchKernel(grid, block = num_warps * 64, params = the buffer pointers).

Why this path: jaxlib already ships a HIP launcher for pre-compiled code objects (the one jax-triton and
Pallas-on-ROCm use), so moetune needs no C++ of its own and no build against XLA's FFI headers. Its
contract, which the FlyDSL kernel meets by construction (plan.py): the kernel takes only global-buffer
pointers, in operand order then results (lhs, rhs, group_sizes, out); block is (64 * num_warps, 1, 1);
LDS is static (shared_mem_bytes = 0). The launcher appends one null "scratch" pointer after the
parameters; HIP passes only as many arguments as the kernel declares, so it is ignored.

Not run on AMD hardware: on this CPU-only machine the lowering is exercised with jax.export for the
"rocm" platform and a stand-in for jaxlib's kernel-call module (tests/kernels/backends/flydsl/test_ffi.py).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core
from jax.interpreters import mlir

from moetune.kernels.errors import Unsupported

CALL_TARGET = "triton_kernel_call_ffi"
WAVE_SIZE = 64
POINTER_DIVISIBILITY = 16  # jax arrays are at least 16-byte aligned; the launcher checks it per call


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """Everything the lowering needs about one compiled kernel; hashable, so a primitive parameter."""

    kernel_name: str
    hsaco_path: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    out_shape: tuple[int, int]
    out_dtype: str
    shared_mem_bytes: int = 0

    @property
    def num_warps(self) -> int:
        return self.block[0] // WAVE_SIZE

    def __post_init__(self) -> None:
        if self.block[1:] != (1, 1) or self.block[0] % WAVE_SIZE:
            raise ValueError(f"block={self.block}: the kernel-call launcher launches (64 * num_warps, 1, 1)")


def _jaxlib_kernel_call_lib() -> Any:
    from jax._src.lib import gpu_triton

    if not hasattr(gpu_triton, "TritonKernel"):
        raise Unsupported("jaxlib has no ROCm kernel-call library: install jax with its ROCm plugin")
    return gpu_triton


# Resolves jaxlib's kernel-call module at lowering time; tests replace it with a recording stand-in.
kernel_call_lib: Callable[[], Any] = _jaxlib_kernel_call_lib


def launcher_available() -> str | None:
    """None when jaxlib can launch code objects on ROCm here, else why not."""
    try:
        kernel_call_lib()
    except (ImportError, Unsupported) as e:
        return str(e)
    return None


def serialized_call(spec: LaunchSpec, n_operands: int, name: str) -> bytes:
    """The opaque payload of the custom call: jaxlib's kernel-call protobuf, zlib-compressed."""
    lib = kernel_call_lib()
    kernel = lib.TritonKernel(
        spec.kernel_name,
        spec.num_warps,
        1,  # num_ctas: no clusters on CDNA
        spec.shared_mem_bytes,
        spec.hsaco_path,  # on ROCm the launcher reads the code object from this path
        "",  # ttir: nothing to show for a FlyDSL kernel
        0,  # compute_capability: unused on ROCm
    )
    params = [lib.create_array_parameter(0, POINTER_DIVISIBILITY) for _ in range(n_operands + 1)]
    call = lib.TritonKernelCall(kernel, *spec.grid, params)
    return zlib.compress(call.to_proto(name, b""))


flydsl_grouped_matmul_p = jex_core.Primitive("moetune_flydsl_grouped_matmul")


@flydsl_grouped_matmul_p.def_abstract_eval
def _abstract_eval(lhs, rhs, group_sizes, *, spec: LaunchSpec):
    return jax.core.ShapedArray(spec.out_shape, jnp.dtype(spec.out_dtype))


def _rocm_lowering(ctx, lhs, rhs, group_sizes, *, spec: LaunchSpec):
    opaque = serialized_call(spec, n_operands=3, name="moetune_flydsl_grouped_matmul")
    rule = jax.ffi.ffi_lowering(CALL_TARGET, api_version=4)
    return rule(ctx, lhs, rhs, group_sizes, opaque=opaque)


def _unsupported_lowering(ctx, *args, spec: LaunchSpec):
    raise Unsupported(f"the FlyDSL kernel {spec.kernel_name} runs only on ROCm (AMD GPUs)")


mlir.register_lowering(flydsl_grouped_matmul_p, _rocm_lowering, platform="rocm")
for _platform in ("cpu", "cuda"):
    mlir.register_lowering(flydsl_grouped_matmul_p, _unsupported_lowering, platform=_platform)


def kernel_fn(spec: LaunchSpec) -> Callable[[Any, Any, Any], Any]:
    """A JAX-callable f(lhs, rhs, group_sizes) -> out that launches the compiled kernel."""

    def grouped_matmul(lhs, rhs, group_sizes):
        return flydsl_grouped_matmul_p.bind(lhs, rhs, group_sizes, spec=spec)

    grouped_matmul.__name__ = f"flydsl_{spec.kernel_name}"
    return grouped_matmul
