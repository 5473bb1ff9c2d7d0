"""The lease on a sweep: one process runs a sweep at a time, and a sweep whose process died shows as dead.

Modelled on Optuna's RDB heartbeat (optuna/storages/_heartbeat.py): the process running a sweep stamps
`sweeps.heartbeat_at` every HEARTBEAT_S from a background thread (`Heartbeat`), and a lease is stale
once its heartbeat is older than GRACE_S. The stamp and the ages come from the database's clock
(PostgreSQL's now(), in UTC), so hosts whose clocks disagree still agree on an age; a SQLite file lives
on one host, whose clock is used.

The owner is (host, pid, random token). The token is new for every run: a process whose stale lease was
taken over finds its token gone at its next heartbeat and stops, so it never writes over the new owner.

A lease is stale when
  - it has no heartbeat (a sweep from before leases, one that ended, or one whose owner let go),
  - its heartbeat is older than GRACE_S, or
  - its owner ran on this host and that process is gone: a resumer on the same host takes over a
    SIGKILLed sweep at once instead of waiting out the grace period. This assumes that a host name
    is not shared by separate process-id namespaces (containers get host names of their own).
A running sweep with a stale lease shows as "dead" (`shown_status`); nothing writes that status.

Timing sweeps claim their device (`claim_device`): two sweeps timing on one device fingerprint at once
disturb each other's timings, so the second is refused unless forced. Compile-only sweeps time nothing
and claim no device.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import secrets
import socket
import threading
from collections.abc import Callable

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from moetune.db.errors import DatabaseError, DeviceBusy, LeaseHeld, LeaseLost, RecordNotFound
from moetune.db.models import Device, Job, Sweep
from moetune.db.records import utcnow

# Seconds between heartbeats.
HEARTBEAT_S = 5.0
# Seconds without a heartbeat after which a lease is stale. Above SQLite's busy timeout (30 s, engine.py),
# which one heartbeat may spend waiting for the write lock, with room for a driver stalled by swapping.
GRACE_S = 60.0
# Seconds a sweep's writes and heartbeat keep reconnecting to a database that went away (a server
# restart): a beat that lands after this is still within GRACE_S of the one before, so no one may have
# taken the lease over meanwhile.
RECONNECT_S = GRACE_S - 2 * HEARTBEAT_S
RUNNING = "running"
DEAD = "dead"


@dataclasses.dataclass(frozen=True)
class Owner:
    """The process that holds a lease; `token` tells two runs of one process id apart."""

    host: str
    pid: int
    token: str

    @classmethod
    def here(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), secrets.token_hex(8))

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"


def db_now(session: Session) -> datetime.datetime:
    """Naive UTC by the database's clock (PostgreSQL), or by this host's (SQLite: the file is local)."""
    if session.get_bind().dialect.name == "postgresql":
        return session.scalar(select(func.timezone("UTC", func.now())))
    return utcnow()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def is_stale(host: str | None, pid: int | None, age_s: float | None) -> bool:
    if age_s is None or age_s > GRACE_S:
        return True
    return host == socket.gethostname() and pid is not None and not _alive(pid)


def age_s(leased: Sweep | Job, now: datetime.datetime) -> float | None:
    """Seconds since the last heartbeat of a leased row (a sweep, a running job), or None when it has
    none."""
    if leased.heartbeat_at is None:
        return None
    return max(0.0, (now - leased.heartbeat_at).total_seconds())


def shown_status(status: str, host: str | None, pid: int | None, age: float | None) -> str:
    """The status to show: a running sweep whose lease is stale is dead."""
    return DEAD if status == RUNNING and is_stale(host, pid, age) else status


def _locked(session: Session, sweep_id: int) -> Sweep:
    # FOR UPDATE on PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises writers.
    sweep = session.scalar(select(Sweep).where(Sweep.id == sweep_id).with_for_update())
    if sweep is None:
        raise RecordNotFound(f"no sweep with id {sweep_id}")
    return sweep


def _holder(sweep: Sweep, age: float | None) -> str:
    beat = "no heartbeat" if age is None else f"last heartbeat {age:.0f} s ago"
    return f"{sweep.owner_host}:{sweep.owner_pid} ({beat})"


def _held_by_other(sweep: Sweep, owner: Owner, now: datetime.datetime) -> bool:
    """Whatever the sweep's status: a resumer holds the lease before its sweep runs again."""
    if sweep.owner_token in (None, owner.token):
        return False
    return not is_stale(sweep.owner_host, sweep.owner_pid, age_s(sweep, now))


def take(sweep: Sweep, owner: Owner, now: datetime.datetime) -> None:
    sweep.owner_host, sweep.owner_pid, sweep.owner_token = owner.host, owner.pid, owner.token
    sweep.heartbeat_at = now


def acquire(session: Session, sweep_id: int, owner: Owner) -> None:
    """Take the sweep's lease: refused (LeaseHeld) while another process holds it fresh."""
    sweep = _locked(session, sweep_id)
    now = db_now(session)
    if _held_by_other(sweep, owner, now):
        raise LeaseHeld(
            f"sweep {sweep_id} is running on {_holder(sweep, age_s(sweep, now))}; wait for it to end, or "
            f"resume it once it has been silent for {GRACE_S:.0f} s"
        )
    take(sweep, owner, now)


def _owned(session: Session, sweep_id: int, owner: Owner) -> Sweep:
    sweep = _locked(session, sweep_id)
    if sweep.owner_token != owner.token:
        taker = f"{sweep.owner_host}:{sweep.owner_pid}" if sweep.owner_token else "nobody"
        raise LeaseLost(f"sweep {sweep_id} is no longer run by {owner} but by {taker}; this run stops")
    return sweep


def claim_device(session: Session, sweep_id: int, owner: Owner, device_id: int | None, force: bool) -> None:
    """Mark the sweep running on `device_id` (None: compile-only, no device), refusing (DeviceBusy) while
    another sweep with a fresh lease times on the same device, unless `force`."""
    sweep = _owned(session, sweep_id, owner)
    now = db_now(session)
    if device_id is not None:
        check_device_free(session, device_id, now, force, exclude=sweep_id)
    sweep.device_id = device_id
    sweep.status, sweep.finished_at = RUNNING, None
    sweep.heartbeat_at = now


def check_device_free(
    session: Session, device_id: int, now: datetime.datetime, force: bool, *, exclude: int | None = None
) -> None:
    """DeviceBusy when another running sweep with a fresh lease times on `device_id` (and not `force`).

    The device row is locked first (PostgreSQL), so two sweeps claiming one device are serialised and
    the second sees the first's claim."""
    session.scalar(select(Device.id).where(Device.id == device_id).with_for_update())
    others = session.scalars(
        select(Sweep).where(Sweep.device_id == device_id, Sweep.status == RUNNING, Sweep.id != exclude)
    )
    busy = [s for s in others if not is_stale(s.owner_host, s.owner_pid, age_s(s, now))]
    if busy and not force:
        held = "; ".join(f"sweep {s.id} on {_holder(s, age_s(s, now))}" for s in busy)
        raise DeviceBusy(
            f"another sweep times on this device now ({held}): two timing sweeps on one device disturb "
            "each other's timings; wait for it to end, or pass --force"
        )


def heartbeat(session: Session, sweep_id: int, owner: Owner) -> bool:
    """Move the heartbeat; False when the lease is no longer this owner's."""
    stamp = (
        update(Sweep)
        .where(Sweep.id == sweep_id, Sweep.owner_token == owner.token)
        .values(heartbeat_at=db_now(session))
    )
    return session.execute(stamp).rowcount == 1


def release(session: Session, sweep_id: int, owner: Owner) -> None:
    """Let go of the lease (a run that stops before its sweep started): the next resumer needs no wait."""
    session.execute(
        update(Sweep).where(Sweep.id == sweep_id, Sweep.owner_token == owner.token).values(heartbeat_at=None)
    )


def held(session: Session, sweep_id: int, owner: Owner) -> None:
    """LeaseLost unless `owner` holds the sweep's lease; the row stays locked to the end of the transaction,
    so what the caller writes in it cannot land after a take-over."""
    _owned(session, sweep_id, owner)


def finish(session: Session, sweep_id: int, owner: Owner | None) -> Sweep:
    """The sweep row to finish, its lease let go (the owner stays, as who ran it last): LeaseLost when
    `owner` no longer holds it (the new owner's sweep now)."""
    sweep = _locked(session, sweep_id) if owner is None else _owned(session, sweep_id, owner)
    sweep.heartbeat_at = None
    return sweep


class Heartbeat:
    """Calls `beat` every `interval_s` from a daemon thread until `stop`; `check` raises, in the caller's
    thread, what the thread met: LeaseLost when `beat` returned False, or the DatabaseError it raised.

    The thread stops at its first failure; the sweep driver checks between results and ends the sweep.
    Daemon, so that a database call hanging in it never keeps the process alive.
    """

    def __init__(self, beat: Callable[[], bool], describe: str, interval_s: float = HEARTBEAT_S) -> None:
        self._beat = beat
        self._describe = describe
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._error: DatabaseError | None = None
        self._thread = threading.Thread(target=self._loop, name="moetune-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval_s)

    def check(self) -> None:
        if self._error is not None:
            raise self._error

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                if not self._beat():
                    self._error = LeaseLost(f"{self._describe}: the lease was taken over; this run stops")
                    return
            except DatabaseError as e:
                self._error = e
                return
