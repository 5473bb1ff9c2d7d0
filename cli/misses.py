"""`moetune misses`: the dispatch lookups that found no winner, most frequent first (what to tune next).

A miss stays recorded after a sweep tuned its problem; it shows as resolved once its device fingerprint,
backend and problem have an active winner found with the backend's current kernel source: exactly the
misses `moetune tune --misses` leaves out (tuner/resolved.py).
"""

from __future__ import annotations

from typing import Annotated

import typer

from moetune.cli import app
from moetune.cli.common import DbOption, emit
from moetune.cli.db_commands import BackendOption, GpuOption, JsonOption, check_known, opened_store
from moetune.tuner import problem_cells as problems
from moetune.tuner.listings.misses import RESOLVED, MissStatus, miss_dict


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
    with opened_store(db, read_only=True) as store:
        check_known("gpu", gpu, store.device_kinds())
        check_known("backend", backend, store.backends())
        status_of = MissStatus(store)
        rows = [(r, status_of(r)) for r in store.misses(device_kind=gpu, backend=backend)]
    if unresolved:
        rows = [(r, status) for r, status in rows if status != RESOLVED]
    if as_json:
        emit([miss_dict(r, status) for r, status in rows], as_json=True)
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
