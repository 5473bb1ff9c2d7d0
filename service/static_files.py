"""The dashboard's own files, served by the app from this package (service/static/): its stylesheet,
live.js (the live parts of the pages) and table.js (sortable, filterable tables). Each answers with an
ETag and no-cache, so a browser revalidates it (a 304) and sees a new version at once after an upgrade."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, Response

from moetune.service.auth import require_read

FOLDER = Path(__file__).parent / "static"
FILES = {"dashboard.css": "text/css", "live.js": "text/javascript", "table.js": "text/javascript"}

router = APIRouter(dependencies=[Depends(require_read)], include_in_schema=False)


@functools.cache
def _stat(name: str) -> Any:
    return (FOLDER / name).stat()


def _serve(name: str, request: Request) -> Response:
    headers = {"Cache-Control": "no-cache"}
    response = FileResponse(FOLDER / name, media_type=FILES[name], headers=headers, stat_result=_stat(name))
    if request.headers.get("if-none-match") == response.headers["etag"]:
        return Response(status_code=304, headers={"ETag": response.headers["etag"], **headers})
    return response


def _route(name: str) -> None:
    def serve(request: Request) -> Response:
        return _serve(name, request)

    router.add_api_route(f"/static/{name}", serve, methods=["GET"], name=f"static {name}")


for _name in FILES:
    _route(_name)
