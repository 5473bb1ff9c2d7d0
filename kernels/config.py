"""Base for every backend's frozen Config: JSON round-trip and config-only validation at construction.

A backend's Config is a frozen, slotted dataclass (hashable, so a static jit argument and a dict key)
that subclasses `KernelConfig` and overrides `validate()` to raise ConfigInvalid for rules that need no
problem (e.g. block_m a multiple of 64). Rules that need the problem or the device are constraints in
`moetune.kernels.backends.<backend>.space`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Self

from moetune.kernels.errors import ConfigInvalid


@dataclasses.dataclass(frozen=True, slots=True)
class KernelConfig:
    def __post_init__(self) -> None:
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if not isinstance(value, (int, str, bool, float)) or value is None:
                raise ConfigInvalid(f"{name}={value!r}: config fields must be int, float, bool or str")
        self.validate()

    def validate(self) -> None:
        """Raise ConfigInvalid when the config breaks one of its own rules."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        names = set(_field_names(cls))
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigInvalid(f"unknown {cls.__qualname__} fields: {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls.from_dict(json.loads(text))

    def __str__(self) -> str:
        # key=value pairs: also used as the kernel name, so a profiler trace shows which config ran.
        return ",".join(f"{k}={v}" for k, v in self.to_dict().items())


# Once per class: a heuristic's ranking builds tens of thousands of configs, and dataclasses.fields
# filters a class's fields anew at every call.
@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))
