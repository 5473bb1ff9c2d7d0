"""The op registry: every op moetune computes, one module per op in this package exposing `SPEC`.

Names come from the modules here (and nowhere else), so adding an op is one spec file plus one kernel per
backend that serves it (docs/adding-an-op.md). Modules are imported on first use; an unknown name lists
the registered ones.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.ops.spec import Operand, OpSpec, Vjp

# The two ops most callers name; every other one is reached by its name through `get`.
GROUPED_MATMUL = "grouped_matmul"
GROUPED_MATMUL_SWIGLU = "grouped_matmul_swiglu"
GROUPED_MATMUL_DRHS = "grouped_matmul_drhs"
GROUPED_MATMUL_FP8 = "grouped_matmul_fp8"
GROUPED_MATMUL_SWIGLU_FP8 = "grouped_matmul_swiglu_fp8"

_NOT_OPS = frozenset({"spec", "fp8_scales"})
_loaded: dict[str, OpSpec] = {}


def names() -> list[str]:
    """Every registered op name."""
    return list(_names())


@functools.cache
def _names() -> tuple[str, ...]:
    # Listed once: the package's modules do not change while it runs, and a pack's validation asks for
    # every entry (listing the folder each time was over half the time loading the shipped pack took).
    modules = pkgutil.iter_modules(__path__)
    return tuple(sorted(m.name for m in modules if m.name not in _NOT_OPS and not m.ispkg))


def get(name: str) -> OpSpec:
    """The spec of op `name`; ConfigInvalid listing the registered ops when there is none."""
    spec = _loaded.get(name)
    if spec is not None:
        return spec
    if name not in names():
        raise ConfigInvalid(f"unknown op {name!r}; registered: {', '.join(names())}")
    spec = importlib.import_module(f"{__name__}.{name}").SPEC
    if not isinstance(spec, OpSpec) or spec.name != name:
        raise ConfigInvalid(f"{__name__}.{name} has no SPEC of an OpSpec named {name!r}")
    _loaded[name] = spec
    return spec


def fusing(epilogue: str) -> OpSpec | None:
    """The op that applies the gated activation `epilogue` ("swiglu", "geglu") to its grouped GEMM's
    float32 product, or None when no op fuses it."""
    return next((s for s in map(get, names()) if s.epilogue == epilogue and epilogue), None)


__all__ = [
    "GROUPED_MATMUL",
    "GROUPED_MATMUL_DRHS",
    "GROUPED_MATMUL_FP8",
    "GROUPED_MATMUL_SWIGLU",
    "GROUPED_MATMUL_SWIGLU_FP8",
    "OpSpec",
    "Operand",
    "Vjp",
    "fusing",
    "get",
    "names",
]
