"""The `mosaic_gpu` backend (Pallas Mosaic GPU grouped GEMM for Hopper); registered by exposing BACKEND."""

from moetune.kernels.backends.mosaic_gpu.backend import MosaicGpuBackend
from moetune.kernels.backends.mosaic_gpu.config import MosaicGpuConfig

BACKEND = MosaicGpuBackend()

__all__ = ["BACKEND", "MosaicGpuBackend", "MosaicGpuConfig"]
