"""Find-or-create for devices, kernels and problems, and their conversion back to plain values.

Many writers may create the same row at once: each insert runs in a savepoint, and a unique-constraint
clash means another writer got there first, so its row is read instead. This works on every dialect.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from moetune.db.errors import RecordNotFound
from moetune.db.models import Base, Device, Kernel, ProblemRow
from moetune.db.records import utcnow
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem


def _get_or_create(
    session: Session, model: type[Base], lookup: dict[str, Any], values: dict[str, Any]
) -> int:
    query = select(model.id).filter_by(**lookup)  # type: ignore[attr-defined]
    found = session.scalar(query)
    if found is not None:
        return found
    row = model(**lookup, **values)
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        found = session.scalar(query)
        if found is None:
            raise
        return found
    return row.id  # type: ignore[attr-defined]


def ensure_device(session: Session, fp: DeviceFingerprint) -> int:
    return _get_or_create(
        session, Device, {"fingerprint_hash": fp.hash}, {**fp.to_dict(), "created_at": utcnow()}
    )


def ensure_kernel(session: Session, backend: str, family: str, source_hash: str) -> int:
    lookup = {"backend": backend, "family": family, "source_hash": source_hash}
    return _get_or_create(session, Kernel, lookup, {"created_at": utcnow()})


def ensure_problem(session: Session, problem: Problem) -> int:
    values = {
        "shape_key": problem.shape_key,
        "op": problem.op,
        "m": problem.m,
        "k": problem.k,
        "n": problem.n,
        "g": problem.g,
        "lhs_dtype": problem.lhs_dtype,
        "rhs_dtype": problem.rhs_dtype,
        "out_dtype": problem.out_dtype,
        "transpose_rhs": problem.transpose_rhs,
    }
    return _get_or_create(session, ProblemRow, {"key": problem.key}, values)


class KnownIds:
    """Ids of device, kernel and problem rows this process has seen committed: a trial then costs one
    INSERT instead of three lookups more, which shortens every writer's hold on the SQLite lock.

    Safe because moetune never deletes or changes these rows; only `moetune db downgrade` drops them,
    and Store.downgrade clears this cache (downgrading while other processes write is not supported).
    Ids found inside a transaction wait in session.info until it commits, so a rolled-back insert
    never leaves a dangling id here.
    """

    _PENDING = "moetune_pending_ids"

    def __init__(self) -> None:
        self._ids: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()

    def _get(self, session: Session, key: tuple[str, ...], ensure: Callable[[], int]) -> int:
        found = self._ids.get(key)
        if found is None:
            found = ensure()
            session.info.setdefault(self._PENDING, {})[key] = found
        return found

    def device(self, session: Session, fp: DeviceFingerprint) -> int:
        return self._get(session, ("device", fp.hash), lambda: ensure_device(session, fp))

    def kernel(self, session: Session, backend: str, family: str, source_hash: str) -> int:
        key = ("kernel", backend, family, source_hash)
        return self._get(session, key, lambda: ensure_kernel(session, backend, family, source_hash))

    def problem(self, session: Session, problem: Problem) -> int:
        return self._get(session, ("problem", problem.key), lambda: ensure_problem(session, problem))

    def committed(self, session: Session) -> None:
        """Called once the session's transaction has committed."""
        pending = session.info.pop(self._PENDING, None)
        if pending:
            with self._lock:
                self._ids.update(pending)

    def clear(self) -> None:
        with self._lock:
            self._ids.clear()


def problem_id(session: Session, key: str) -> int:
    found = session.scalar(select(ProblemRow.id).where(ProblemRow.key == key))
    if found is None:
        raise RecordNotFound(f"no problem with key {key!r} in the database")
    return found


def device_ids(session: Session, *, fingerprint_hash: str | None, device_kind: str | None) -> list[int]:
    query = select(Device.id)
    if fingerprint_hash is not None:
        query = query.where(Device.fingerprint_hash == fingerprint_hash)
    if device_kind is not None:
        query = query.where(Device.device_kind == device_kind)
    return list(session.scalars(query))


def known(session: Session, column: Any) -> list[str]:
    """Distinct values of a column, sorted: what an error lists when a filter value matches nothing."""
    return sorted(session.scalars(select(column).distinct()))


def exists(session: Session, column: Any, value: Any) -> bool:
    return session.scalar(select(column).where(column == value).limit(1)) is not None


def device_of(session: Session, fingerprint_hash: str) -> DeviceFingerprint | None:
    row = session.scalar(select(Device).where(Device.fingerprint_hash == fingerprint_hash))
    return None if row is None else device_value(row)


def device_value(row: Device) -> DeviceFingerprint:
    return DeviceFingerprint(
        device_kind=row.device_kind,
        platform=row.platform,
        core_count=row.core_count,
        memory_bytes=row.memory_bytes,
        compute_capability=row.compute_capability,
        driver=row.driver,
        runtime=row.runtime,
        jax_version=row.jax_version,
        jaxlib_version=row.jaxlib_version,
    )


def problem_value(row: ProblemRow) -> Problem:
    return Problem(
        op=row.op,
        m=row.m,
        k=row.k,
        n=row.n,
        g=row.g,
        lhs_dtype=row.lhs_dtype,
        rhs_dtype=row.rhs_dtype,
        out_dtype=row.out_dtype,
        transpose_rhs=row.transpose_rhs,
        # No columns of their own: the key has them (written only for the problems that have them).
        scale_layout=Problem.scale_layout_of_key(row.key),
        top_k=Problem.top_k_of_key(row.key),
    )
