"""Per-architecture facts the mosaic_gpu backend plans with, keyed by compute capability.

Only facts that jax's device object does not report live here; the SM count always comes from the
device fingerprint. An architecture missing from the table raises Unsupported rather than guessing.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools

from moetune.kernels.errors import Unsupported


@dataclasses.dataclass(frozen=True, slots=True)
class ArchFacts:
    name: str
    # Opt-in dynamic shared memory one CTA may use (cudaDevAttrMaxSharedMemoryPerBlockOptin).
    smem_per_block: int
    # 32-bit registers per SM; a warpgroup is 128 threads.
    registers_per_sm: int
    # Largest L2 among the architecture's parts, used only when the driver cannot be asked: a rotation
    # sized for the largest L2 also defeats every smaller one.
    l2_bytes_fallback: int


ARCHS: dict[str, ArchFacts] = {
    # H100 SXM has 50 MiB of L2, H200 60 MiB (as PyTorch reported it here on 2026-10-28).
    "9.0": ArchFacts(
        name="sm_90a", smem_per_block=227 * 1024, registers_per_sm=65536, l2_bytes_fallback=60 << 20
    ),
}


def facts(compute_capability: str) -> ArchFacts:
    try:
        return ARCHS[compute_capability]
    except KeyError:
        known = ", ".join(sorted(ARCHS))
        raise Unsupported(
            f"mosaic_gpu has no hardware facts for compute capability {compute_capability!r} (known: {known})"
        ) from None


def is_hopper(compute_capability: str) -> bool:
    return compute_capability.split(".", 1)[0] == "9"


# CUdevice_attribute values from cuda.h.
_CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38


@functools.cache
def l2_cache_bytes(device_ordinal: int = 0, compute_capability: str = "9.0") -> int:
    """L2 size read from the CUDA driver; the architecture table's value when the driver cannot answer."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        value = ctypes.c_int(0)
        device = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), device_ordinal) != 0:
            raise OSError("the CUDA driver did not initialise")
        status = cuda.cuDeviceGetAttribute(ctypes.byref(value), _CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device)
        if status == 0 and value.value > 0:
            return value.value
    except OSError:
        pass
    return facts(compute_capability).l2_bytes_fallback
