"""Strict, bounded types for what users hand moetune (config packs, sweep and model files), as pydantic
models, and their errors on one line.

Strict: 1 is not True, "4096" is not 4096, 4096.0 is not 4096. Bounded: an int fits a 32-bit Integer
column (PostgreSQL's; SQLite would take any size and a jit shape would overflow), a float is finite,
text is short and holds no control character (a newline would split a one-line error; an escape
sequence would drive the terminal that prints it). `fields_model(cls)` applies these to the fields of a
frozen dataclass, read from its own annotations, so a Config or a spec states its types once.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, create_model

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MAX = 2**63 - 1

# C0 controls, DEL and C1 controls.
NO_CONTROL_CHARACTERS = r"^[^\x00-\x1f\x7f-\x9f]*$"
NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
HASH_PATTERN = r"^[A-Za-z0-9._-]+$"
# 2026-11-29T12:00:00Z, optionally with fractions of a second or an offset instead of Z.
TIMESTAMP_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$"
_PATTERN_WORDS = {
    NO_CONTROL_CHARACTERS: "holds a control character",
    NAME_PATTERN: "must be lowercase letters, digits and _, starting with a letter",
    HASH_PATTERN: "must be letters, digits, '.', '_' or '-'",
    TIMESTAMP_PATTERN: "is not a time like 2026-11-29T12:00:00Z",
}

Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
STRICT = ConfigDict(strict=True, extra="forbid")


def text(max_length: int, *, min_length: int = 0) -> Any:
    """A string of at most `max_length` characters, none of them a control character."""
    return Annotated[
        str, StringConstraints(min_length=min_length, max_length=max_length, pattern=NO_CONTROL_CHARACTERS)
    ]


def bounded(annotation: Any, *, text_length: int) -> Any:
    """`annotation` with its leaves bounded: int -> Int32, float -> FiniteFloat, str -> text(text_length),
    through `X | None` and `tuple[X, ...]`; anything else as it is."""
    leaves = {int: Int32, float: FiniteFloat, str: text(text_length)}
    if annotation in leaves:
        return leaves[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union):
        return functools.reduce(operator.or_, (bounded(a, text_length=text_length) for a in args))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return tuple[bounded(args[0], text_length=text_length), ...]
    return annotation


@functools.cache
def fields_model(cls: type, *, text_length: int) -> type[BaseModel]:
    """A strict pydantic model of the dataclass `cls`'s fields, their annotations `bounded`; a field
    with a default may be left out, and no unknown field is taken."""
    hints = typing.get_type_hints(cls)
    fields = {
        f.name: (
            bounded(hints[f.name], text_length=text_length),
            f.default if f.default is not dataclasses.MISSING else ...,
        )
        for f in dataclasses.fields(cls)
    }
    return create_model(f"{cls.__name__}Fields", __config__=STRICT, **fields)


def check_fields(instance: Any, *, text_length: int) -> None:
    """Raise ValidationError unless every field of the dataclass `instance` has its bounded type."""
    values = {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}
    fields_model(type(instance), text_length=text_length).model_validate(values)


def describe(error: ValidationError, data: Any = None) -> str:
    """The first problem of a ValidationError on one line: 'entries[3].problem.m=0: input should be
    greater than or equal to 1'.

    Given the validated `data`, location parts that do not index into it (pydantic's names of union
    members and validators) are left out of the path.
    """
    first = error.errors(include_url=False)[0]
    kind = first["type"]
    path, node = "", data
    loc = first["loc"]
    for i, part in enumerate(loc):
        inside = data is None or _indexes(node, part)
        if not inside and not (kind == "missing" and i == len(loc) - 1):
            continue  # a union member's name or tag (a pack entry's problem version), a validator's
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        node = node[part] if inside and data is not None else None
    if kind == "extra_forbidden":
        message = "unknown field"
    elif kind == "missing":
        message = "missing field"
    else:
        ctx = first.get("ctx", {})
        if kind == "value_error":
            message = str(ctx.get("error", "")) or first["msg"]
        elif kind == "string_pattern_mismatch":
            message = _PATTERN_WORDS.get(ctx.get("pattern"), first["msg"])
        else:
            message = first["msg"]
        message = message[:1].lower() + message[1:]
        shown = repr(first["input"])
        path = f"{path}={shown if len(shown) <= 40 else shown[:37] + '...'}" if path else path
    more = error.error_count() - 1
    return f"{path or 'value'}: {message}" + (f" (and {more} more problems)" if more else "")


def _indexes(node: Any, part: Any) -> bool:
    if isinstance(node, Mapping):
        return part in node
    if isinstance(node, (list, tuple)):
        return isinstance(part, int) and 0 <= part < len(node)
    return False
