"""/api/misses: GET the dispatch misses most counted first (as `moetune misses --json`); POST a batch of
them from JAX processes (the token; a bounded body of at most MAX_BATCH misses, each validated as a
config pack's device and problem are), counted atomically through Store.record_misses."""

from __future__ import annotations

import collections
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from moetune.db.store import Store
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.pack_schema import DeviceModel, Name, ProblemModel
from moetune.kernels.problem import Problem
from moetune.service.auth import require_read, require_token
from moetune.service.deps import store
from moetune.service.filters import BackendQuery, DeviceKindQuery, Limit, Offset, check_known
from moetune.service.json_body import StrictJSON
from moetune.tuner.listings.misses import RESOLVED, MissStatus, miss_dict

MAX_BATCH = 1000
# A miss is ~600 bytes of JSON; a full batch fits with room to spare, and no more is read into memory.
MAX_BODY_BYTES = 1 << 20


class BoundedBody(APIRoute):
    """Reads at most MAX_BODY_BYTES of a request body (413 beyond), before FastAPI parses any of it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            declared = request.headers.get("content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
                return _too_large()
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    return _too_large()

            async def replay() -> dict[str, Any]:
                return {"type": "http.request", "body": bytes(body), "more_body": False}

            return await handler(Request(request.scope, replay))

        return bounded


def _too_large() -> Response:
    return StrictJSON({"detail": f"request body over {MAX_BODY_BYTES} bytes"}, status_code=413)


router = APIRouter(prefix="/api/misses", tags=["misses"], route_class=BoundedBody)


class MissIn(BaseModel):
    """One lookup that found no winner: on which device, for which backend and problem."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    device: DeviceModel
    backend: Name
    problem: ProblemModel


class MissBatch(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    misses: Annotated[list[MissIn], Field(min_length=1, max_length=MAX_BATCH)]


class Counted(BaseModel):
    counted: int


class MissOut(BaseModel):
    """One miss (the fields of `moetune misses --json`)."""

    model_config = ConfigDict(extra="allow")

    gpu: str
    fingerprint_hash: str
    backend: str
    problem: str
    count: int
    status: str


@router.get("", response_model=list[MissOut], response_class=StrictJSON, dependencies=[Depends(require_read)])
def misses(
    db: Annotated[Store, Depends(store)],
    device_kind: DeviceKindQuery = None,
    backend: BackendQuery = None,
    unresolved: bool = False,
    limit: Limit = 100,
    offset: Offset = 0,
) -> StrictJSON:
    """Misses, most counted first, each missed or resolved (a later sweep tuned it on that device with
    the current kernel source) or unknown (its backend cannot be loaded on this server)."""
    check_known("device_kind", device_kind, db.device_kinds())
    check_known("backend", backend, db.backends())
    status_of = MissStatus(db)
    rows = db.misses(device_kind=device_kind, backend=backend)
    if unresolved:
        listed = [(row, status) for row in rows if (status := status_of(row)) != RESOLVED]
        listed = listed[offset : offset + limit]
    else:
        listed = [(row, status_of(row)) for row in rows[offset : offset + limit]]
    return StrictJSON([miss_dict(row, status) for row, status in listed])


def _counted(batch: MissBatch) -> collections.Counter[tuple[DeviceFingerprint, str, Problem]]:
    counted: collections.Counter[tuple[DeviceFingerprint, str, Problem]] = collections.Counter()
    for i, miss in enumerate(batch.misses):
        try:  # the rules between fields (an even n for swiglu's two halves)
            problem = Problem(**miss.problem.model_dump(exclude={"schema_version"}))
        except ConfigInvalid as e:
            raise HTTPException(422, f"misses.{i}.problem: {e}") from None
        counted[DeviceFingerprint(**miss.device.model_dump()), miss.backend, problem] += 1
    return counted


@router.post("", response_model=Counted, dependencies=[Depends(require_token)])
def post_misses(batch: MissBatch, db: Annotated[Store, Depends(store)]) -> Counted:
    """Count a batch of misses (at most MAX_BATCH); 422 naming the first bad one, nothing counted."""
    db.record_misses(_counted(batch))
    return Counted(counted=len(batch.misses))
