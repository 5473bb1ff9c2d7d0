"""The `xla` backend (plain XLA operations, CPU-runnable); registered by exposing BACKEND."""

from moetune.kernels.backends.xla.backend import XlaBackend
from moetune.kernels.backends.xla.config import XlaConfig

BACKEND = XlaBackend()

__all__ = ["BACKEND", "XlaBackend", "XlaConfig"]
