"""A stand-in for hip-python's `hip.hip` module: host memory as device memory, numpy kernels.

It follows hip-python's conventions (every call returns a tuple led by a hipError_t; hipModuleLaunchKernel
takes kernelParams as an array of pointers to the argument values), so HipRuntime runs unchanged.
Kernels are Python functions registered by name; a code object is the kernel name's bytes.
"""

from __future__ import annotations

import ctypes
import enum
import types

import numpy as np

# A small valid FlyDSL config: the plan the timing tests hand to the fake runtime.
TIMING_CONFIG = dict(
    tile_m=32,
    tile_n=64,
    tile_k=32,
    waves_m=1,
    waves_n=1,
    k_waves=1,
    lds_stages=2,
    waves_per_eu=0,
    xcd_swizzle=0,
    tile_order="m_major",
    mfma=16,
    lds_swizzle=True,
)


class hipError_t(enum.IntEnum):  # noqa: N801 - hip-python's name
    hipSuccess = 0
    hipErrorInvalidImage = 200
    hipErrorNotFound = 500


class hipMemcpyKind(enum.IntEnum):  # noqa: N801
    hipMemcpyHostToDevice = 1
    hipMemcpyDeviceToHost = 2


class FakeHip:
    hipError_t = hipError_t
    hipMemcpyKind = hipMemcpyKind

    def __init__(self, kernels, *, arch="gfx942:sramecc+:xnack-", cu_count=304, pci_device_id=0x74A1, ms=1.5):
        self.kernels = kernels  # name -> fn(memory, pointers, grid, block)
        self.memory: dict[int, np.ndarray] = {}
        self.launches: list[tuple] = []
        self.props = dict(
            gcnArchName=arch.encode(),
            multiProcessorCount=cu_count,
            pciDeviceID=pci_device_id,
            name=b"AMD Instinct MI300X",
            totalGlobalMem=192 << 30,
        )
        self.ms = ms
        self._next = 0x1000
        self.freed = 0

    def hipDeviceProp_t(self):  # noqa: N802
        return types.SimpleNamespace()

    def hipSetDevice(self, device):  # noqa: N802
        return (hipError_t.hipSuccess,)

    def hipGetDeviceProperties(self, props, device):  # noqa: N802
        props.__dict__.update(self.props)
        return (hipError_t.hipSuccess,)

    def hipMalloc(self, nbytes):  # noqa: N802
        ptr = self._next
        self._next += nbytes + 256
        self.memory[ptr] = np.zeros(nbytes, np.uint8)
        return hipError_t.hipSuccess, ptr

    def hipFree(self, ptr):  # noqa: N802
        self.memory.pop(ptr)
        self.freed += 1
        return (hipError_t.hipSuccess,)

    def hipMemcpy(self, dst, src, nbytes, kind):  # noqa: N802
        if kind == hipMemcpyKind.hipMemcpyHostToDevice:
            self.memory[dst][:nbytes] = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(src))
        else:
            ctypes.memmove(dst, self.memory[src].ctypes.data, nbytes)
        return (hipError_t.hipSuccess,)

    def hipModuleLoadData(self, image):  # noqa: N802
        name = bytes(image).decode(errors="replace")
        if name not in self.kernels:
            return hipError_t.hipErrorInvalidImage, None
        return hipError_t.hipSuccess, ("module", name)

    def hipModuleGetFunction(self, module, name):  # noqa: N802
        if module[1] != name.decode():
            return hipError_t.hipErrorNotFound, None
        return hipError_t.hipSuccess, ("function", module[1])

    def hipModuleUnload(self, module):  # noqa: N802
        return (hipError_t.hipSuccess,)

    def hipModuleLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # noqa: N802
        # kernelParams: params[i] is the address of argument i (here: a device pointer value).
        count = len(params)
        pointers = [ctypes.c_void_p.from_address(params[i]).value for i in range(count)]
        self.launches.append((f[1], (gx, gy, gz), (bx, by, bz), shared, pointers))
        self.kernels[f[1]](self.memory, pointers)
        return (hipError_t.hipSuccess,)

    def hipEventCreate(self):  # noqa: N802
        return hipError_t.hipSuccess, object()

    def hipEventRecord(self, event, stream):  # noqa: N802
        return (hipError_t.hipSuccess,)

    def hipEventSynchronize(self, event):  # noqa: N802
        return (hipError_t.hipSuccess,)

    def hipEventElapsedTime(self, start, stop):  # noqa: N802
        return hipError_t.hipSuccess, self.ms

    def hipEventDestroy(self, event):  # noqa: N802
        return (hipError_t.hipSuccess,)


def grouped_matmul_kernel(plan, *, corrupt: bool = False):
    """A numpy model of the FlyDSL kernel's contract: (lhs, rhs, group_sizes, out) pointers, bf16 bits."""

    def bf16(bits):
        return (bits.astype(np.uint32) << 16).view(np.float32)

    def run(memory, pointers):
        lhs_p, rhs_p, sizes_p, out_p = pointers
        lhs = bf16(memory[lhs_p].view(np.uint16)[: plan.m * plan.k].reshape(plan.m, plan.k))
        shape = (plan.g, plan.n, plan.k) if plan.transpose_rhs else (plan.g, plan.k, plan.n)
        rhs = bf16(memory[rhs_p].view(np.uint16)[: np.prod(shape)].reshape(shape))
        sizes = memory[sizes_p].view(np.int32)[: plan.g]
        out = np.zeros((plan.m, plan.n), np.float32)
        start = 0
        for g, size in enumerate(sizes):
            size = int(min(max(size, 0), plan.m - start))
            weights = rhs[g].T if plan.transpose_rhs else rhs[g]
            out[start : start + size] = lhs[start : start + size] @ weights
            start += size
        if corrupt:
            out[:, :] = 0.0
        bits = (out.view(np.uint32) + 0x8000 >> 16).astype(np.uint16)  # round to nearest bf16
        memory[out_p][: bits.nbytes] = bits.reshape(-1).view(np.uint8)

    return run
