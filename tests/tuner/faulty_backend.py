"""A backend whose configs misbehave on purpose, registered only in tests as "faulty".

Every mode fails in its own way and at its own phase; the fault tests count statuses per mode:

    ok          jax.lax.ragged_dot (variant 1 does it twice, so it is slower)           -> ok
    raise       build raises                                                             -> compile_error
    exit        build calls os._exit: the worker dies while compiling                    -> crashed
    segfault    build dereferences NULL: SIGSEGV while compiling                         -> crashed
    exit_run    the kernel calls os._exit from a host callback: dies on the device       -> crashed
    raise_run   the kernel raises from a host callback: fails on the device, worker lives -> crashed
    hang        build sleeps for an hour                                                 -> timeout
    wrong       returns zeros without computing: the fastest kernel, and wrong           -> wrong_result
    nan         one NaN in the output                                                    -> wrong_result
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import time

import jax
import jax.numpy as jnp

from moetune.kernels.backend import Backend
from moetune.kernels.config import KernelConfig
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.space import SearchSpace

MODES = ("ok", "raise", "exit", "segfault", "exit_run", "raise_run", "hang", "wrong", "nan")
EXPECTED_STATUS = {
    "ok": "ok",
    "raise": "compile_error",
    "exit": "crashed",
    "segfault": "crashed",
    "exit_run": "crashed",
    "raise_run": "crashed",
    "hang": "timeout",
    "wrong": "wrong_result",
    "nan": "wrong_result",
}


@dataclasses.dataclass(frozen=True, slots=True)
class FaultyConfig(KernelConfig):
    mode: str = "ok"
    variant: int = 0

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ConfigInvalid(f"mode={self.mode!r} is not one of {', '.join(MODES)}")


def variants_only_when_ok(problem, config: FaultyConfig, device) -> str | None:
    if config.variant and config.mode != "ok":
        return f"variant={config.variant} only applies to mode=ok"
    return None


def _exit_now() -> None:
    os._exit(7)


def _raise_now() -> None:
    raise RuntimeError("injected failure on the device")


class FaultyBackend(Backend):
    name = "faulty"
    config_cls = FaultyConfig
    kernels = {"grouped_matmul": "build"}  # made in build()

    def available(self, device) -> str | None:
        return None

    def search_space(self, problem, device) -> SearchSpace:
        return SearchSpace(FaultyConfig, {"mode": MODES, "variant": (0, 1)}, (variants_only_when_ok,))

    def heuristic(self, problem, device) -> FaultyConfig:
        return FaultyConfig()

    def source_hash(self) -> str:
        return "faulty-v1"

    def build(self, problem, config: FaultyConfig):
        mode = config.mode
        if mode == "raise":
            raise RuntimeError("injected failure while building")
        if mode == "exit":
            os._exit(3)
        if mode == "segfault":
            ctypes.string_at(0)
        if mode == "hang":
            time.sleep(3600)
        out_dtype = jnp.dtype(problem.out_dtype)

        def kernel(lhs, rhs, group_sizes):
            if mode == "wrong":
                return jnp.zeros((lhs.shape[0], rhs.shape[2]), out_dtype)
            if mode == "exit_run":
                jax.debug.callback(_exit_now)
            if mode == "raise_run":
                jax.debug.callback(_raise_now)
            out = jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32)
            if config.variant:
                out = (
                    out + jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32)
                ) / 2
            if mode == "nan":
                out = out.at[0, 0].set(jnp.nan)
            return out.astype(out_dtype)

        return kernel


BACKEND = FaultyBackend()
