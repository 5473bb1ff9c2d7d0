"""Timing (and spot-checking) a FlyDSL code object on an AMD GPU with hip-python and HIP events.

Runs in the main moetune interpreter on an AMD node: it needs hip-python and numpy, not flydsl or torch.
Each candidate gets its own process (`time_in_subprocess`): a code object that fails to load, or a
kernel that faults, can abort the whole HIP process, and must take only its own trial down. The tuner
schedules these processes on a Ray resource `amd_gpu` (one per GPU), so two timings never share a GPU.

    python -m moetune.kernels.backends.flydsl.hip_runtime < request.json   ->   one JSON line on stdout

Inputs: lhs and out are rotated over several buffer sets whose total exceeds the last-level cache, so
repeated launches do not time a warm cache; data is random (never zeros). The spot check compares a
sample of output rows and columns with a float32 numpy reference of the same routing.

Not run on AMD hardware: the code is exercised against a fake runtime with hip-python's calling
conventions (tests/kernels/backends/flydsl/test_hip_runtime.py).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from moetune.kernels.backends.flydsl.plan import KernelPlan
from moetune.kernels.errors import MoetuneError, WrongResult

# Rotate lhs/out over enough sets to pass this many bytes between reuses (MI300X: 256 MB Infinity Cache).
ROTATE_BYTES = 512 * 1024 * 1024
MAX_SETS = 8
TOLERANCE = {"bfloat16": 1e-2, "float16": 1e-2}


class HipError(MoetuneError):
    """A HIP call failed (the text names the call and the error)."""


class CandidateCrashed(MoetuneError):
    """The timing process died (a failed code-object load or a GPU fault aborts HIP's whole process)."""


def _bits_of(array: np.ndarray, dtype: str) -> np.ndarray:
    """Host array in the device's element encoding (bfloat16 as its top 16 bits of float32)."""
    if dtype == "bfloat16":
        return (np.ascontiguousarray(array, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if dtype == "float16":
        return np.ascontiguousarray(array, np.float16)
    raise ValueError(f"host encoding of {dtype} is not implemented")


def _values_of(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.astype(np.float32)


class HipRuntime:
    """The handful of HIP calls timing needs, in hip-python's conventions.

    hip-python functions return a tuple whose first item is a hipError_t; the rest is the result.
    `hip` is the `hip.hip` module, or a stand-in with the same names (tests).
    """

    def __init__(self, hip: Any | None = None, device: int = 0) -> None:
        if hip is None:
            from hip import hip  # hip-python
        self.hip = hip
        self.device = device
        self.check(hip.hipSetDevice(device), "hipSetDevice")

    def check(self, result: Any, call: str) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self.hip.hipError_t.hipSuccess:
            raise HipError(f"{call} failed: {err}")
        return rest[0] if len(rest) == 1 else tuple(rest)

    # -- device facts ---------------------------------------------------------------------------------

    def fingerprint(self) -> dict[str, Any]:
        """gfx arch, CU count and PCI device id: what distinguishes AMD GPUs for tuned results."""
        props = self.hip.hipDeviceProp_t()
        self.check(self.hip.hipGetDeviceProperties(props, self.device), "hipGetDeviceProperties")
        arch = props.gcnArchName
        arch = arch.decode() if isinstance(arch, bytes) else str(arch)
        name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
        return {
            "arch": arch.split(":", 1)[0],
            "arch_features": arch,
            "cu_count": int(props.multiProcessorCount),
            "pci_device_id": int(props.pciDeviceID),
            "name": name,
            "memory_bytes": int(props.totalGlobalMem),
        }

    # -- memory and launch ----------------------------------------------------------------------------

    def upload(self, host: np.ndarray) -> int:
        ptr = self.check(self.hip.hipMalloc(host.nbytes), "hipMalloc")
        self.check(
            self.hip.hipMemcpy(
                ptr, host.ctypes.data, host.nbytes, self.hip.hipMemcpyKind.hipMemcpyHostToDevice
            ),
            "hipMemcpy H2D",
        )
        return ptr

    def alloc(self, nbytes: int) -> int:
        return self.check(self.hip.hipMalloc(nbytes), "hipMalloc")

    def download(self, ptr: Any, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        self.check(
            self.hip.hipMemcpy(
                out.ctypes.data, ptr, out.nbytes, self.hip.hipMemcpyKind.hipMemcpyDeviceToHost
            ),
            "hipMemcpy D2H",
        )
        return out

    def load(self, code_object: bytes, kernel_name: str) -> tuple[Any, Any]:
        module = self.check(self.hip.hipModuleLoadData(code_object), "hipModuleLoadData")
        function = self.check(
            self.hip.hipModuleGetFunction(module, kernel_name.encode()), "hipModuleGetFunction"
        )
        return module, function

    def launch(
        self, function: Any, grid: Sequence[int], block: Sequence[int], pointers: Sequence[int]
    ) -> None:
        """Launch with global-buffer pointer arguments, passed as kernelParams (one void** per argument)."""
        values = [ctypes.c_void_p(int(p)) for p in pointers]
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        self.check(
            self.hip.hipModuleLaunchKernel(function, *grid, *block, 0, None, params, None),
            "hipModuleLaunchKernel",
        )

    def time_launches(self, launch: Any, runs: int) -> list[float]:
        """Seconds of each of `runs` calls of `launch(i)`, each between two HIP events."""
        start = self.check(self.hip.hipEventCreate(), "hipEventCreate")
        stop = self.check(self.hip.hipEventCreate(), "hipEventCreate")
        samples = []
        try:
            for i in range(runs):
                self.check(self.hip.hipEventRecord(start, None), "hipEventRecord")
                launch(i)
                self.check(self.hip.hipEventRecord(stop, None), "hipEventRecord")
                self.check(self.hip.hipEventSynchronize(stop), "hipEventSynchronize")
                ms = self.check(self.hip.hipEventElapsedTime(start, stop), "hipEventElapsedTime")
                samples.append(float(ms) / 1e3)
        finally:
            self.hip.hipEventDestroy(start)
            self.hip.hipEventDestroy(stop)
        return samples


@dataclasses.dataclass(frozen=True)
class TimingResult:
    samples_s: tuple[float, ...]
    max_rel_error: float
    fingerprint: dict[str, Any]


def reference_rows(
    lhs: np.ndarray,
    rhs: np.ndarray,
    sizes: Sequence[int],
    rows: np.ndarray,
    cols: np.ndarray,
    transpose_rhs: bool,
) -> np.ndarray:
    """float32 ragged_dot for the selected rows and columns (rows past sum(sizes) are zero)."""
    m = lhs.shape[0]
    bounds = np.minimum(np.cumsum(np.maximum(np.asarray(sizes, np.int64), 0)), m)
    group = np.searchsorted(bounds, rows, side="right")
    out = np.zeros((len(rows), len(cols)), np.float32)
    for i, (r, g) in enumerate(zip(rows, group, strict=True)):
        if g >= len(sizes):
            continue
        weights = rhs[g][cols, :].T if transpose_rhs else rhs[g][:, cols]
        out[i] = lhs[r] @ weights
    return out


def time_code_object(
    runtime: HipRuntime,
    code_object: bytes,
    kernel_name: str,
    plan: KernelPlan,
    group_sizes: Sequence[int],
    *,
    runs: int = 20,
    warmup: int = 3,
    check_rows: int = 64,
    seed: int = 0,
) -> TimingResult:
    """Load, spot-check against numpy, then time `runs` launches; raises WrongResult or HipError."""
    if len(group_sizes) != plan.g:
        raise ValueError(f"{len(group_sizes)} group sizes for G={plan.g}")
    rng = np.random.default_rng(seed)
    dtype = plan.in_dtype
    if dtype not in TOLERANCE:
        raise NotImplementedError(f"timing {dtype} operands needs an fp8 host encoding, not written yet")
    lhs = rng.standard_normal((plan.m, plan.k), np.float32)
    rhs_shape = (plan.g, plan.n, plan.k) if plan.transpose_rhs else (plan.g, plan.k, plan.n)
    rhs = rng.standard_normal(rhs_shape, np.float32) / np.sqrt(plan.k)
    lhs_bits, rhs_bits = _bits_of(lhs, dtype), _bits_of(rhs, dtype)
    out_like = np.empty((plan.m, plan.n), np.uint16)
    per_set = lhs_bits.nbytes + out_like.nbytes
    sets = max(1, min(MAX_SETS, ROTATE_BYTES // max(1, per_set)))

    fingerprint = runtime.fingerprint()
    module, function = runtime.load(code_object, kernel_name)
    rhs_ptr = runtime.upload(rhs_bits)
    sizes_ptr = runtime.upload(np.asarray(group_sizes, np.int32))
    lhs_ptrs = [runtime.upload(lhs_bits) for _ in range(sets)]
    out_ptrs = [runtime.alloc(out_like.nbytes) for _ in range(sets)]

    def launch(i: int) -> None:
        s = i % sets
        runtime.launch(function, plan.grid, plan.block, [lhs_ptrs[s], rhs_ptr, sizes_ptr, out_ptrs[s]])

    launch(0)
    got = _values_of(runtime.download(out_ptrs[0], out_like), plan.out_dtype)
    rows = np.unique(rng.integers(0, plan.m, size=min(check_rows, plan.m)))
    cols = np.unique(rng.integers(0, plan.n, size=min(check_rows, plan.n)))
    want = reference_rows(
        _values_of(lhs_bits, dtype), _values_of(rhs_bits, dtype), group_sizes, rows, cols, plan.transpose_rhs
    )
    sample = got[np.ix_(rows, cols)]
    if not np.all(np.isfinite(sample)):
        raise WrongResult("output holds NaN or Inf")
    scale = max(float(np.abs(want).max()), 1e-6)
    error = float(np.abs(sample - want).max()) / scale
    if error > TOLERANCE[plan.out_dtype]:
        raise WrongResult(
            f"max relative error {error:.3g} > {TOLERANCE[plan.out_dtype]} on sampled rows/cols"
        )
    for i in range(warmup):
        launch(i)
    samples = runtime.time_launches(launch, runs)
    runtime.hip.hipModuleUnload(module)
    for ptr in [rhs_ptr, sizes_ptr, *lhs_ptrs, *out_ptrs]:
        runtime.hip.hipFree(ptr)
    return TimingResult(tuple(samples), error, fingerprint)


def timing_request(
    plan: KernelPlan,
    hsaco_path: str,
    kernel_name: str,
    group_sizes: Sequence[int],
    *,
    runs: int = 20,
    device: int = 0,
) -> dict[str, Any]:
    """The request `time_in_subprocess` sends to the timing process (plain JSON: Ray can ship it)."""
    return {
        "hsaco_path": hsaco_path,
        "kernel_name": kernel_name,
        "plan": plan.to_dict(),
        "group_sizes": [int(s) for s in group_sizes],
        "runs": int(runs),
        "device": int(device),
    }


def time_in_subprocess(
    request: dict[str, Any], *, timeout_s: float = 600.0, python: str | None = None
) -> TimingResult:
    """Run `main` in a fresh process; its death becomes CandidateCrashed, its errors their own type.

    `request` comes from `timing_request`.
    """
    try:
        proc = subprocess.run(
            [python or sys.executable, "-m", "moetune.kernels.backends.flydsl.hip_runtime"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as e:
        raise CandidateCrashed(f"timing process exceeded {timeout_s:.0f} s") from e
    lines = [line for line in proc.stdout.strip().splitlines() if line.startswith("{")]
    if not lines:
        raise CandidateCrashed(f"timing process exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    answer = json.loads(lines[-1])
    if answer.get("error_type") == "WrongResult":
        raise WrongResult(answer["error"])
    if "error" in answer:
        raise HipError(answer["error"])
    return TimingResult(tuple(answer["samples_s"]), answer["max_rel_error"], answer["fingerprint"])


def main() -> int:
    request = json.load(sys.stdin)
    try:
        runtime = HipRuntime(device=int(request.get("device", 0)))
        with open(request["hsaco_path"], "rb") as f:
            code_object = f.read()
        result = time_code_object(
            runtime,
            code_object,
            request["kernel_name"],
            KernelPlan(**request["plan"]),
            request["group_sizes"],
            runs=int(request.get("runs", 20)),
        )
    except (HipError, WrongResult, ValueError, NotImplementedError, OSError) as e:
        print(json.dumps({"error": str(e), "error_type": type(e).__name__}))
        return 1
    print(json.dumps(dataclasses.asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
