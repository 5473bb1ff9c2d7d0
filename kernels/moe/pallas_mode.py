"""How a model-side Pallas kernel runs, resolved from the caller's argument; and the padded size their
Triton tensors take.

    auto       "kernel" where jax's default backend is a GPU, "xla" elsewhere (every argument's default)
    kernel     compiled for the GPU
    xla        not at all: the plain-JAX ops it replaces
    interpret  in Pallas's interpreter, on any backend: how CPU tests run the kernel's own code

The choice is an argument (a static one under jit: a string, so hashable), never process state: two
calls that choose differently trace two programs, and nothing needs jax.clear_caches().
"""

from __future__ import annotations

from typing import Literal, get_args

import jax

from moetune.kernels.errors import ConfigInvalid

Mode = Literal["auto", "kernel", "xla", "interpret"]
MODES: tuple[str, ...] = get_args(Mode)


def check(mode: str, what: str = "mode") -> str:
    """`mode` itself, or ConfigInvalid naming `what` and the modes."""
    if mode not in MODES:
        raise ConfigInvalid(f"{what}={mode!r}; expected one of {', '.join(MODES)}")
    return mode


def resolve(mode: str, what: str = "mode") -> str:
    """ "kernel", "xla" or "interpret": `mode` with "auto" resolved for jax's default backend (at trace
    time, where the kernel would run)."""
    if check(mode, what) == "auto":
        return "kernel" if jax.default_backend() == "gpu" else "xla"
    return mode


def pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (n >= 1). Triton's tensors have power-of-two dimensions, so the
    kernels load a dimension padded to this and mask the rest."""
    return 1 << (n - 1).bit_length()
