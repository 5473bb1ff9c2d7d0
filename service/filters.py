"""Query and path parameters the read routers share: bounded and typed, so a bad value is a 422 with one
line before anything touches the database; names are then checked against what the database knows."""

from __future__ import annotations

from typing import Annotated

from fastapi import HTTPException, Path, Query

from moetune.kernels.pack_schema import DEVICE_TEXT_LENGTHS, NAME_LENGTH
from moetune.kernels.typed_fields import INT32_MAX, NAME_PATTERN

DEVICE_KIND_LENGTH = DEVICE_TEXT_LENGTHS["device_kind"]
PAGE_MAX = 1000  # rows per page of a listing that may be long (trials, misses)

DeviceKindQuery = Annotated[
    str | None,
    Query(min_length=1, max_length=DEVICE_KIND_LENGTH, description="GPU model (jax device_kind)."),
]
BackendQuery = Annotated[
    str | None, Query(max_length=NAME_LENGTH, pattern=NAME_PATTERN, description="Backend name.")
]
DimQuery = Annotated[int | None, Query(ge=1, le=INT32_MAX)]
ProblemKeyQuery = Annotated[
    str | None, Query(min_length=1, max_length=255, description="Problem key (see /api/winners).")
]
DeviceKindPath = Annotated[str, Path(min_length=1, max_length=DEVICE_KIND_LENGTH)]
BackendPath = Annotated[str, Path(max_length=NAME_LENGTH, pattern=NAME_PATTERN)]
Limit = Annotated[int, Query(ge=1, le=PAGE_MAX, description=f"Rows per page, at most {PAGE_MAX}.")]
Offset = Annotated[int, Query(ge=0, le=INT32_MAX, description="Rows to skip (the next page).")]


def check_known(name: str, value: str | None, known: list[str]) -> None:
    """400 naming the known values when `value` is not one of them (None: no filter)."""
    if value is not None and value not in known:
        shown = ", ".join(map(repr, known)) or "none"
        raise HTTPException(400, f"no {name} {value!r} in the database; known: {shown}")
