"""Today's tables as SQLAlchemy 2 typed ORM models.

The migrations in db/migrations/versions/ declare their own copies of the tables they touch and never
import this module, so an old migration keeps working after the models change; a test checks that the
migrated schema and these models agree.

Deliberate omissions: statuses and winner states are checked in Python (moetune.db.records), not with
CHECK constraints, so a new status needs no table rebuild on SQLite. Times are naive UTC (records.py).
"""

from __future__ import annotations

import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from moetune.db.records import utcnow

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, list[float]: JSON, datetime.datetime: DateTime()}


class Device(Base):
    """A device fingerprint (moetune.kernels.device.DeviceFingerprint), unique by its hash."""

    __tablename__ = "devices"

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint_hash: Mapped[str] = mapped_column(String(64), unique=True)
    device_kind: Mapped[str] = mapped_column(String(128), index=True)
    platform: Mapped[str] = mapped_column(String(32))
    core_count: Mapped[int]
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    compute_capability: Mapped[str] = mapped_column(String(32))
    driver: Mapped[str] = mapped_column(String(64))
    runtime: Mapped[str] = mapped_column(String(64))
    jax_version: Mapped[str] = mapped_column(String(32))
    jaxlib_version: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime.datetime] = mapped_column(default=utcnow)


class Kernel(Base):
    """One version of one backend's kernel family: a source change gives a new row."""

    __tablename__ = "kernels"
    __table_args__ = (UniqueConstraint("backend", "family", "source_hash"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    backend: Mapped[str] = mapped_column(String(64), index=True)
    family: Mapped[str] = mapped_column(String(64))
    source_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime.datetime] = mapped_column(default=utcnow)


class ProblemRow(Base):
    """A moetune.kernels.problem.Problem; `key` is its full key, `shape_key` the key without m."""

    __tablename__ = "problems"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(255), unique=True)
    shape_key: Mapped[str] = mapped_column(String(255), index=True)
    op: Mapped[str] = mapped_column(String(64))
    m: Mapped[int]
    k: Mapped[int]
    n: Mapped[int]
    g: Mapped[int]
    lhs_dtype: Mapped[str] = mapped_column(String(16))
    rhs_dtype: Mapped[str] = mapped_column(String(16))
    out_dtype: Mapped[str] = mapped_column(String(16))
    transpose_rhs: Mapped[bool]


class Sweep(Base):
    """One `moetune tune` run, and its lease (moetune.db.leases): the process that runs it now proves it
    is alive by moving `heartbeat_at`; `device_id` is the device it times on (None: compile-only)."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(primary_key=True)
    backend: Mapped[str] = mapped_column(String(64))
    strategy: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))  # records.SWEEP_STATUSES
    spec: Mapped[dict[str, Any]]
    host: Mapped[str] = mapped_column(String(255))
    # "user" is a reserved word in PostgreSQL.
    user: Mapped[str] = mapped_column("username", String(255))
    sweep_file: Mapped[str | None] = mapped_column(String(1024))
    created_at: Mapped[datetime.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime.datetime | None]
    owner_host: Mapped[str | None] = mapped_column(String(255))
    owner_pid: Mapped[int | None]
    owner_token: Mapped[str | None] = mapped_column(String(32))
    heartbeat_at: Mapped[datetime.datetime | None]
    device_id: Mapped[int | None] = mapped_column(ForeignKey("devices.id"), index=True)
    # What its driver last published (moetune.db.progress), and when (the database's clock).
    progress: Mapped[dict[str, Any] | None]
    progress_at: Mapped[datetime.datetime | None]


class Trial(Base):
    """Every timed (or failed) candidate, not only winners."""

    __tablename__ = "trials"
    # done_configs() and the trial listing look trials up by device, kernel and problem together.
    __table_args__ = (Index(None, "device_id", "kernel_id", "problem_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id"), index=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    config: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16), index=True)  # records.TRIAL_STATUSES
    samples_s: Mapped[list[float]]
    median_s: Mapped[float | None] = mapped_column(Float)
    compile_s: Mapped[float | None] = mapped_column(Float)
    verify_error: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(String(255))
    worker: Mapped[str] = mapped_column(String(255))
    routing: Mapped[dict[str, Any] | None]
    # What the trial found besides its times, e.g. a compile-only binary's hash and static metrics.
    details: Mapped[dict[str, Any] | None]
    started_at: Mapped[datetime.datetime | None]
    finished_at: Mapped[datetime.datetime | None]
    created_at: Mapped[datetime.datetime] = mapped_column(default=utcnow)

    # lazy="raise": queries load what they need in one statement (contains_eager), never row by row.
    device: Mapped[Device] = relationship(lazy="raise")
    kernel: Mapped[Kernel] = relationship(lazy="raise")
    problem: Mapped[ProblemRow] = relationship(lazy="raise")


class Winner(Base):
    """A promoted trial per (device fingerprint, backend, problem), with its whole history.

    `backend` repeats the trial's kernel backend so that one partial unique index can guarantee at most
    one active winner per key (SQLite and PostgreSQL both support partial indexes).
    """

    __tablename__ = "winners"
    __table_args__ = (
        Index(None, "device_id", "backend", "problem_id"),
        Index(
            "uq_winners_active",
            "device_id",
            "backend",
            "problem_id",
            unique=True,
            sqlite_where=text("state = 'active'"),
            postgresql_where=text("state = 'active'"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    backend: Mapped[str] = mapped_column(String(64))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    state: Mapped[str] = mapped_column(String(16))  # records.WINNER_STATES
    reason: Mapped[str] = mapped_column(Text)
    # How the promotion was decided (tuner/decided.py writes and reads it); NULL for winners promoted
    # before the column existed and for imported ones.
    decision: Mapped[dict[str, Any] | None]
    promoted_at: Mapped[datetime.datetime] = mapped_column(default=utcnow)
    retired_at: Mapped[datetime.datetime | None]

    trial: Mapped[Trial] = relationship(lazy="raise")


class Miss(Base):
    """A dispatch lookup that found no winner, counted per (fingerprint, backend, problem)."""

    __tablename__ = "misses"
    __table_args__ = (UniqueConstraint("device_id", "backend", "problem_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    backend: Mapped[str] = mapped_column(String(64))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    count: Mapped[int]
    first_seen: Mapped[datetime.datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime.datetime] = mapped_column(default=utcnow)

    device: Mapped[Device] = relationship(lazy="raise")
    problem: Mapped[ProblemRow] = relationship(lazy="raise")


class Job(Base):
    """A queued sweep (moetune.db.jobs): its validated spec, and the worker that runs it now proves it is
    alive by moving `heartbeat_at`, as a sweep's lease does. `sweep_id` is the sweep its first run created,
    which a later run resumes."""

    __tablename__ = "jobs"
    # claim_next takes the best queued job: by state, then priority.
    __table_args__ = (Index(None, "state", "priority"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    state: Mapped[str] = mapped_column(String(16))  # jobs.JOB_STATES
    spec: Mapped[dict[str, Any]]
    sweep_file: Mapped[str | None] = mapped_column(String(1024))
    device_kind: Mapped[str | None] = mapped_column(String(128))
    priority: Mapped[int]
    submitted_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime.datetime] = mapped_column(default=utcnow)
    claimed_at: Mapped[datetime.datetime | None]
    heartbeat_at: Mapped[datetime.datetime | None]
    finished_at: Mapped[datetime.datetime | None]
    owner_host: Mapped[str | None] = mapped_column(String(255))
    owner_pid: Mapped[int | None]
    owner_token: Mapped[str | None] = mapped_column(String(32))
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id"))
    attempts: Mapped[int]
    error: Mapped[str | None] = mapped_column(Text)


class JobLog(Base):
    """One line of a job's output, as its worker wrote it; the newest JOB_LOG_LINES per job are kept
    (moetune.db.progress)."""

    __tablename__ = "job_logs"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    at: Mapped[datetime.datetime] = mapped_column(default=utcnow)
    line: Mapped[str] = mapped_column(Text)


TABLE_NAMES = frozenset(Base.metadata.tables)
