"""Sweeps and trials: recording them and reading them back as plain rows."""

from __future__ import annotations

import datetime
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session, contains_eager

from moetune.db import entities, leases
from moetune.db.errors import RecordNotFound
from moetune.db.models import Device, Kernel, ProblemRow, Sweep, Trial
from moetune.db.records import (
    SWEEP_STATUSES,
    TRIAL_STATUSES,
    SweepRow,
    TrialRecord,
    TrialRow,
    canonical_config,
    check_choice,
    utcnow,
)
from moetune.db.transaction import MAY_HAVE_COMMITTED
from moetune.kernels.device import DeviceFingerprint


def create_sweep(
    session: Session,
    *,
    backend: str,
    strategy: str,
    spec: dict[str, Any],
    host: str,
    user: str,
    sweep_file: str | None,
    status: str = "running",
    owner: leases.Owner | None = None,
    device: DeviceFingerprint | None = None,
    force: bool = False,
    ids: entities.KnownIds | None = None,
) -> int:
    """A new sweep; with `owner`, its lease is taken; with `device` (a timing sweep's), the device is
    claimed, refused (DeviceBusy) while another live sweep times on it unless `force`."""
    check_choice("sweep status", status, SWEEP_STATUSES)
    sweep = Sweep(
        backend=backend,
        strategy=strategy,
        status=status,
        spec=spec,
        host=host,
        user=user,
        sweep_file=sweep_file,
        created_at=utcnow(),
        finished_at=None if status == "running" else utcnow(),
    )
    if device is not None or owner is not None:
        now = leases.db_now(session)
        if device is not None:
            sweep.device_id = (ids or entities.KnownIds()).device(session, device)
            leases.check_device_free(session, sweep.device_id, now, force)
        if owner is not None:
            leases.take(sweep, owner, now)
    session.add(sweep)
    session.flush()
    return sweep.id


def finish_sweep(session: Session, sweep_id: int, status: str, owner: leases.Owner | None = None) -> None:
    """Set the final status; with `owner`, only while it still holds the lease (else LeaseLost)."""
    check_choice("sweep status", status, SWEEP_STATUSES)
    sweep = leases.finish(session, sweep_id, owner)
    sweep.status = status
    sweep.finished_at = None if status == "running" else utcnow()


def _sweep_rows(session: Session, query: Select) -> list[SweepRow]:
    counts = select(Trial.sweep_id, func.count().label("trials")).group_by(Trial.sweep_id).subquery()
    query = query.add_columns(Device.device_kind, counts.c.trials)
    query = query.outerjoin(Device, Sweep.device_id == Device.id).outerjoin(
        counts, counts.c.sweep_id == Sweep.id
    )
    now = leases.db_now(session)
    return [_sweep_row(s, now, kind, count or 0) for s, kind, count in session.execute(query)]


def get_sweep(session: Session, sweep_id: int) -> SweepRow:
    rows = _sweep_rows(session, select(Sweep).where(Sweep.id == sweep_id))
    if not rows:
        raise RecordNotFound(f"no sweep with id {sweep_id}")
    return rows[0]


def sweeps(session: Session, *, limit: int | None = None) -> list[SweepRow]:
    """Sweeps, newest first."""
    return _sweep_rows(session, select(Sweep).order_by(Sweep.id.desc()).limit(limit))


def _sweep_row(s: Sweep, now: datetime.datetime, device_kind: str | None, trials: int) -> SweepRow:
    spec = dict(s.spec)
    if device_kind is None and isinstance(spec.get("device"), dict):
        # No device claimed (compile-only: the target's stand-in; or recorded before leases).
        device_kind = spec["device"].get("device_kind")
    problems = spec.get("problems")
    age = leases.age_s(s, now)
    return SweepRow(
        id=s.id,
        backend=s.backend,
        strategy=s.strategy,
        spec=spec,
        status=leases.shown_status(s.status, s.owner_host, s.owner_pid, age),
        host=s.host,
        user=s.user,
        created_at=s.created_at,
        finished_at=s.finished_at,
        sweep_file=s.sweep_file,
        stored_status=s.status,
        owner=None if s.owner_host is None else f"{s.owner_host}:{s.owner_pid}",
        heartbeat_age_s=age,
        device_kind=device_kind,
        problems=len(problems) if isinstance(problems, list) else 0,
        trials=trials,
    )


def record_trial(
    session: Session,
    rec: TrialRecord,
    ids: entities.KnownIds | None = None,
    owner: leases.Owner | None = None,
) -> int:
    if owner is not None and rec.sweep_id is not None:
        leases.held(session, rec.sweep_id, owner)
    ids = ids or entities.KnownIds()
    device_id = ids.device(session, rec.device)
    kernel_id = ids.kernel(session, rec.backend, rec.family, rec.source_hash)
    problem_id = ids.problem(session, rec.problem)
    if session.info.get(MAY_HAVE_COMMITTED):  # the last attempt's commit lost its connection: did it land?
        same = select(Trial).where(
            *(
                column.is_(None) if value is None else column == value
                for column, value in (
                    (Trial.sweep_id, rec.sweep_id),
                    (Trial.device_id, device_id),
                    (Trial.kernel_id, kernel_id),
                    (Trial.problem_id, problem_id),
                    (Trial.status, rec.status),
                    (Trial.host, rec.host),
                    (Trial.worker, rec.worker),
                    (Trial.started_at, rec.started_at),
                    (Trial.finished_at, rec.finished_at),
                )
            )
        )
        for found in session.scalars(same):
            if found.config == rec.config:
                return found.id
    trial = Trial(
        sweep_id=rec.sweep_id,
        device_id=device_id,
        kernel_id=kernel_id,
        problem_id=problem_id,
        config=rec.config,
        status=rec.status,
        samples_s=list(rec.samples_s),
        median_s=rec.median_s,
        compile_s=rec.compile_s,
        verify_error=rec.verify_error,
        error=rec.error,
        host=rec.host,
        worker=rec.worker,
        routing=rec.routing,
        details=rec.details,
        started_at=rec.started_at,
        finished_at=rec.finished_at,
        created_at=utcnow(),
    )
    session.add(trial)
    session.flush()
    return trial.id


def joined_trials() -> Select[tuple[Trial]]:
    """Trials with their device, kernel and problem loaded by the same query (filterable by them)."""
    return (
        select(Trial)
        .join(Trial.device)
        .join(Trial.kernel)
        .join(Trial.problem)
        .options(contains_eager(Trial.device), contains_eager(Trial.kernel), contains_eager(Trial.problem))
    )


def trials(
    session: Session,
    *,
    sweep_id: int | None = None,
    backend: str | None = None,
    status: str | None = None,
    device_kind: str | None = None,
    problem_key: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> list[TrialRow]:
    """Matching trials, newest first; `offset` skips that many of the newest (pages)."""
    query = joined_trials()
    if sweep_id is not None:
        query = query.where(Trial.sweep_id == sweep_id)
    if backend is not None:
        query = query.where(Kernel.backend == backend)
    if status is not None:
        query = query.where(Trial.status == check_choice("status", status, TRIAL_STATUSES))
    if device_kind is not None:
        query = query.where(Device.device_kind == device_kind)
    if problem_key is not None:
        query = query.where(ProblemRow.key == problem_key)
    query = query.order_by(Trial.id.desc())
    if limit is not None:
        query = query.limit(limit)
    if offset:
        query = query.offset(offset)
    return [trial_row(t) for t in session.scalars(query)]


def done_configs(
    session: Session, *, fingerprint_hash: str, backend: str, source_hash: str, problem_key: str
) -> dict[str, TrialRow]:
    """Recorded trials of one (device, kernel source, problem) keyed by canonical config JSON.

    Every recorded trial has ended (a trial is written once, when it ends). If a config was recorded
    more than once, the latest trial is the one returned.
    """
    query = (
        joined_trials()
        .where(Device.fingerprint_hash == fingerprint_hash)
        .where(Kernel.backend == backend, Kernel.source_hash == source_hash)
        .where(ProblemRow.key == problem_key)
        .order_by(Trial.id)
    )
    return {canonical_config(t.config): trial_row(t) for t in session.scalars(query)}


def trial_row(t: Trial) -> TrialRow:
    return TrialRow(
        id=t.id,
        sweep_id=t.sweep_id,
        device_kind=t.device.device_kind,
        fingerprint_hash=t.device.fingerprint_hash,
        backend=t.kernel.backend,
        source_hash=t.kernel.source_hash,
        problem=entities.problem_value(t.problem),
        config=dict(t.config),
        status=t.status,
        samples_s=tuple(t.samples_s),
        median_s=t.median_s,
        compile_s=t.compile_s,
        verify_error=t.verify_error,
        error=t.error,
        host=t.host,
        worker=t.worker,
        routing=None if t.routing is None else dict(t.routing),
        started_at=t.started_at,
        finished_at=t.finished_at,
        family=t.kernel.family,
        details=None if t.details is None else dict(t.details),
    )
