"""A trial row as JSON, with T where the sweep that ran it recorded it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moetune.db.records import TrialRow


def trial_dict(row: TrialRow, tokens: int | None) -> dict[str, Any]:
    return {
        "id": row.id,
        "sweep_id": row.sweep_id,
        "device_kind": row.device_kind,
        "fingerprint_hash": row.fingerprint_hash,
        "backend": row.backend,
        "source_hash": row.source_hash,
        "problem": row.problem.key,
        "op": row.problem.op,
        "tokens": tokens,
        "m": row.problem.m,
        "config": row.config,
        "status": row.status,
        "median_s": row.median_s,
        "samples_s": list(row.samples_s),
        "compile_s": row.compile_s,
        "verify_error": row.verify_error,
        "error": row.error,
        "host": row.host,
        "worker": row.worker,
        "routing": row.routing,
        "details": row.details,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
    }
