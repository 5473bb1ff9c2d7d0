"""The API's JSON bodies: the same strict JSON `--json` prints (moetune.tuner.listings.json_values),
and one-line details for request validation errors."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from moetune.tuner.listings.json_values import json_text


class StrictJSON(JSONResponse):
    """A JSONResponse (so a route's response_model is its OpenAPI schema) rendered as strict JSON: the
    route builds it from the listing's own dicts, which FastAPI then does not validate again."""

    def render(self, content: Any) -> bytes:
        return json_text(content, sort_keys=True).encode()


async def one_line_validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    """422 with {"detail": "<where>: <what>"} for the first bad parameter or body field."""
    first = error.errors()[0] if error.errors() else {"loc": (), "msg": "invalid request"}
    where = ".".join(str(part) for part in first.get("loc", ()))
    return JSONResponse({"detail": f"{where}: {first.get('msg', 'invalid')}"}, status_code=422)
