"""/docs (Swagger UI) and /redoc over /openapi.json, with their scripts and styles served by this server
from the fastapi-offline package (MIT; it ships Swagger UI's and ReDoc's release bundles), never from a
CDN: a team's server often has no internet, and a page that loads a CDN's script also trusts it with
whatever the page can read.

Without fastapi-offline installed the two pages answer 404 naming the package; the API is unchanged.
"""

from __future__ import annotations

import functools
from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response

from moetune.service.auth import require_read

ASSETS = "/static/docs"
FILES = {  # the name served -> its media type
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
MAX_AGE_S = 7 * 24 * 3600  # the files change only with the package: revalidated by their ETag

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_read)])


@functools.cache
def _folder() -> Path | None:
    try:
        import fastapi_offline
    except ImportError:
        return None
    return Path(fastapi_offline.__file__).parent / "static"


def _needed() -> Path:
    folder = _folder()
    if folder is None:
        raise HTTPException(404, "API pages need the fastapi-offline package (pip install fastapi-offline)")
    return folder


@router.get("/docs", response_class=HTMLResponse)
def swagger(request: Request) -> HTMLResponse:
    _needed()
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url,
        title=f"{request.app.title} API",
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS}/favicon.png",
        # validatorUrl: Swagger UI would otherwise send the schema to validator.swagger.io for a badge.
        swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False},
    )


@router.get("/redoc", response_class=HTMLResponse)
def redoc(request: Request) -> HTMLResponse:
    _needed()
    return get_redoc_html(
        openapi_url=request.app.openapi_url,
        title=f"{request.app.title} API",
        redoc_js_url=f"{ASSETS}/redoc.standalone.js",
        redoc_favicon_url=f"{ASSETS}/favicon.png",
        with_google_fonts=False,
    )


@router.get(ASSETS + "/{name}")
def asset(name: str, request: Request) -> Response:
    if name not in FILES:
        raise HTTPException(404, "no such file")
    path = _needed() / name
    headers = {"Cache-Control": f"public, max-age={MAX_AGE_S}"}
    response = FileResponse(path, media_type=FILES[name], headers=headers, stat_result=path.stat())
    if request.headers.get("if-none-match") == response.headers["etag"]:
        return Response(status_code=304, headers={"ETag": response.headers["etag"], **headers})
    return response
