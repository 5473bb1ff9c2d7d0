"""The `flydsl` backend (AMD gfx942/gfx950, FlyDSL -> HSACO); registered by exposing BACKEND.

Importing this package needs only jax and the standard library: flydsl itself runs in the compile
worker's own interpreter (toolchain.py), hip-python only in the timing process (hip_runtime.py).
"""

from moetune.kernels.backends.flydsl.backend import FlyDSLBackend, target_device
from moetune.kernels.backends.flydsl.config import FlyDSLConfig

BACKEND = FlyDSLBackend()

__all__ = ["BACKEND", "FlyDSLBackend", "FlyDSLConfig", "target_device"]
