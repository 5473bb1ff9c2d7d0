"""The tuning queue over HTTP: POST /api/jobs (a sweep spec; the token), GET /api/jobs, GET /api/jobs/{id},
POST /api/jobs/{id}/cancel (the token). A submitted spec is checked by the code that checks `moetune
submit`'s, and may name no file of the server (moetune.tuner.queue_spec.from_request)."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import typing
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, status
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from starlette.concurrency import run_in_threadpool

from moetune.db.jobs import JOB_STATES
from moetune.db.store import Store
from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.typed_fields import INT32_MAX
from moetune.service.auth import require_read, require_token
from moetune.service.deps import store
from moetune.service.filters import Limit, Offset

# A sweep spec is under 1 kB; a request of more is refused before it is read whole.
MAX_BODY_BYTES = 64 << 10
# Beside the sweep's fields, a request may set these two of the job's.
QUEUE_FIELDS = ("priority", "device_kind")

router = APIRouter(prefix="/api/jobs", tags=["jobs"])


class JobOut(BaseModel):
    """One job (the fields of `moetune jobs show --json`)."""

    model_config = ConfigDict(extra="allow")

    id: int
    state: str = Field(description=f"One of {', '.join(JOB_STATES)}.")
    spec: dict[str, Any] = Field(description="The resolved sweep spec the worker runs.")
    sweep_file: str | None
    device_kind: str | None
    priority: int
    submitted_by: str
    created_at: datetime.datetime
    claimed_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    owner: str | None = Field(description="host:pid of the worker that runs it, or ran it last.")
    heartbeat_age_s: float | None
    sweep_id: int | None
    attempts: int
    error: str | None
    stale: bool = Field(description="Running, but its worker stopped heartbeating.")


@functools.cache
def job_request_model() -> type[BaseModel]:
    """The body of POST /api/jobs: every field of a sweep file (moetune.tuner.spec.SweepSpec, less where
    it runs) with its type, the singular `model` and `problem`, and the queue's `priority` and
    `device_kind`. Built from the spec's dataclass, so the documented body cannot drift from what a sweep
    file takes; the spec's own checks (tuner/queue_spec.py) still decide what runs."""
    from moetune.tuner import queue_spec
    from moetune.tuner.spec import SweepSpec

    hints = typing.get_type_hints(SweepSpec)
    fields: dict[str, Any] = {
        f.name: (hints[f.name] | None, None)
        for f in dataclasses.fields(SweepSpec)
        if f.name not in queue_spec.WHERE
    }
    fields |= {
        "model": (str | list[str] | None, Field(None, description="One or more shipped model names.")),
        "problem": (str | list[str] | None, Field(None, description="One or more problems.")),
        "routing": (str | list[str] | None, None),
        "priority": (int, Field(0, ge=-INT32_MAX, le=INT32_MAX, description="Higher runs first.")),
        "device_kind": (
            str | None,
            Field(None, min_length=1, max_length=128, description="Only a worker on this GPU model."),
        ),
    }
    # extra="allow": an unknown field is refused by the spec's check, which lists the known ones.
    return create_model("JobRequest", __config__=ConfigDict(extra="allow"), **fields)


def _request_schema() -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": job_request_model().model_json_schema()}},
        }
    }


StoreDep = Annotated[Store, Depends(store)]
JobId = Annotated[int, Path(ge=1, le=INT32_MAX)]
STATES_HELP = f"Only these states: {', '.join(JOB_STATES)}."


async def _body(request: Request) -> Any:
    too_large = HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"at most {MAX_BODY_BYTES} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY_BYTES:
            raise too_large
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise ConfigInvalid("the body is not JSON: send a sweep spec as a JSON object") from None


def _queue_fields(body: dict[str, Any]) -> tuple[int, str | None]:
    priority, device_kind = body.pop("priority", 0), body.pop("device_kind", None)
    if type(priority) is not int or not -INT32_MAX <= priority <= INT32_MAX:
        raise ConfigInvalid(f"priority={priority!r} must be an integer in [{-INT32_MAX}, {INT32_MAX}]")
    if device_kind is not None and not (isinstance(device_kind, str) and 0 < len(device_kind) <= 128):
        raise ConfigInvalid("device_kind must be a text of 1 to 128 characters")
    return priority, device_kind


def _typed(body: dict[str, Any]) -> None:
    """The body against JobRequest's types: the first wrong one is a one-line 400."""
    try:
        job_request_model().model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise ConfigInvalid(f"{where}: {first['msg']}") from None


@router.post(
    "",
    dependencies=[Depends(require_token)],
    status_code=status.HTTP_201_CREATED,
    response_model=JobOut,
    openapi_extra=_request_schema(),
)
async def submit_job(request: Request, db: StoreDep) -> dict[str, Any]:
    """Queue a sweep: the body is a sweep file's fields as JSON, plus optionally `priority` and
    `device_kind`. 400 with one line when the spec would not run; nothing is written then. (The body is
    read here, bounded, rather than by FastAPI: its schema is JobRequest's.)"""
    from moetune.tuner import queue_spec

    body = await _body(request)
    if not isinstance(body, dict):
        raise ConfigInvalid("the body must be a JSON object: a sweep spec")
    priority, device_kind = _queue_fields(body)
    _typed(body)
    spec = await run_in_threadpool(queue_spec.from_request, body, "request")
    fields = dict(device_kind=device_kind, priority=priority, submitted_by="api")
    job = await run_in_threadpool(lambda: db.get_job(db.submit_job(queue_spec.stored(spec), **fields)))
    return job.to_json()


@router.get("", dependencies=[Depends(require_read)], response_model=list[JobOut])
def list_jobs(
    db: StoreDep,
    state: Annotated[list[str], Query(description=STATES_HELP)] = [],  # noqa: B006 (FastAPI copies it)
    limit: Limit = 100,
    offset: Offset = 0,
) -> list[dict[str, Any]]:
    """Jobs, newest first, `limit` at a time from `offset`."""
    return [job.to_json() for job in db.jobs(states=tuple(state), limit=offset + limit)[offset:]]


@router.get("/{job_id}", dependencies=[Depends(require_read)], response_model=JobOut)
def get_job(job_id: JobId, db: StoreDep) -> dict[str, Any]:
    return db.get_job(job_id).to_json()


class LogLineOut(BaseModel):
    at: datetime.datetime
    line: str


@router.get("/{job_id}/log", dependencies=[Depends(require_read)], response_model=list[LogLineOut])
def job_log(job_id: JobId, db: StoreDep) -> list[dict[str, Any]]:
    """The job's output as its worker wrote it (its stderr and how each run ended), oldest first: the
    newest lines only (moetune.db.progress.JOB_LOG_LINES)."""
    return [{"at": at, "line": line} for at, line in db.job_log(job_id)]


@router.post("/{job_id}/cancel", dependencies=[Depends(require_token)], response_model=JobOut)
def cancel_job(job_id: JobId, db: StoreDep) -> dict[str, Any]:
    """Cancel a queued or running job (its worker stops it at its next heartbeat); 400 once it ended."""
    return db.cancel_job(job_id).to_json()
