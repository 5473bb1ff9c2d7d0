"""Dispatch misses: lookups that found no winner, one counted row per (fingerprint, backend, problem)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
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
    times: int = 1,
) -> None:
    """count += times, creating the row on the first miss, in one statement (INSERT .. ON CONFLICT DO
    UPDATE): atomic with any number of writers on SQLite and PostgreSQL, with no lost increment and no
    unique-constraint clash for the caller to retry."""
    ids = ids or entities.KnownIds()
    device_id = ids.device(session, device)
    problem_id = ids.problem(session, problem)
    now = utcnow()
    insert = _dialect_insert(session.get_bind().dialect.name)
    row = insert(Miss).values(
        device_id=device_id,
        backend=backend,
        problem_id=problem_id,
        count=times,
        first_seen=now,
        last_seen=now,
    )
    session.execute(
        row.on_conflict_do_update(
            index_elements=[Miss.device_id, Miss.backend, Miss.problem_id],
            set_={"count": Miss.count + row.excluded.count, "last_seen": row.excluded.last_seen},
        )
    )


def record_misses(
    session: Session, counted: Mapping[tuple[DeviceFingerprint, str, Problem], int], ids: entities.KnownIds
) -> None:
    """record_miss for each (device, backend, problem) -> times, in a fixed order, so that two batches
    holding the same keys lock their rows in the same order (PostgreSQL would otherwise deadlock them)."""
    for (device, backend, problem), times in sorted(
        counted.items(), key=lambda item: (item[0][0].hash, item[0][1], item[0][2].key)
    ):
        record_miss(session, device=device, backend=backend, problem=problem, ids=ids, times=times)


def _dialect_insert(dialect: str) -> Any:
    """The INSERT with ON CONFLICT of the two databases moetune runs on."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert


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
