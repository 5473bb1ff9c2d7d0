"""Strict JSON for scripts and API clients: a NaN or infinity (json.dumps would write NaN or Infinity,
which strict parsers refuse) becomes null, a time its ISO 8601 text."""

from __future__ import annotations

import datetime
import json
import math
from typing import Any


def json_text(value: Any, **options: Any) -> str:
    """`value` as strict JSON text; `options` go to json.dumps."""
    return json.dumps(_finite(value), allow_nan=False, default=_plain, **options)


def _plain(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    return str(value)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
