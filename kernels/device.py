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
from typing import Any


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

    @property
    def hash(self) -> str:
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceFingerprint:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


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
        stats = {}
        try:
            stats = device.memory_stats() or {}
        except Exception:  # some runtimes do not report memory; the fingerprint records 0
            stats = {}
        memory = int(stats.get("bytes_limit", 0))
        kind = device.device_kind
        capability = str(_attr(device, "compute_capability", default=""))
    backend = jax.extend.backend.get_backend() if hasattr(jax, "extend") else None
    runtime = str(getattr(backend, "platform_version", "")) if device.platform != "cpu" else ""
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
