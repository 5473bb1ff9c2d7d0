"""GET /api/packs/{device_kind}/{backend}: the config pack `moetune export` writes for that GPU model and
backend, byte for byte, so moetune.kernels.packs loads it. Its strong ETag is a hash of those bytes; a
request whose If-None-Match names it gets 304 and no body, which is how JAX processes poll cheaply.

A rendered pack is kept for CACHE_S and then read again, once (_Rendered): under many clients, most
requests cost a dictionary look-up instead of a database query and a JSON rendering, and a new winner
is served at most CACHE_S late (clients ask every few minutes)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response
from starlette.concurrency import run_in_threadpool

from moetune.db.store import Store
from moetune.kernels.pack_schema import PackModel
from moetune.service.auth import require_read
from moetune.service.filters import BackendPath, DeviceKindPath

router = APIRouter(prefix="/api/packs", tags=["packs"], dependencies=[Depends(require_read)])
CACHE_S = 1.0
Pack = tuple[bytes, str]  # a rendered pack: its body and ETag


class _Rendered:
    """The rendered packs of one server: (device_kind, backend) -> (read at, body, ETag), used only from
    the event loop. One render per pack at a time (single flight): when a copy expires, the first request
    starts a render in a worker thread and every request meanwhile awaits that one, so a herd of clients
    never renders the same pack fifty times at once (each render holds the GIL for ~10 ms)."""

    def __init__(self) -> None:
        self._packs: dict[tuple[str, str], tuple[float, bytes, str]] = {}
        self._rendering: dict[tuple[str, str], asyncio.Task] = {}

    async def get(self, key: tuple[str, str], render: Callable[[], Pack]) -> Pack:
        found = self._packs.get(key)
        if found is not None and time.monotonic() - found[0] <= CACHE_S:
            return found[1], found[2]
        task = self._rendering.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._render(key, render))
            self._rendering[key] = task
        return await asyncio.shield(task)  # one client leaving does not cancel the others' render

    async def _render(
        self, key: tuple[str, str], render: Callable[[], tuple[bytes, str]]
    ) -> tuple[bytes, str]:
        try:
            read_at = time.monotonic()
            body, etag = await run_in_threadpool(render)
            self._packs[key] = (read_at, body, etag)
            return body, etag
        finally:
            del self._rendering[key]


def _rendered(request: Request) -> _Rendered:
    state = request.app.state
    if getattr(state, "rendered_packs", None) is None:
        state.rendered_packs = _Rendered()
    return state.rendered_packs


def _render(db: Store, device_kind: str, backend: str) -> tuple[bytes, str]:
    body = (db.export_pack(device_kind=device_kind, backend=backend).dumps() + "\n").encode()
    return body, etag_of(body)


def winners_version(store: Store) -> tuple:
    """What every pack is made of, in one small query: the winners' count, the active ones' count and
    their newest id, promotion and retirement. A pack changes only when one of these does (its trials,
    devices and kernels rows never change once written)."""
    from sqlalchemy import case, func, select

    from moetune.db.models import Winner

    query = select(
        func.count(),
        func.sum(case((Winner.state == "active", 1), else_=0)),
        func.max(Winner.id),
        func.max(Winner.promoted_at),
        func.max(Winner.retired_at),
    )
    # Store._run: a read transaction with the store's error mapping, as every Store method uses it.
    return tuple(store._run(lambda s: s.execute(query).one(), write=False))


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
async def pack(
    request: Request,
    device_kind: DeviceKindPath,
    backend: BackendPath,
    if_none_match: Annotated[str | None, Header(max_length=1024)] = None,
) -> Response:
    """The active winners of one GPU model and backend as a config pack; 404 (naming the GPU models and
    backends that have winners) when there are none."""
    # async, with the database in a worker thread only when the cache has no fresh copy: a cached answer
    # never waits for a thread of the pool.
    store = request.app.state.store
    body, etag = await _rendered(request).get(
        (device_kind, backend), functools.partial(_render, store, device_kind, backend)
    )
    # no-cache: a client may keep the pack, but asks (If-None-Match) before using it again.
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if if_none_match is not None and _matches(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)
