"""`moetune sweeps`: the sweeps in the database, newest first, with their status and their lease's age.

A sweep shows as `dead` when it is still marked running but its process stopped heartbeating
(moetune.db.leases): `moetune tune --resume ID` finishes it. Read-only: it never creates or changes a
database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from moetune.cli import app
from moetune.cli.common import emit, err_console, fail
from moetune.cli.db_commands import DbOption, JsonOption, opened_store
from moetune.tuner.listings.sweeps import sweep_dict

if TYPE_CHECKING:
    from moetune.db.records import SweepRow


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


def _cells(row: SweepRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "status": row.status,
        "backend": row.backend,
        "strategy": row.strategy,
        "device": row.device_kind or "",
        "problems": row.problems,
        "trials": row.trials,
        "created": f"{row.created_at:%Y-%m-%d %H:%M}",
        "heartbeat": age_text(row.heartbeat_age_s),
    }


@app.command("sweeps")
def sweeps_command(
    db: DbOption = None,
    limit: Annotated[int, typer.Option("--limit", help="Newest N sweeps; 0 for all.")] = 20,
    as_json: JsonOption = False,
) -> None:
    """List sweeps, newest first: status (dead: marked running, but its process stopped), backend,
    strategy, device, problems, trials, when it was created and how old its last heartbeat is."""
    if limit < 0:
        fail(f"--limit {limit} must be 0 (all) or more")
    with opened_store(db, read_only=True) as store:
        rows = store.sweeps(limit=limit or None)
    if limit and len(rows) == limit:  # there may be more: said where it cannot spoil --json output
        err_console.print(
            f"showing the newest {limit} sweeps; --limit 0 lists all", markup=False, highlight=False
        )
    if as_json:
        emit([sweep_dict(r) for r in rows], as_json=True)
        return
    emit([_cells(r) for r in rows], as_json=False, title=f"{len(rows)} sweeps (newest first, times in UTC)")
