"""The device fingerprint: what a tuned result depends on besides the kernel source.

A winner recorded under one fingerprint is exact for it; under any other it is stale (usable as a warm
start, flagged). Reading the fingerprint needs only jax and the standard library.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import platform
from typing import Any, ClassVar


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceFingerprint:
    device_kind: str  # jax's device_kind, e.g. "NVIDIA H200" or "cpu"
    platform: str  # "gpu", "cpu", "rocm"
    core_count: int  # SMs on NVIDIA, CUs on AMD, host cores on CPU
    memory_bytes: int
    compute_capability: str  # "9.0", "gfx942", or "" on CPU
    driver: str
    runtime: str  # CUDA or ROCm runtime version, "" on CPU
    jax_version: str
    jaxlib_version: str

    # Recorded, but not part of the hash: what jax reports depends on the process's allocator settings
    # (on the H200, 0 under XLA_PYTHON_CLIENT_ALLOCATOR=platform, which tuning workers use), so hashing it
    # would make a sweep's winners stale for the very programs that use them. The model name and core
    # count already tell devices apart.
    UNHASHED: ClassVar[tuple[str, ...]] = ("memory_bytes",)

    @property
    def hash(self) -> str:
        facts = {k: v for k, v in dataclasses.asdict(self).items() if k not in self.UNHASHED}
        return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceFingerprint:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def compile_only_device(device_kind: str, platform: str, target: str) -> DeviceFingerprint:
    """A stand-in fingerprint for a compile-only target this machine lacks: it names the target and
    nothing else, so it is never mistaken for a timing device."""
    return DeviceFingerprint(
        device_kind=device_kind,
        platform=platform,
        core_count=0,
        memory_bytes=0,
        compute_capability=target,
        driver="",
        runtime="",
        jax_version="",
        jaxlib_version="",
    )


def _attr(device: Any, *names: str, default: Any = "") -> Any:
    for name in names:
        value = getattr(device, name, None)
        if value not in (None, ""):
            return value
    return default


def fingerprint_of(device: Any) -> DeviceFingerprint:
    """Fingerprint of one jax device."""
    import jax
    import jaxlib

    if device.platform == "cpu":
        import os

        core_count = os.cpu_count() or 1
        memory = 0
        kind = "cpu"
        capability = platform.machine()
    else:
        core_count = int(_attr(device, "core_count", default=0))
        memory = _cuda_total_memory(int(getattr(device, "local_hardware_id", 0) or 0))
        kind = device.device_kind
        capability = str(_attr(device, "compute_capability", default=""))
    # The runtime as the device's client reports it (e.g. "cuda 13000"). Read from the device itself:
    # `jax.extend` exists only once something imported it, and a fingerprint must not depend on imports.
    client = getattr(device, "client", None)
    runtime = str(getattr(client, "platform_version", "") or "") if device.platform != "cpu" else ""
    return DeviceFingerprint(
        device_kind=kind,
        platform=device.platform,
        core_count=core_count,
        memory_bytes=memory,
        compute_capability=capability,
        driver=_driver_version() if device.platform == "gpu" else "",
        runtime=runtime,
        jax_version=jax.__version__,
        jaxlib_version=jaxlib.__version__,
    )


def _cuda_total_memory(ordinal: int) -> int:
    """Total memory of a CUDA device, from the driver (jax reports only its allocator limit); 0 if unknown."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    device, total = ctypes.c_int(0), ctypes.c_size_t(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
        return 0
    if cuda.cuDeviceTotalMem_v2(ctypes.byref(total), device) != 0:
        return 0
    return int(total.value)


def _driver_version() -> str:
    try:
        with open("/proc/driver/nvidia/version") as f:
            first = f.readline()
    except OSError:
        return ""
    parts = [p for p in first.split() if p[:1].isdigit() and "." in p]
    return parts[0] if parts else ""


@functools.cache
def current_fingerprint() -> DeviceFingerprint:
    """Fingerprint of jax's default device; cached because it cannot change within a process."""
    import jax

    return fingerprint_of(jax.devices()[0])
