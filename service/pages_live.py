"""The dashboard's live parts: a running sweep's progress as its driver publishes it, the jobs, and each
job's state and log lines. Each part is a fragment of HTML at /parts/..., which its page embeds and
/static/live.js fetches again every few seconds (until the sweep or job has ended), so a page open on a
running sweep follows it without a reload. Nothing comes from elsewhere: the script is this package's.

    /jobs                     the jobs, newest first (state, worker, attempts, sweep, error)
    /jobs/{id}                one job: its state, worker, attempts, sweep, spec and log lines
    /parts/jobs               the jobs table alone
    /parts/jobs/{id}          one job's state and log lines
    /parts/sweeps/{id}        a sweep's progress: trials planned, done, failed; rate, ETA, lanes, best so far
"""

from __future__ import annotations

import json
from html import escape
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse

from moetune.db.store import Store
from moetune.kernels.typed_fields import INT32_MAX
from moetune.service.auth import require_read
from moetune.service.deps import store
from moetune.service.filters import Limit, Offset
from moetune.service.pages_layout import Html, document, link, pager, table
from moetune.tuner.progress import duration

StoreDep = Annotated[Store, Depends(store)]
router = APIRouter(dependencies=[Depends(require_read)], include_in_schema=False)
POLL_MS = 2000
ENDED_JOB = ("done", "failed", "cancelled")
ENDED_SWEEP = ("done", "failed", "interrupted", "incomplete", "dead")
MAX_PROBLEM_ROWS = 40


def live(url: str, inner: str, *, every_ms: int = POLL_MS) -> str:
    """A part of a page that live.js refreshes from `url`."""
    return f'<div class=live data-poll="{escape(url)}" data-every="{every_ms}">{inner}</div>'


def _when(value: Any) -> str:
    return "-" if value is None else f"{value:%Y-%m-%d %H:%M:%S}"


# --- a sweep's progress -------------------------------------------------------------------------------


def progress_part(db: Store, sweep_id: int) -> str:
    sweep = db.get_sweep(sweep_id)
    progress, age = db.sweep_progress(sweep_id)
    final = " data-final" if sweep.status in ENDED_SWEEP else ""
    status = f"<span class=status-{escape(sweep.status)}{final}>{escape(sweep.status)}</span>"
    if progress is None:
        return f"<p class=progress>{status}: no progress published yet.</p>"
    if progress.get("stage"):
        return f"<p class=progress>{status}: setting up ({escape(progress['stage'])}).</p>"
    planned, done = progress.get("planned", 0), progress.get("done", 0)
    share = min(100.0, 100.0 * done / planned) if planned else 0.0
    eta = "-" if sweep.status in ENDED_SWEEP else duration(progress.get("eta_s"))
    facts = (
        f"{done} / {planned} trials ({progress.get('ok', 0)} ok, {progress.get('failed', 0)} failed), "
        f"{progress.get('rate_per_min', 0):.1f} / min on {progress.get('workers', 1)} workers, "
        f"elapsed {duration(progress.get('elapsed_s'))}, ETA {eta}; published {duration(age)} ago"
    )
    parts = [
        f"<p class=progress>{status}: <span class=figures>{escape(facts)}</span></p>",
        f'<div class=bar><div class=done style="width: {share:.1f}%"></div></div>',
    ]
    lanes = progress.get("lanes") or {}
    if lanes:
        parts.append(table(["device lane", "timing now"], sorted(lanes.items())))
    best = progress.get("best") or []
    if best:
        header = list(best[0])
        parts.append("<h3>Winners as decided, else the best so far</h3>")
        parts.append(table(header, [[row.get(h, "") for h in header] for row in best[:MAX_PROBLEM_ROWS]]))
    problems = progress.get("problems") or []
    if problems:
        rows = [[p["label"], f"{p['done']}/{p['planned']}", p["phase"]] for p in problems[:MAX_PROBLEM_ROWS]]
        parts.append(table(["problem", "trials", "phase"], rows))
    more = len(problems) - MAX_PROBLEM_ROWS + progress.get("more_rows", 0)
    if more > 0:
        parts.append(f"<p class=note>... and {more} more problems.</p>")
    return "".join(parts)


@router.get("/parts/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_progress_part(sweep_id: int, db: StoreDep) -> str:
    return progress_part(db, sweep_id)


def sweep_panel(db: Store, sweep_id: int) -> str:
    """The live progress panel at the top of a sweep's page."""
    return "<h2>Progress</h2>" + live(f"/parts/sweeps/{sweep_id}", progress_part(db, sweep_id))


# --- jobs ---------------------------------------------------------------------------------------------


def _job_state(job: Any) -> Html:
    state = "stale" if job.stale else job.state
    final = " data-final" if job.state in ENDED_JOB else ""
    return Html(f"<span class=status-{escape(state)}{final}>{escape(state)}</span>")


def jobs_part(db: Store, limit: int, offset: int) -> str:
    found = db.jobs(limit=offset + limit + 1)[offset:]
    rows = [
        [
            link(f"/jobs/{j.id}", str(j.id)),
            Html(_job_state(j).replace(" data-final", "")),
            j.device_kind or "any",
            j.priority,
            j.owner or "-",
            j.attempts,
            link(f"/sweeps/{j.sweep_id}", str(j.sweep_id)) if j.sweep_id else "-",
            _when(j.created_at),
            _when(j.finished_at),
            (j.error or "")[:200],
        ]
        for j in found[:limit]
    ]
    header = ["job", "state", "GPU", "priority", "worker", "attempts", "sweep", "submitted", "ended", "error"]
    return (table(header, rows) if rows else "<p>No job yet.</p>") + pager(
        "/jobs", offset, limit, more=len(found) > limit
    )


@router.get("/parts/jobs", response_class=HTMLResponse)
def jobs_fragment(db: StoreDep, limit: Limit = 100, offset: Offset = 0) -> str:
    return jobs_part(db, limit, offset)


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(db: StoreDep, limit: Limit = 100, offset: Offset = 0) -> str:
    body = (
        "<h1>Jobs</h1><p class=note>The tuning queue, newest first, times in UTC (updated live). stale: "
        "running, but its worker stopped heartbeating; the next worker puts it back in the queue. "
        "<code>moetune submit</code> queues a job, <code>moetune worker</code> runs them.</p>"
        + live(f"/parts/jobs?limit={limit}&offset={offset}", jobs_part(db, limit, offset), every_ms=5000)
    )
    return document("moetune jobs", body, live=True)


def job_part(db: Store, job_id: int) -> str:
    job = db.get_job(job_id)  # RecordNotFound: 404
    log = db.job_log(job_id)
    heartbeat = "-" if job.heartbeat_age_s is None else f"{job.heartbeat_age_s:.0f} s ago"
    facts = [
        ["state", _job_state(job)],
        ["worker", job.owner or "-"],
        ["attempts", job.attempts],
        ["last heartbeat", heartbeat if job.state == "running" else "-"],
        ["sweep", link(f"/sweeps/{job.sweep_id}", f"sweep {job.sweep_id}") if job.sweep_id else "-"],
        ["GPU model", job.device_kind or "any"],
        ["priority", job.priority],
        ["submitted", f"{_when(job.created_at)} by {job.submitted_by or '?'}"],
        ["claimed / ended", f"{_when(job.claimed_at)} / {_when(job.finished_at)}"],
        ["error", job.error or "-"],
    ]
    lines = "\n".join(f"{at:%H:%M:%S}  {line}" for at, line in log)
    shown = f"<pre class=log>{escape(lines)}</pre>" if log else "<p class=note>No output yet.</p>"
    return table(["", ""], facts) + f"<h2>Log</h2><p class=note>The newest {len(log)} lines.</p>" + shown


@router.get("/parts/jobs/{job_id}", response_class=HTMLResponse)
def job_fragment(job_id: int, db: StoreDep) -> str:
    if not 1 <= job_id <= INT32_MAX:
        return "<p>No such job.</p>"
    return job_part(db, job_id)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: int, db: StoreDep) -> str:
    inner = job_part(db, job_id)  # before the spec: an unknown job is a 404
    spec = json.dumps(db.get_job(job_id).spec, indent=1, sort_keys=True)
    body = (
        f"<h1>Job {job_id}</h1>"
        + live(f"/parts/jobs/{job_id}", inner)
        + f"<h2>Spec</h2><pre>{escape(spec)}</pre>"
    )
    return document(f"moetune job {job_id}", body, live=True)
