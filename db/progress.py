"""Live progress in the database: what a sweep's driver last published, and each job's log lines.

A running sweep's driver writes its progress (a small JSON object: planned, done, failed, best so far,
ETA, lanes; moetune.tuner.progress_db) into its row every few seconds; the dashboard reads it back with
its age. A job's worker appends its output lines (moetune.tuner.job_log); only the newest JOB_LOG_LINES
of a job are kept, the older ones deleted as new ones come, so a job that runs for days holds a bounded
tail. Both are plain writes, never part of the sweep's or job's lease: a sweep whose lease was taken
over may publish once more, which the next publication of the new owner replaces.
"""

from __future__ import annotations

import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from moetune.db.errors import RecordNotFound
from moetune.db.leases import db_now
from moetune.db.models import Job, JobLog, Sweep

JOB_LOG_LINES = 500
LINE_LENGTH = 2000  # longer lines are cut (a traceback's frame, a Ray banner)


def publish(session: Session, sweep_id: int, progress: dict[str, Any]) -> None:
    session.execute(
        update(Sweep).where(Sweep.id == sweep_id).values(progress=progress, progress_at=db_now(session))
    )


def read(session: Session, sweep_id: int) -> tuple[dict[str, Any] | None, float | None]:
    """(the sweep's last published progress, its age in seconds); (None, None) before any."""
    row = session.execute(select(Sweep.progress, Sweep.progress_at).where(Sweep.id == sweep_id)).first()
    if row is None:
        raise RecordNotFound(f"no sweep {sweep_id}")
    progress, at = row
    if progress is None or at is None:
        return None, None
    return progress, max(0.0, (db_now(session) - at).total_seconds())


def append_lines(session: Session, job_id: int, lines: list[str], keep: int = JOB_LOG_LINES) -> None:
    if not lines:
        return
    now = db_now(session)
    session.add_all(JobLog(job_id=job_id, at=now, line=line[:LINE_LENGTH]) for line in lines[-keep:])
    session.flush()
    # The newest `keep` stay: every older line of this job goes (its ids are ascending).
    cutoff = session.scalar(
        select(JobLog.id).where(JobLog.job_id == job_id).order_by(JobLog.id.desc()).offset(keep).limit(1)
    )
    if cutoff is not None:
        session.execute(delete(JobLog).where(JobLog.job_id == job_id, JobLog.id <= cutoff))


def lines(session: Session, job_id: int, limit: int = JOB_LOG_LINES) -> list[tuple[datetime.datetime, str]]:
    """A job's newest `limit` log lines, oldest first; RecordNotFound for an unknown job."""
    if session.get(Job, job_id) is None:
        raise RecordNotFound(f"no job {job_id}")
    rows = session.execute(
        select(JobLog.at, JobLog.line).where(JobLog.job_id == job_id).order_by(JobLog.id.desc()).limit(limit)
    ).all()
    return [(at, line) for at, line in reversed(rows)]
