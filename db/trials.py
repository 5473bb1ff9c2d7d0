"""Sweeps and trials: recording them and reading them back as plain rows."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session, contains_eager

from moetune.db import entities
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
) -> int:
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
    session.add(sweep)
    session.flush()
    return sweep.id


def _sweep(session: Session, sweep_id: int) -> Sweep:
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise RecordNotFound(f"no sweep with id {sweep_id}")
    return sweep


def finish_sweep(session: Session, sweep_id: int, status: str) -> None:
    check_choice("sweep status", status, SWEEP_STATUSES)
    sweep = _sweep(session, sweep_id)
    sweep.status = status
    sweep.finished_at = None if status == "running" else utcnow()


def get_sweep(session: Session, sweep_id: int) -> SweepRow:
    s = _sweep(session, sweep_id)
    return SweepRow(
        s.id,
        s.backend,
        s.strategy,
        dict(s.spec),
        s.status,
        s.host,
        s.user,
        s.created_at,
        s.finished_at,
        s.sweep_file,
    )


def record_trial(session: Session, rec: TrialRecord, ids: entities.KnownIds | None = None) -> int:
    ids = ids or entities.KnownIds()
    trial = Trial(
        sweep_id=rec.sweep_id,
        device_id=ids.device(session, rec.device),
        kernel_id=ids.kernel(session, rec.backend, rec.family, rec.source_hash),
        problem_id=ids.problem(session, rec.problem),
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
) -> list[TrialRow]:
    """Matching trials, newest first."""
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
