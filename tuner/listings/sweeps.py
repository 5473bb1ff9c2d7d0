"""A sweep row as JSON: numbers stay numbers, what is unknown is null."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moetune.db.records import SweepRow


def sweep_dict(row: SweepRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "status": row.status,
        "stored_status": row.stored_status,
        "backend": row.backend,
        "strategy": row.strategy,
        "device_kind": row.device_kind,
        "problems": row.problems,
        "trials": row.trials,
        "created_at": row.created_at.isoformat(),
        "finished_at": None if row.finished_at is None else row.finished_at.isoformat(),
        "owner": row.owner,
        "heartbeat_age_s": row.heartbeat_age_s,
    }
