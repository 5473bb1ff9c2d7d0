"""How a model-side Pallas kernel runs, chosen at trace time from an environment variable.

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
