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
    # What the cost model (cost_model.py) plans with. Shared memory of one SM, which
    # the CTAs resident on it split (cudaDevAttrMaxSharedMemoryPerMultiprocessor).
    smem_per_sm: int = 0
    # Dense 16-bit tensor-core FLOP per SM per clock, and shared-memory bytes per SM per clock (32 banks
    # of 4 bytes), which bound a wgmma whose operands are read from shared memory.
    mma_flops_per_clock: int = 0
    smem_bytes_per_clock: int = 0
    # The SM clock the model assumes under sustained matrix work (below the boost clock: power-limited).
    sustained_clock_hz: float = 0.0
    # HBM read bandwidth of the architecture's largest part, used when the part is not in PARTS.
    hbm_bytes_per_s_fallback: float = 0.0
    # Load-to-use latency of a TMA copy from HBM: bytes in flight per SM over it bound one SM's stream.
    memory_latency_s: float = 0.0
    # What TMA copies move from L2 into the SMs' shared memory, all SMs together, and into one SM per
    # clock (its port to the memory system).
    l2_bytes_per_s: float = 0.0
    sm_port_bytes_per_clock: int = 0


ARCHS: dict[str, ArchFacts] = {
    # H100 SXM has 50 MiB of L2, H200 60 MiB (as PyTorch reported it here on 2026-10-28). 4096 FLOP per
    # clock per SM is the datasheet's 989 TFLOP/s dense bf16 at 132 SMs and 1.83 GHz; the H200 here
    # sustained 790-830 TFLOP/s on random bf16 data (lab/README.md), about 1.5 GHz at that rate.
    "9.0": ArchFacts(
        name="sm_90a",
        smem_per_block=227 * 1024,
        registers_per_sm=65536,
        l2_bytes_fallback=60 << 20,
        smem_per_sm=228 * 1024,
        mma_flops_per_clock=4096,
        smem_bytes_per_clock=128,
        sustained_clock_hz=1.5e9,
        hbm_bytes_per_s_fallback=4.7e12,
        memory_latency_s=1.2e-6,
        # At least 10.3 TB/s: Mixtral's down GEMM at T=4096 copied 12.0 GB of 128x256 CTA operand tiles
        # into shared memory in 1.173 ms on the H200 (lab/README.md); the model caps it a little
        # above.
        l2_bytes_per_s=12e12,
        sm_port_bytes_per_clock=64,
    ),
}

# HBM read bandwidth per part (jax's device_kind), as measured where known: the H200 here read 4.7 TB/s
# (a 4 GiB sum, lab/bench/bench_gemm.py); the H100 SXM's datasheet gives 3.35 TB/s.
PART_HBM_BYTES_PER_S: dict[str, float] = {
    "NVIDIA H200": 4.7e12,
    "NVIDIA H100 80GB HBM3": 3.35e12,
}


def hbm_bytes_per_s(device_kind: str, compute_capability: str) -> float:
    """The part's HBM read bandwidth: measured or datasheet where known, else the architecture's."""
    return PART_HBM_BYTES_PER_S.get(device_kind, facts(compute_capability).hbm_bytes_per_s_fallback)


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
