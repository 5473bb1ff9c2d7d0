"""Backends by name. A backend is a sub-package `moetune.kernels.backends.<name>` exposing `BACKEND`.

Names come from the folders in kernels/backends/ (and nowhere else), so adding a backend touches
nothing outside its own folders.
Modules are imported on first use: a missing optional dependency only makes that backend unusable, and
the error names the package. Extra backends (tests, plug-ins) come from `register()` or from the
`MOETUNE_EXTRA_BACKENDS` environment variable ("name=module.path,..."), which child processes such as
Ray workers inherit.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

from moetune.kernels.backend import Backend
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import UnknownBackend

ENV_EXTRA = "MOETUNE_EXTRA_BACKENDS"
BUILTIN_PACKAGE = "moetune.kernels.backends"
_loaded: dict[str, Backend] = {}


def _extra_modules() -> dict[str, str]:
    table = {}
    for item in filter(None, os.environ.get(ENV_EXTRA, "").split(",")):
        name, _, module = item.partition("=")
        table[name.strip()] = module.strip()
    return table


def _builtin_names() -> list[str]:
    import moetune.kernels.backends as pkg

    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.ispkg)


def names() -> list[str]:
    """Every registered backend name, available on this device or not."""
    return sorted(set(_builtin_names()) | set(_extra_modules()))


def register(name: str, module: str) -> None:
    """Register an extra backend module (exposing BACKEND) for this process and its children."""
    table = _extra_modules()
    table[name] = module
    os.environ[ENV_EXTRA] = ",".join(f"{k}={v}" for k, v in sorted(table.items()))
    _loaded.pop(name, None)


def unregister(name: str) -> None:
    table = _extra_modules()
    table.pop(name, None)
    os.environ[ENV_EXTRA] = ",".join(f"{k}={v}" for k, v in sorted(table.items()))
    _loaded.pop(name, None)


def get(name: str) -> Backend:
    if name in _loaded:
        return _loaded[name]
    extra = _extra_modules()
    if name in extra:
        module_path = extra[name]
    elif name in _builtin_names():
        module_path = f"{BUILTIN_PACKAGE}.{name}"
    else:
        raise UnknownBackend(f"unknown backend {name!r}; registered: {', '.join(names())}")
    try:
        module = importlib.import_module(module_path)
    except ImportError as e:
        raise UnknownBackend(
            f"backend {name!r} could not be imported ({e}); is its optional dependency "
            f"{e.name or '?'} installed?"
        ) from e
    backend = getattr(module, "BACKEND", None)
    if not isinstance(backend, Backend):
        raise UnknownBackend(f"{module_path} has no BACKEND instance of moetune.kernels.backend.Backend")
    _loaded[name] = backend
    return backend


def available(device: DeviceFingerprint) -> dict[str, str | None]:
    """name -> None if usable on `device`, else the reason (including import failures)."""
    result: dict[str, str | None] = {}
    for name in names():
        try:
            result[name] = get(name).available(device)
        except UnknownBackend as e:
            result[name] = str(e)
    return result


def default_backend(device: DeviceFingerprint) -> Backend:
    """The highest-priority backend that is available on `device`."""
    usable = [get(n) for n, reason in available(device).items() if reason is None]
    if not usable:
        raise UnknownBackend(f"no backend is available on {device.device_kind}")
    return max(usable, key=lambda b: (b.priority, b.name))
