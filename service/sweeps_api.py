"""GET /api/sweeps, /api/sweeps/{id} and /api/sweeps/{id}/trials: as `moetune sweeps --json` and
`moetune trials --json` print them (moetune.tuner.listings), trials a bounded page at a time."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict

from moetune.db.records import TRIAL_STATUSES
from moetune.db.store import Store
from moetune.kernels.typed_fields import INT32_MAX
from moetune.service.auth import require_read
from moetune.service.deps import store
from moetune.service.filters import PAGE_MAX, Limit, Offset
from moetune.service.json_body import StrictJSON
from moetune.tuner.listings.sweeps import sweep_dict
from moetune.tuner.listings.tokens import SweepTokens
from moetune.tuner.listings.trials import trial_dict

router = APIRouter(prefix="/api/sweeps", tags=["sweeps"], dependencies=[Depends(require_read)])
SweepId = Annotated[int, Path(ge=1, le=INT32_MAX)]


class SweepOut(BaseModel):
    """One sweep (the fields of `moetune sweeps --json`)."""

    model_config = ConfigDict(extra="allow")

    id: int
    status: str
    backend: str
    strategy: str
    device_kind: str | None
    problems: int
    trials: int
    created_at: str
    finished_at: str | None
    heartbeat_age_s: float | None


class TrialOut(BaseModel):
    """One trial (the fields of `moetune trials --json`)."""

    model_config = ConfigDict(extra="allow")

    id: int
    sweep_id: int | None
    backend: str
    problem: str
    config: dict[str, Any]
    status: str
    median_s: float | None
    samples_s: list[float | None]
    error: str


@router.get("", response_model=list[SweepOut], response_class=StrictJSON)
def sweeps(
    db: Annotated[Store, Depends(store)],
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX, description="Newest N sweeps.")] = 100,
    offset: Offset = 0,
) -> StrictJSON:
    """Sweeps, newest first, `limit` at a time from `offset`, with their status (dead: marked running,
    but its process stopped)."""
    return StrictJSON([sweep_dict(row) for row in db.sweeps(limit=offset + limit)[offset:]])


@router.get("/{sweep_id}", response_model=SweepOut, response_class=StrictJSON)
def sweep(sweep_id: SweepId, db: Annotated[Store, Depends(store)]) -> StrictJSON:
    """One sweep; 404 when there is none with that id."""
    return StrictJSON(sweep_dict(db.get_sweep(sweep_id)))


class ProgressOut(BaseModel):
    """What the sweep's driver last published (moetune.tuner.progress_db.as_json: planned, done, ok,
    failed, counts, rate_per_min, eta_s, lanes, problems, best, ...), and how old it is."""

    progress: dict[str, Any] | None
    age_s: float | None


@router.get("/{sweep_id}/progress", response_model=ProgressOut, response_class=StrictJSON)
def progress(sweep_id: SweepId, db: Annotated[Store, Depends(store)]) -> StrictJSON:
    """The sweep's live progress as its driver publishes it every few seconds; null before the first
    publication (a sweep recorded before progress was published, or one still setting up)."""
    published, age = db.sweep_progress(sweep_id)  # RecordNotFound: 404
    return StrictJSON({"progress": published, "age_s": None if age is None else round(age, 1)})


@router.get("/{sweep_id}/trials", response_model=list[TrialOut], response_class=StrictJSON)
def trials(
    sweep_id: SweepId,
    db: Annotated[Store, Depends(store)],
    status: Annotated[Literal[TRIAL_STATUSES] | None, Query(description="Only this status.")] = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> StrictJSON:
    """The sweep's trials, newest first, `limit` at a time from `offset`; 404 for an unknown sweep."""
    db.get_sweep(sweep_id)  # RecordNotFound: 404 rather than an empty page
    rows = db.trials(sweep_id=sweep_id, status=status, limit=limit, offset=offset)
    tokens = SweepTokens(db)
    return StrictJSON([trial_dict(row, tokens(row.sweep_id, row.problem.key)) for row in rows])
