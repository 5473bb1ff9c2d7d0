"""How a model-side Pallas kernel runs, chosen at trace time from an environment variable; and the
padded size their Triton tensors take.

    kernel     compiled for the GPU (the default where jax's backend is a GPU)
    xla        not at all: the plain-JAX ops it replaces (the default elsewhere)
    interpret  in Pallas's interpreter, on any backend: how CPU tests run the kernel's own code

jit traces once per function and static arguments, so a change takes effect after jax.clear_caches().
"""

from __future__ import annotations

import os

import jax

MODES = ("kernel", "interpret", "xla")


def mode(env: str) -> str:
    chosen = os.environ.get(env) or ("kernel" if jax.default_backend() == "gpu" else "xla")
    if chosen not in MODES:
        raise ValueError(f"${env}={chosen!r}; expected one of {', '.join(MODES)}")
    return chosen


def pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (n >= 1). Triton's tensors have power-of-two dimensions, so the
    kernels load a dimension padded to this and mask the rest."""
    return 1 << (n - 1).bit_length()
