"""Each backend's current kernel source hash on this machine, read once per backend."""

from __future__ import annotations


class SourceHashes:
    def __init__(self) -> None:
        self._known: dict[str, str | None] = {}

    def __call__(self, backend: str) -> str | None:
        """None: not a backend here, its dependency is missing, or its source is not files."""
        from moetune.kernels import registry

        if backend not in self._known:
            try:
                self._known[backend] = registry.get(backend).source_hash()
            except Exception:  # any of the above: the caller says "unknown"
                self._known[backend] = None
        return self._known[backend]
