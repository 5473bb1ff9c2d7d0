"""Search strategies by name: `get(name)` returns the class; modules load on first use (tpe needs Optuna)."""

from __future__ import annotations

import importlib

from moetune.kernels.errors import ConfigInvalid
from moetune.tuner.strategies.base import CandidateSpace, Strategy

_MODULES = {
    "grid": ("moetune.tuner.strategies.grid", "GridStrategy"),
    "random": ("moetune.tuner.strategies.random", "RandomStrategy"),
    "tpe": ("moetune.tuner.strategies.tpe", "TpeStrategy"),
}


def names() -> list[str]:
    return list(_MODULES)


def get(name: str) -> type[Strategy]:
    if name not in _MODULES:
        raise ConfigInvalid(f"unknown strategy {name!r}; known: {', '.join(_MODULES)}")
    module_path, class_name = _MODULES[name]
    try:
        module = importlib.import_module(module_path)
    except ImportError as e:
        raise ConfigInvalid(f"strategy {name!r} needs the package {e.name or '?'}; is it installed?") from e
    return getattr(module, class_name)


__all__ = ["CandidateSpace", "Strategy", "get", "names"]
