"""A dispatch miss as JSON, with its status: resolved once its device fingerprint, backend and problem
have an active winner found with the backend's current kernel source (tuner/resolved.py), exactly the
misses `moetune tune --misses` leaves out; unknown where that backend cannot be loaded here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from moetune.tuner.listings.source_hashes import SourceHashes

if TYPE_CHECKING:
    from moetune.db.records import MissRow

RESOLVED, MISSED, UNKNOWN = "resolved", "missed", "unknown"


class MissStatus:
    """The status of each miss of one store; each backend's source hash is read once."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.sources = SourceHashes()

    def __call__(self, row: MissRow) -> str:
        from moetune.tuner.resolved import tuned

        source_hash = self.sources(row.backend)
        if source_hash is None:
            return UNKNOWN
        key = dict(fingerprint_hash=row.fingerprint_hash, backend=row.backend, problem_key=row.problem.key)
        return RESOLVED if tuned(self.store, **key, source_hash=source_hash) else MISSED


def miss_dict(row: MissRow, status: str) -> dict[str, Any]:
    return {
        "gpu": row.device_kind,
        "fingerprint_hash": row.fingerprint_hash,
        "backend": row.backend,
        "problem": row.problem.key,
        "op": row.problem.op,
        "m": row.problem.m,
        "count": row.count,
        "first_seen": row.first_seen,
        "last_seen": row.last_seen,
        "status": status,
    }
