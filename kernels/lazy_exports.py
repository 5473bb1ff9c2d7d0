"""A package's public names, loaded on first use (PEP 562 module __getattr__).

A package whose names live in heavy modules (the kernels, Pallas's lowerings) re-exports them this way, so
that importing one light module of the package (its errors, a problem's key) loads only what that module
needs. Each name loads from its home module when first read, then is an ordinary attribute.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(__getattr__, __dir__) for `package`, whose public name N lives in `package`.`homes[N]`."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
        setattr(sys.modules[package], name, value)  # later reads skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__
