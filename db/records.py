"""Plain values that go into and come out of the store; ORM objects never leave a session.

Times are naive UTC everywhere (`utcnow()`), as in Optuna's storage: SQLite has no time-zone type, and
one convention avoids comparing aware with naive values. An aware datetime given to the store is
converted to UTC and stripped.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from typing import Any

from moetune.db.errors import InvalidRecord
from moetune.kernels.device import DeviceFingerprint
from moetune.kernels.problem import Problem

# Every trial is written once, when it has ended, so every status is final.
TRIAL_STATUSES = ("ok", "compile_error", "wrong_result", "timeout", "crashed", "pruned")
# incomplete: the sweep ran to its end, but some problem could not be decided (its finalists' re-timing
# failed twice); `moetune tune --resume` tries again. A running sweep whose process died shows as "dead"
# (moetune.db.leases), a status that is shown, never stored.
SWEEP_STATUSES = ("running", "done", "failed", "interrupted", "incomplete")
# A winner row is never deleted: promotion supersedes the active one, rollback marks it rolled_back.
WINNER_STATES = ("active", "superseded", "rolled_back")


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


def naive_utc(value: datetime.datetime | None) -> datetime.datetime | None:
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(datetime.UTC).replace(tzinfo=None)


def canonical_config(config: dict[str, Any]) -> str:
    """The key under which one config is recognised again (resume, "never time the same config twice")."""
    return json.dumps(config, sort_keys=True)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InvalidRecord(f"{name}={value!r} is not one of {', '.join(choices)}")
    return value


def check_json(name: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidRecord(f"{name} is not plain JSON data ({e})") from e


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """One finished candidate, as the tuner reports it; `Store.record_trial` writes it."""

    sweep_id: int | None
    device: DeviceFingerprint
    backend: str
    family: str
    source_hash: str
    problem: Problem
    config: dict[str, Any]
    status: str
    samples_s: tuple[float, ...] = ()
    median_s: float | None = None
    compile_s: float | None = None
    verify_error: float | None = None
    error: str = ""
    host: str = ""
    worker: str = ""
    routing: dict[str, Any] | None = None
    started_at: datetime.datetime | None = None
    finished_at: datetime.datetime | None = None
    # What the trial found besides its times (compile-only: target, binary hash, static metrics).
    details: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        check_choice("status", self.status, TRIAL_STATUSES)
        if not isinstance(self.config, dict):
            raise InvalidRecord(f"config must be a dict, not {type(self.config).__name__}")
        check_json("config", self.config)
        check_json("routing", self.routing)
        check_json("details", self.details)
        try:
            samples = tuple(float(s) for s in self.samples_s)
        except (TypeError, ValueError) as e:
            raise InvalidRecord(f"samples_s must be numbers of seconds ({e})") from e
        if not all(math.isfinite(s) for s in samples):
            raise InvalidRecord(f"samples_s holds a non-finite value: {samples}")
        object.__setattr__(self, "samples_s", samples)
        for name in ("median_s", "compile_s"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise InvalidRecord(f"{name}={value!r} is not finite")
        if self.verify_error is not None and math.isnan(self.verify_error):
            # NaN output is infinitely wrong; SQLite would silently store a NaN as NULL.
            object.__setattr__(self, "verify_error", math.inf)
        object.__setattr__(self, "started_at", naive_utc(self.started_at))
        object.__setattr__(self, "finished_at", naive_utc(self.finished_at))


@dataclasses.dataclass(frozen=True)
class TrialRow:
    id: int
    sweep_id: int | None
    device_kind: str
    fingerprint_hash: str
    backend: str
    source_hash: str
    problem: Problem
    config: dict[str, Any]
    status: str
    samples_s: tuple[float, ...]
    median_s: float | None
    compile_s: float | None
    verify_error: float | None
    error: str
    host: str
    worker: str
    routing: dict[str, Any] | None
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    family: str = ""
    details: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class WinnerRow:
    id: int
    trial_id: int
    device_kind: str
    fingerprint_hash: str
    device: DeviceFingerprint
    backend: str
    source_hash: str
    problem: Problem
    config: dict[str, Any]
    median_s: float | None
    promoted_at: datetime.datetime
    active: bool
    reason: str
    state: str = "active"  # one of WINNER_STATES
    retired_at: datetime.datetime | None = None
    decision: dict[str, Any] | None = None  # how the promotion was decided (tuner/decided.py)
    sweep_id: int | None = None  # of the winning trial


@dataclasses.dataclass(frozen=True)
class MissRow:
    device_kind: str
    fingerprint_hash: str
    backend: str
    problem: Problem
    count: int
    first_seen: datetime.datetime
    last_seen: datetime.datetime


@dataclasses.dataclass(frozen=True)
class SweepRow:
    """A sweep as read. `status` is the one to show: "dead" for a running sweep whose lease is stale
    (moetune.db.leases), else `stored_status`, what the row holds."""

    id: int
    backend: str
    strategy: str
    spec: dict[str, Any]
    status: str
    host: str
    user: str
    created_at: datetime.datetime
    finished_at: datetime.datetime | None
    sweep_file: str | None
    stored_status: str = ""
    owner: str | None = None  # "host:pid" of the process that holds (or last held) the lease
    heartbeat_age_s: float | None = None  # by the database's clock, when read
    device_kind: str | None = None  # of the device it times on (a compile-only sweep's target stand-in)
    problems: int = 0
    trials: int = 0
