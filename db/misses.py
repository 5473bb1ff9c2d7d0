"""Dispatch misses: lookups that found no winner, one counted row per (fingerprint, backend, problem)."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, contains_eager

from moetune.db import entities
from moetune.db.models import Device, Miss
from moetune.db.records import MissRow, utcnow
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem


def record_miss(
    session: Session,
    *,
    device: DeviceFingerprint,
    backend: str,
    problem: Problem,
    ids: entities.KnownIds | None = None,
) -> None:
    """count += 1, creating the row on the first miss; safe with many writers (update, else insert)."""
    ids = ids or entities.KnownIds()
    device_id = ids.device(session, device)
    problem_id = ids.problem(session, problem)
    now = utcnow()
    bump = (
        update(Miss)
        .where(Miss.device_id == device_id, Miss.backend == backend, Miss.problem_id == problem_id)
        .values(count=Miss.count + 1, last_seen=now)
    )
    if session.execute(bump).rowcount:
        return
    try:
        with session.begin_nested():
            session.add(
                Miss(
                    device_id=device_id,
                    backend=backend,
                    problem_id=problem_id,
                    count=1,
                    first_seen=now,
                    last_seen=now,
                )
            )
    except IntegrityError:  # another writer inserted it since our update
        session.execute(bump)


def misses(session: Session, *, device_kind: str | None = None, backend: str | None = None) -> list[MissRow]:
    """Matching misses, most counted first."""
    query = (
        select(Miss)
        .join(Miss.device)
        .join(Miss.problem)
        .options(contains_eager(Miss.device), contains_eager(Miss.problem))
    )
    if device_kind is not None:
        query = query.where(Device.device_kind == device_kind)
    if backend is not None:
        query = query.where(Miss.backend == backend)
    query = query.order_by(Miss.count.desc(), Miss.id)
    return [
        MissRow(
            device_kind=m.device.device_kind,
            fingerprint_hash=m.device.fingerprint_hash,
            backend=m.backend,
            problem=entities.problem_value(m.problem),
            count=m.count,
            first_seen=m.first_seen,
            last_seen=m.last_seen,
        )
        for m in session.scalars(query)
    ]
