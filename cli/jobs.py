"""`moetune jobs list|show|cancel`: the tuning queue (moetune.db.jobs), newest first.

A running job shows as `stale` when its worker stopped heartbeating: the next worker to look for work
puts it back in the queue and resumes its sweep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from moetune.cli import app
from moetune.cli.common import DbOption, JsonOption, check_range, emit, json_text
from moetune.cli.db_commands import opened_store, say
from moetune.cli.sweeps import age_text

if TYPE_CHECKING:
    from moetune.db.jobs import JobRow

jobs_app = typer.Typer(help="The tuning queue: list jobs, show one, cancel one.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")

JobId = Annotated[int, typer.Argument(help="The job's id (moetune jobs list).", show_default=False)]


def shown_state(job: JobRow) -> str:
    return "stale" if job.stale else job.state


def _cells(job: JobRow) -> dict[str, Any]:
    spec = job.spec
    what = [*spec.get("models", ()), *spec.get("problems", ())]
    what += [name for name in ("misses", "stale") if spec.get(name)]
    return {
        "id": job.id,
        "state": shown_state(job),
        "priority": job.priority,
        "device kind": job.device_kind or "any",
        "tunes": ", ".join(map(str, what)),
        "sweep": job.sweep_id or "",
        "attempts": job.attempts,
        "worker": job.owner or "",
        "heartbeat": age_text(job.heartbeat_age_s),
        "created": f"{job.created_at:%Y-%m-%d %H:%M}",
    }


@jobs_app.command("list")
def list_jobs(
    db: DbOption = None,
    state: Annotated[
        list[str] | None,
        typer.Option("--state", help="Only jobs in this state (repeatable).", show_default="all"),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="Newest N jobs; 0 for all.")] = 20,
    as_json: JsonOption = False,
) -> None:
    """List jobs, newest first: state (stale: running, but its worker stopped), priority, what it tunes,
    its sweep, attempts, worker, heartbeat age."""
    check_range("--limit", limit, low=0)
    with opened_store(db, read_only=True) as store:
        rows = store.jobs(states=tuple(state or ()), limit=limit or None)
    if as_json:
        emit([r.to_json() for r in rows], as_json=True)
        return
    emit([_cells(r) for r in rows], as_json=False, title=f"{len(rows)} jobs (newest first, times in UTC)")


@jobs_app.command("show")
def show_job(job_id: JobId, db: DbOption = None, as_json: JsonOption = False) -> None:
    """One job: its state, spec, sweep, worker and error."""
    check_range("job id", job_id)
    with opened_store(db, read_only=True) as store:
        job = store.get_job(job_id)
    if as_json:
        typer.echo(json_text(job.to_json(), indent=1, sort_keys=True))
        return
    emit(
        [{"field": k, "value": v} for k, v in (_cells(job) | {"error": job.error or ""}).items()],
        as_json=False,
    )
    say(f"spec: {json_text(job.spec, sort_keys=True)}")


@jobs_app.command("cancel")
def cancel_job(job_id: JobId, db: DbOption = None, as_json: JsonOption = False) -> None:
    """Cancel a queued or running job; a running one's worker stops it at its next heartbeat."""
    check_range("job id", job_id)
    with opened_store(db, read_only=True) as store:  # no job, or no database: refused, nothing created
        store.get_job(job_id)
    with opened_store(db) as store:
        job = store.cancel_job(job_id)
    if as_json:
        typer.echo(json_text(job.to_json(), indent=1, sort_keys=True))
        return
    say(f"job {job_id} cancelled" + (f" (its sweep {job.sweep_id} stays resumable)" if job.sweep_id else ""))
