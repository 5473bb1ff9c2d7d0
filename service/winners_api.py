"""GET /api/winners and /api/winners/stale: the database's winners as `moetune best --json` lists them
(moetune.tuner.listings.winners), judged fresh or stale against this server's device and kernel sources."""

from __future__ import annotations

import threading
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict

from moetune.db.records import WINNER_STATES
from moetune.db.store import Store
from moetune.service.auth import require_read
from moetune.service.deps import store
from moetune.service.filters import (
    BackendQuery,
    DeviceKindQuery,
    DimQuery,
    Limit,
    Offset,
    ProblemKeyQuery,
    check_known,
)
from moetune.service.json_body import StrictJSON
from moetune.tuner.listings.winners import STALE, Listed, Stack, database_winners, winner_dict

router = APIRouter(prefix="/api/winners", tags=["winners"], dependencies=[Depends(require_read)])
_stack_lock = threading.Lock()


class WinnerOut(BaseModel):
    """One winner (the fields of `moetune best --json`)."""

    model_config = ConfigDict(extra="allow")

    id: int | None
    trial_id: int | None
    device_kind: str
    fingerprint_hash: str | None
    backend: str
    source_hash: str | None
    problem: dict[str, Any]
    tokens: int | None
    config: dict[str, Any]
    median_s: float | None
    decided: dict[str, Any]
    state: str
    reason: str
    origin: str
    freshness: str
    stale: list[str]


def _stack(request: Request) -> Stack:
    """One per server: reading the device fingerprint and kernel sources costs a jax start-up."""
    with _stack_lock:
        if getattr(request.app.state, "winner_stack", None) is None:
            request.app.state.winner_stack = Stack()
        return request.app.state.winner_stack


def _listed(
    request: Request,
    db: Store,
    *,
    device_kind: str | None,
    backend: str | None,
    op: str | None,
    problem: str | None,
    state: str | None,
    dims: dict[str, int | None],
    page: slice | None = None,
) -> list[Listed]:
    from moetune.kernels import ops

    check_known("device_kind", device_kind, db.device_kinds())
    check_known("backend", backend, db.backends())
    check_known("op", op, ops.names())
    listed = database_winners(
        db,
        device_kind=device_kind,
        backend=backend,
        problem_key=problem,
        active_only=state == "active",
        **dims,
    )
    listed = [
        item
        for item in listed
        if (op is None or item.winner.problem.op == op) and (state is None or item.row.state == state)
    ]
    if page is not None:  # only the page is judged: judging reads every winner's kernel source
        listed = listed[page]
    return _stack(request).judged(listed) if listed else []


@router.get("", response_model=list[WinnerOut], response_class=StrictJSON)
def winners(
    request: Request,
    db: Annotated[Store, Depends(store)],
    device_kind: DeviceKindQuery = None,
    backend: BackendQuery = None,
    op: Annotated[str | None, Query(max_length=64)] = None,
    m: DimQuery = None,
    k: DimQuery = None,
    n: DimQuery = None,
    g: DimQuery = None,
    problem: ProblemKeyQuery = None,
    state: Annotated[Literal[WINNER_STATES] | None, Query(description="Only winners in this state.")] = None,
    history: Annotated[bool, Query(description="Also superseded and rolled-back winners.")] = False,
    limit: Limit = 100,
    offset: Offset = 0,
) -> StrictJSON:
    """Winners per GPU model, backend and problem (the active ones, unless `history` or `state`), each
    with the time that decided it and whether it is fresh on this server's stack; `limit` at a time
    from `offset`, in `moetune best`'s order."""
    if state is None and not history:
        state = "active"
    filters = dict(device_kind=device_kind, backend=backend, op=op, problem=problem, state=state)
    page = slice(offset, offset + limit)
    listed = _listed(request, db, **filters, dims=dict(m=m, k=k, n=n, g=g), page=page)
    return StrictJSON([winner_dict(item) for item in listed])


@router.get("/stale", response_model=list[WinnerOut], response_class=StrictJSON)
def stale_winners(
    request: Request,
    db: Annotated[Store, Depends(store)],
    device_kind: DeviceKindQuery = None,
    backend: BackendQuery = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> StrictJSON:
    """Active winners that are stale here (tuned with another kernel source than the server's, or on
    another fingerprint of the server's own GPU model), each with why: what `moetune tune --stale`
    re-tunes."""
    filters = dict(device_kind=device_kind, backend=backend, op=None, problem=None, state="active")
    listed = _listed(request, db, **filters, dims={})
    stale = [item for item in listed if item.freshness == STALE][offset : offset + limit]
    return StrictJSON([winner_dict(item) for item in stale])
