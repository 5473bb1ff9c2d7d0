"""Winners with history: promotion supersedes the active winner, rollback restores the one before it.

No winner row is ever deleted. Per (device fingerprint, backend, problem) at most one row is active
(a partial unique index); the others are `superseded` (replaced by a later promotion, may be restored)
or `rolled_back` (withdrawn by a rollback, never restored by a later one).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session, contains_eager

from moetune.db import entities
from moetune.db.errors import InvalidRecord, RecordNotFound
from moetune.db.models import Device, ProblemRow, Trial, Winner
from moetune.db.records import WinnerRow, check_json, utcnow
from moetune.db.trials import joined_trials


def joined_winners() -> Select[tuple[Winner]]:
    trial = contains_eager(Winner.trial)
    return (
        select(Winner)
        .join(Winner.trial)
        .join(Trial.device)
        .join(Trial.kernel)
        .join(Trial.problem)
        .options(
            trial.contains_eager(Trial.device),
            trial.contains_eager(Trial.kernel),
            trial.contains_eager(Trial.problem),
        )
    )


def promote(session: Session, trial_id: int, reason: str, decision: dict[str, Any] | None = None) -> int:
    """Make the trial the active winner of its key, with `reason` (one line) and `decision` (how it was
    decided, plain JSON data)."""
    check_json("decision", decision)
    trial = session.scalar(joined_trials().where(Trial.id == trial_id))
    if trial is None:
        raise RecordNotFound(f"no trial with id {trial_id}")
    if trial.status != "ok":
        raise InvalidRecord(f"trial {trial_id} has status={trial.status}; only ok trials can be promoted")
    backend = trial.kernel.backend
    key = (
        Winner.device_id == trial.device_id,
        Winner.backend == backend,
        Winner.problem_id == trial.problem_id,
    )
    current = session.scalar(select(Winner).where(*key, Winner.state == "active").with_for_update())
    if current is not None and current.trial_id == trial_id:
        return current.id
    now = utcnow()
    if current is not None:
        current.state = "superseded"
        current.retired_at = now
        session.flush()  # before the insert: the partial unique index allows one active row
    winner = Winner(
        trial_id=trial_id,
        device_id=trial.device_id,
        backend=backend,
        problem_id=trial.problem_id,
        state="active",
        reason=reason,
        decision=decision,
        promoted_at=now,
        retired_at=None,
    )
    session.add(winner)
    session.flush()
    return winner.id


def current_winner(
    session: Session, *, fingerprint_hash: str, backend: str, problem_key: str
) -> WinnerRow | None:
    query = joined_winners().where(
        Device.fingerprint_hash == fingerprint_hash,
        Winner.backend == backend,
        ProblemRow.key == problem_key,
        Winner.state == "active",
    )
    found = session.scalar(query)
    return None if found is None else winner_row(found)


def winners(
    session: Session,
    *,
    device_kind: str | None = None,
    fingerprint_hash: str | None = None,
    backend: str | None = None,
    problem_key: str | None = None,
    shape_key: str | None = None,
    m: int | None = None,
    k: int | None = None,
    n: int | None = None,
    g: int | None = None,
    active_only: bool = True,
) -> list[WinnerRow]:
    """Matching winners ordered by device, backend, shape and m; history after the active row."""
    query = joined_winners()
    for column, value in (
        (Device.device_kind, device_kind),
        (Device.fingerprint_hash, fingerprint_hash),
        (Winner.backend, backend),
        (ProblemRow.key, problem_key),
        (ProblemRow.shape_key, shape_key),
        (ProblemRow.m, m),
        (ProblemRow.k, k),
        (ProblemRow.n, n),
        (ProblemRow.g, g),
    ):
        if value is not None:
            query = query.where(column == value)
    if active_only:
        query = query.where(Winner.state == "active")
    query = query.order_by(
        Device.device_kind,
        Device.fingerprint_hash,
        Winner.backend,
        ProblemRow.shape_key,
        ProblemRow.m,
        Winner.id.desc(),
    )
    return [winner_row(w) for w in session.scalars(query)]


def rollback(
    session: Session,
    *,
    backend: str,
    problem_key: str,
    fingerprint_hash: str | None = None,
    device_kind: str | None = None,
) -> WinnerRow:
    """Withdraw the active winner and restore the latest one it superseded; returns the restored one."""
    if (fingerprint_hash is None) == (device_kind is None):
        raise InvalidRecord("rollback needs exactly one of fingerprint_hash or device_kind")
    problem_id = entities.problem_id(session, problem_key)
    devices = entities.device_ids(session, fingerprint_hash=fingerprint_hash, device_kind=device_kind)
    where = f"backend={backend} problem={problem_key} " + (
        f"fingerprint={fingerprint_hash}" if fingerprint_hash else f"gpu={device_kind!r}"
    )
    active = list(
        session.scalars(
            select(Winner)
            .where(Winner.device_id.in_(devices), Winner.backend == backend, Winner.problem_id == problem_id)
            .where(Winner.state == "active")
            .with_for_update()
        )
    )
    if not active:
        raise InvalidRecord(f"no active winner for {where}")
    if len(active) > 1:
        hashes = session.scalars(
            select(Device.fingerprint_hash).where(Device.id.in_(w.device_id for w in active))
        )
        raise InvalidRecord(
            f"{len(active)} device fingerprints have a winner for {where}; "
            f"pick one with --fingerprint ({', '.join(sorted(hashes))})"
        )
    (current,) = active
    previous = session.scalar(
        select(Winner)
        .where(
            Winner.device_id == current.device_id, Winner.backend == backend, Winner.problem_id == problem_id
        )
        .where(Winner.state == "superseded", Winner.id < current.id)
        .order_by(Winner.id.desc())
        .limit(1)
        .with_for_update()
    )
    if previous is None:
        raise InvalidRecord(f"nothing to roll back to: winner {current.id} is the first for {where}")
    now = utcnow()
    current.state = "rolled_back"
    current.retired_at = now
    session.flush()  # before reactivating: the partial unique index allows one active row
    previous.state = "active"
    previous.retired_at = None
    session.flush()
    return winner_row(session.scalars(joined_winners().where(Winner.id == previous.id)).one())


def winner_row(w: Winner) -> WinnerRow:
    trial = w.trial
    return WinnerRow(
        id=w.id,
        trial_id=w.trial_id,
        device_kind=trial.device.device_kind,
        fingerprint_hash=trial.device.fingerprint_hash,
        device=entities.device_value(trial.device),
        backend=w.backend,
        source_hash=trial.kernel.source_hash,
        problem=entities.problem_value(trial.problem),
        config=dict(trial.config),
        median_s=trial.median_s,
        promoted_at=w.promoted_at,
        active=w.state == "active",
        reason=w.reason,
        state=w.state,
        retired_at=w.retired_at,
        decision=w.decision,
        sweep_id=trial.sweep_id,
    )
