"""The tuning queue: jobs that wait in the database for a worker (`moetune worker`) to run them as sweeps.

A job moves queued -> running (claimed by one worker) -> done | failed | cancelled. Claiming is atomic: on
PostgreSQL `SELECT ... FOR UPDATE SKIP LOCKED` (two workers never take one job, and neither waits for the
other); on SQLite the store's write transactions are BEGIN IMMEDIATE, which serialises writers.

A running job carries a lease like a sweep's (moetune.db.leases): its worker is (host, pid, random
token) and moves `heartbeat_at` every `heartbeat_s()`. A job whose heartbeat is older than `grace_s()`,
or whose worker ran on this host and is gone, is stale: `requeue_stale` puts it back in the queue, keeping
`sweep_id`, so the next worker resumes that sweep (no finished trial repeated, none lost). A worker whose
job was requeued or cancelled finds its token gone at its next heartbeat and stops.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from moetune.db import leases
from moetune.db.errors import InvalidRecord, RecordNotFound
from moetune.db.leases import Owner, db_now
from moetune.db.models import Job
from moetune.db.records import check_json

QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
JOB_STATES = (QUEUED, RUNNING, DONE, FAILED, CANCELLED)
ENDED = (DONE, FAILED, CANCELLED)
# A job whose worker died this many times is failed rather than requeued: it may be what kills them.
MAX_ATTEMPTS = 5
# The lease timing of sweeps unless set (tests shorten it to seconds).
GRACE_ENV = "MOETUNE_JOB_GRACE_S"
HEARTBEAT_ENV = "MOETUNE_JOB_HEARTBEAT_S"


def _seconds(env: str, default: float) -> float:
    text = os.environ.get(env)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InvalidRecord(f"${env}={text!r} is not a number of seconds") from None
    if not value > 0:
        raise InvalidRecord(f"${env}={text!r} must be positive")
    return value


def grace_s() -> float:
    """Seconds without a heartbeat after which a running job is stale."""
    return _seconds(GRACE_ENV, leases.GRACE_S)


def heartbeat_s() -> float:
    """Seconds between a worker's heartbeats."""
    return _seconds(HEARTBEAT_ENV, leases.HEARTBEAT_S)


@dataclasses.dataclass(frozen=True)
class JobRow:
    """A job as read. `stale`: running, but its worker has stopped proving it is alive."""

    id: int
    state: str
    spec: dict[str, Any]
    sweep_file: str | None
    device_kind: str | None
    priority: int
    submitted_by: str
    created_at: datetime.datetime
    claimed_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    owner: str | None  # "host:pid" of the worker that runs it, or ran it last
    heartbeat_age_s: float | None
    sweep_id: int | None
    attempts: int
    error: str | None
    stale: bool

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _stale(job: Job, now: datetime.datetime) -> bool:
    if job.state != RUNNING:
        return False
    age = leases.age_s(job, now)
    return age is None or age > grace_s() or leases.is_stale(job.owner_host, job.owner_pid, age)


def _row(job: Job, now: datetime.datetime) -> JobRow:
    return JobRow(
        id=job.id,
        state=job.state,
        spec=dict(job.spec),
        sweep_file=job.sweep_file,
        device_kind=job.device_kind,
        priority=job.priority,
        submitted_by=job.submitted_by,
        created_at=job.created_at,
        claimed_at=job.claimed_at,
        finished_at=job.finished_at,
        owner=None if job.owner_host is None else f"{job.owner_host}:{job.owner_pid}",
        heartbeat_age_s=leases.age_s(job, now),
        sweep_id=job.sweep_id,
        attempts=job.attempts,
        error=job.error,
        stale=_stale(job, now),
    )


def submit(
    session: Session,
    *,
    spec: dict[str, Any],
    sweep_file: str | None,
    device_kind: str | None,
    priority: int,
    submitted_by: str,
) -> int:
    check_json("spec", spec)
    job = Job(
        state=QUEUED,
        spec=spec,
        sweep_file=sweep_file,
        device_kind=device_kind,
        priority=priority,
        submitted_by=submitted_by,
        created_at=db_now(session),
        attempts=0,
    )
    session.add(job)
    session.flush()
    return job.id


def claim_next(session: Session, owner: Owner, device_kind: str | None) -> JobRow | None:
    """The best queued job (highest priority, then oldest) that fits `device_kind`, now running under
    `owner`; None when there is none. A job for a device kind goes only to a worker on that kind; a job
    for none goes to any worker."""
    fits = Job.device_kind.is_(None)
    if device_kind is not None:
        fits = or_(fits, Job.device_kind == device_kind)
    query = (
        select(Job)
        .where(Job.state == QUEUED, fits)
        .order_by(Job.priority.desc(), Job.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    job = session.scalar(query)
    if job is None:
        return None
    now = db_now(session)
    job.state, job.claimed_at, job.heartbeat_at, job.finished_at = RUNNING, now, now, None
    job.owner_host, job.owner_pid, job.owner_token = owner.host, owner.pid, owner.token
    job.attempts += 1
    return _row(job, now)


def _owned(job_id: int, owner: Owner):
    return update(Job).where(Job.id == job_id, Job.owner_token == owner.token, Job.state == RUNNING)


def heartbeat(session: Session, job_id: int, owner: Owner) -> bool:
    """Move the heartbeat; False when the job is no longer `owner`'s to run (requeued or cancelled)."""
    return session.execute(_owned(job_id, owner).values(heartbeat_at=db_now(session))).rowcount == 1


def set_sweep(session: Session, job_id: int, owner: Owner, sweep_id: int) -> bool:
    """Record the sweep the job's run created, so that a later run resumes it."""
    return session.execute(_owned(job_id, owner).values(sweep_id=sweep_id)).rowcount == 1


def finish(session: Session, job_id: int, owner: Owner, state: str, error: str | None = None) -> bool:
    """End `owner`'s job with `state` (done or failed); False when it was not `owner`'s any more."""
    if state not in (DONE, FAILED):
        raise InvalidRecord(f"a job finishes done or failed, not {state!r}")
    values = dict(state=state, error=error, heartbeat_at=None, finished_at=db_now(session))
    return session.execute(_owned(job_id, owner).values(**values)).rowcount == 1


def release(session: Session, job_id: int, owner: Owner) -> bool:
    """Put `owner`'s job back in the queue (its worker stops before the job ended): the next worker resumes
    its sweep without waiting out the grace period."""
    values = dict(state=QUEUED, heartbeat_at=None, owner_token=None)
    return session.execute(_owned(job_id, owner).values(**values)).rowcount == 1


def cancel(session: Session, job_id: int) -> JobRow:
    """Cancel a queued or running job (its worker stops at its next heartbeat); InvalidRecord once ended."""
    job = session.scalar(select(Job).where(Job.id == job_id).with_for_update())
    if job is None:
        raise RecordNotFound(f"no job with id {job_id}")
    if job.state in ENDED:
        raise InvalidRecord(f"job {job_id} has ended already ({job.state})")
    now = db_now(session)
    job.state, job.finished_at, job.heartbeat_at = CANCELLED, now, None
    return _row(job, now)


def requeue_stale(session: Session) -> list[int]:
    """Put every stale running job back in the queue (or fail it after MAX_ATTEMPTS); the ids requeued.
    Rows another transaction holds are skipped: that one is claiming or finishing them."""
    running = select(Job).where(Job.state == RUNNING).with_for_update(skip_locked=True)
    now = db_now(session)
    requeued = []
    for job in session.scalars(running):
        if not _stale(job, now):
            continue
        job.heartbeat_at, job.owner_token = None, None
        if job.attempts >= MAX_ATTEMPTS:
            job.state, job.finished_at = FAILED, now
            job.error = f"its worker stopped without finishing it {job.attempts} times"
            continue
        job.state = QUEUED
        requeued.append(job.id)
    return requeued


def get_job(session: Session, job_id: int) -> JobRow:
    job = session.get(Job, job_id)
    if job is None:
        raise RecordNotFound(f"no job with id {job_id}")
    return _row(job, db_now(session))


def jobs(session: Session, *, states: tuple[str, ...] = (), limit: int | None = None) -> list[JobRow]:
    """Matching jobs, newest first."""
    for state in states:
        if state not in JOB_STATES:
            raise InvalidRecord(f"state={state!r} is not one of {', '.join(JOB_STATES)}")
    query = select(Job).order_by(Job.id.desc()).limit(limit)
    if states:
        query = query.where(Job.state.in_(states))
    now = db_now(session)
    return [_row(job, now) for job in session.scalars(query)]
