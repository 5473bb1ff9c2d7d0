"""`moetune misses`: the dispatch lookups that found no winner, most frequent first (what to tune next).

A miss stays recorded after a sweep tuned its problem; it shows as resolved once its device fingerprint,
backend and problem have an active winner found with the backend's current kernel source: exactly the
misses `moetune tune --misses` leaves out (tuner/resolved.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from moetune.tuner.cli import app
from moetune.tuner.cli import problem_cells as problems
from moetune.tuner.cli.common import DbOption, emit
from moetune.tuner.cli.db_commands import BackendOption, GpuOption, JsonOption, check_known, opened_store

if TYPE_CHECKING:
    from moetune.db.records import MissRow

RESOLVED, MISSED, UNKNOWN = "resolved", "missed", "unknown"


def _source_hash(backend: str, known: dict[str, str | None]) -> str | None:
    """The backend's current kernel source here (None: the backend cannot be loaded here)."""
    from moetune.kernels import registry

    if backend not in known:
        try:
            known[backend] = registry.get(backend).source_hash()
        except Exception:  # not a backend here, its dependency is missing, its source is not files
            known[backend] = None
    return known[backend]


def _status(store: Any, row: MissRow, sources: dict[str, str | None]) -> str:
    from moetune.tuner.resolved import tuned

    source_hash = _source_hash(row.backend, sources)
    if source_hash is None:
        return UNKNOWN
    key = dict(fingerprint_hash=row.fingerprint_hash, backend=row.backend, problem_key=row.problem.key)
    return RESOLVED if tuned(store, **key, source_hash=source_hash) else MISSED


def _miss_dict(row: MissRow, status: str) -> dict[str, Any]:
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


@app.command("misses")
def misses_command(
    db: DbOption = None,
    gpu: GpuOption = None,
    backend: BackendOption = None,
    unresolved: Annotated[
        bool, typer.Option("--unresolved", help="Hide the misses a later sweep has tuned.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Show dispatch lookups that found no winner, most frequent first, each missed or resolved (a later
    sweep tuned it on that device with the current kernel source)."""
    sources: dict[str, str | None] = {}
    with opened_store(db, read_only=True) as store:
        check_known("gpu", gpu, store.device_kinds())
        check_known("backend", backend, store.backends())
        rows = [(r, _status(store, r, sources)) for r in store.misses(device_kind=gpu, backend=backend)]
    if unresolved:
        rows = [(r, status) for r, status in rows if status != RESOLVED]
    if as_json:
        emit([_miss_dict(r, status) for r, status in rows], as_json=True)
        return
    cells = [
        {
            "status": status,
            "gpu": r.device_kind,
            "backend": r.backend,
            **problems.cells(r.problem, None, with_tokens=False),
            "problem key": r.problem.key,
            "count": r.count,
            "last seen": f"{r.last_seen:%Y-%m-%d %H:%M}",
        }
        for r, status in rows
    ]
    resolved = sum(status == RESOLVED for _, status in rows)
    title = f"{len(rows)} misses ({resolved} resolved; times in UTC)" + problems.tokens_note(
        [None] * len(rows)
    )
    emit(cells, as_json=False, title=title)
