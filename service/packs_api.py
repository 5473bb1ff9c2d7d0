"""GET /api/packs/{device_kind}/{backend}: the config pack `moetune export` writes for that GPU model and
backend, byte for byte, so moetune.kernels.packs loads it. Its strong ETag is a hash of those bytes; a
request whose If-None-Match names it gets 304 and no body, which is how JAX processes poll cheaply."""

from __future__ import annotations

import hashlib
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Response

from moetune.db.store import Store
from moetune.kernels.pack_schema import PackModel
from moetune.service.auth import require_read
from moetune.service.deps import store
from moetune.service.filters import BackendPath, DeviceKindPath

router = APIRouter(prefix="/api/packs", tags=["packs"], dependencies=[Depends(require_read)])


def etag_of(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def _matches(if_none_match: str, etag: str) -> bool:
    """If-None-Match's weak comparison (RFC 9110 13.1.2): any listed tag, W/ or not, or `*`."""
    tags = [tag.strip().removeprefix("W/") for tag in if_none_match.split(",")]
    return "*" in tags or etag in tags


@router.get(
    "/{device_kind}/{backend}",
    response_model=PackModel,
    responses={304: {"description": "The pack is unchanged since the ETag given in If-None-Match."}},
)
def pack(
    device_kind: DeviceKindPath,
    backend: BackendPath,
    db: Annotated[Store, Depends(store)],
    if_none_match: Annotated[str | None, Header(max_length=1024)] = None,
) -> Response:
    """The active winners of one GPU model and backend as a config pack; 404 (naming the GPU models and
    backends that have winners) when there are none."""
    body = (db.export_pack(device_kind=device_kind, backend=backend).dumps() + "\n").encode()
    etag = etag_of(body)
    # no-cache: a client may keep the pack, but asks (If-None-Match) before using it again.
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if if_none_match is not None and _matches(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)
