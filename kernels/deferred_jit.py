"""jax.jit applied at a function's first call instead of at its definition.

The op specs (moetune.kernels.ops) define jitted draws beside their operands' shapes and FLOPs, which the
CLI and the service read in processes that never compute: deferring the jit keeps jax (about a second to
import) out of those processes. The function's body imports what it computes with.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def deferred_jit(**options: Any) -> Callable[[Callable], Callable]:
    """A decorator: `jax.jit(fn, **options)`, built when the result is first called."""

    def decorate(fn: Callable) -> Callable:
        @functools.cache
        def jitted() -> Callable:
            import jax

            return jax.jit(fn, **options)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return jitted()(*args, **kwargs)

        return call

    return decorate
