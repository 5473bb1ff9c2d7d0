"""A config as a table shows it: only the fields that differ from its backend's default Config.

Every config of a backend has the same fields in the same order, so a table printing whole configs cuts
them off exactly where they differ. Example (mosaic_gpu): block_m=64,split_k=2 instead of thirteen
fields. Where the backend is not known here (a pack of a backend this install lacks), the whole config.
--json output keeps whole configs.
"""

from __future__ import annotations

from typing import Any

DEFAULTS = "defaults"  # what a table shows for the default config itself


def _defaults(backend: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """The default config of the backend's Config that `config` is one of: of the backend's Configs (one
    per op where an op has its own, Backend.config_classes), the one sharing the most fields with it."""
    from moetune.kernels import registry
    from moetune.kernels.errors import MoetuneError

    try:
        defaults = [cls().to_dict() for cls in registry.get(backend).config_classes()]
    except (MoetuneError, ImportError, TypeError):  # unknown here, or a Config without defaults
        return None
    return max(defaults, key=lambda d: len(d.keys() & config.keys()))


def changed(backend: str, config: dict[str, Any]) -> dict[str, Any]:
    """The fields of `config` that differ from the backend's default Config (all of them when unknown), in
    the order the Config declares them: a config reads the same whether it came from a row or from sorted
    JSON. Fields the Config lacks follow, as given."""
    defaults = _defaults(backend, config)
    if defaults is None:
        return dict(config)
    declared = [k for k in defaults if k in config and config[k] != defaults[k]]
    return {k: config[k] for k in declared} | {k: v for k, v in config.items() if k not in defaults}


def text(backend: str, config: dict[str, Any] | None) -> str:
    """ "block_m=64,split_k=2"; DEFAULTS for the default config; "" for none."""
    if config is None:
        return ""
    fields = changed(backend, config)
    return ",".join(f"{k}={v}" for k, v in fields.items()) if fields else DEFAULTS
