"""The dashboard: server-rendered pages over the service's database, read-only, behind require_read.

    /                the sweeps, newest first, with their status (dead: its lease went stale)
    /sweeps/{id}     a sweep: the sections and charts `moetune report` writes (tuner/report.py)
    /winners         the winners matrix (service/pages_winners.py)
    /misses          dispatch misses, most frequent first
    /stale           active winners stale here, and why (as `moetune best` decides it)

Charts load plotly.js from /static/plotly.min.js, the copy inside the installed plotly package, served
with a long cache lifetime: nothing comes from a CDN, and no page inlines its 5 MB.
"""

from __future__ import annotations

import functools
import math
import os
from html import escape
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, HTMLResponse, Response

from moetune.db.store import Store
from moetune.service.auth import require_read
from moetune.service.deps import store
from moetune.service.filters import Limit, Offset
from moetune.service.pages_compare import compare_form
from moetune.service.pages_layout import PLOTLY_PATH, Html, document, lines, link, pager, table

StoreDep = Annotated[Store, Depends(store)]
router = APIRouter(dependencies=[Depends(require_read)], include_in_schema=False)
STATIC_MAX_AGE_S = 7 * 24 * 3600  # the file changes only with the plotly package: revalidated by its ETag


def _when(value: Any) -> str:
    return "-" if value is None else f"{value:%Y-%m-%d %H:%M}"


@router.get("/", response_class=HTMLResponse)
def sweeps_page(db: StoreDep, limit: Limit = 100, offset: Offset = 0) -> str:
    rows = []
    found = db.sweeps(limit=offset + limit + 1)[offset:]  # one more: is there a next page?
    for r in found[:limit]:
        status = r.status if r.status == r.stored_status else f"{r.status} (stored: {r.stored_status})"
        heartbeat = "-" if r.heartbeat_age_s is None else f"{r.heartbeat_age_s:.0f} s ago"
        rows.append(
            [
                link(f"/sweeps/{r.id}", str(r.id)),
                status,
                r.backend,
                r.strategy,
                r.device_kind or "-",
                r.problems,
                r.trials,
                _when(r.created_at),
                _when(r.finished_at),
                f"{heartbeat} ({r.owner})" if r.owner else heartbeat,
            ]
        )
    header = ["sweep", "status", "backend", "strategy", "device", "problems", "trials", "created"]
    header += ["finished", "last heartbeat"]
    body = (
        "<h1>Sweeps</h1><p class=note>Newest first, times in UTC. dead: marked running, but its process "
        "stopped heartbeating; <code>moetune tune --resume ID</code> finishes it.</p>"
        + compare_form()
        + (table(header, rows) if rows else "<p>No sweep yet.</p>")
        + pager("/", offset, limit, more=len(found) > limit)
    )
    return document("moetune sweeps", body)


def _optuna_note(sweep_id: int) -> str:
    storage = f"sqlite:///sweep{sweep_id}-optuna.db"
    return (
        "<h2>In optuna-dashboard</h2><p>Export the sweep to an Optuna storage, one study per problem, and "
        f"open it: <code>moetune export-optuna {sweep_id} --storage {storage}</code> then "
        f"<code>optuna-dashboard {storage}</code>.</p>"
    )


@router.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(sweep_id: int, db: StoreDep) -> str:
    from moetune.service.pages_compare import trials_table
    from moetune.service.pages_live import sweep_panel
    from moetune.tuner.report import sections

    report = sections(db, sweep_id)  # no such sweep: RecordNotFound, a 404
    body = report.body.replace("</h1>", "</h1>" + sweep_panel(db, sweep_id), 1)
    body += trials_table(db, sweep_id) + _optuna_note(sweep_id)
    return document(report.title, body, plotly=bool(report.figures), live=True)


@router.get("/winners", response_class=HTMLResponse)
def winners_page(db: StoreDep) -> str:
    from moetune.service import pages_winners

    matrix = pages_winners.build(db)
    rows = [
        [gpu, model, backend]
        + [winner_lines(matrix.cells.get(((gpu, model, backend), c), [])) for c in matrix.columns]
        for gpu, model, backend in matrix.rows
    ]
    body = (
        "<h1>Winners</h1><p class=note>Active winners per GPU model, model and backend, a column per token "
        "bucket T (m = T x top_k rows; a problem with no known T shows under its m). Each line: the "
        "winner's speedup over the backend's heuristic default and over XLA's ragged_dot (their time / the "
        "winner's), re-timed beside it where they were finalists of its decision, else sweep medians; - "
        "where the sweep timed no such config. A model tuned from a config.json or a model file is named "
        "as its sweep named it; <i>other</i>: problems no model planned. The colour is the speedup over the "
        "heuristic (green: faster, red: slower, grey: not compared); each line links to the sweep that "
        "decided it (its trial in the tooltip).</p>"
        + (
            table(["GPU", "model", "backend", *matrix.columns], rows, cell_class="cell")
            if rows
            else "<p>No winner yet.</p>"
        )
    )
    return document("moetune winners", body)


def _colour(entry: Any) -> str:
    """The cell line's background: the speedup over the heuristic on a log scale, 1x white, 2x (or
    better) full green, 0.5x (or worse) full red; grey where there is no comparison."""
    compared = entry.vs_heuristic
    if compared is None or compared.ratio is None or compared.ratio <= 0:
        return "#eeeeee"
    strength = max(-1.0, min(1.0, math.log2(compared.ratio)))
    lightness = 97 - 35 * abs(strength)
    return f"hsl({120 if strength >= 0 else 0}, 60%, {lightness:.0f}%)"


def winner_lines(entries: list[Any]) -> Html:
    """A matrix cell: each winner's line, coloured by its speedup and linked to its sweep."""
    out = []
    for e in entries:
        text = escape(e.text())
        if e.sweep_id is not None:
            title = escape(f"sweep {e.sweep_id}, trial {e.trial_id}")
            text = f'<a href="/sweeps/{e.sweep_id}#trial-{e.trial_id}" title="{title}">{text}</a>'
        out.append(f'<div class=win style="background: {_colour(e)}">{text}</div>')
    return Html("".join(out))


@router.get("/misses", response_class=HTMLResponse)
def misses_page(db: StoreDep, limit: Limit = 100, offset: Offset = 0) -> str:
    from moetune.tuner.listings.misses import MissStatus

    status = MissStatus(db)
    found = db.misses()
    rows = [
        [
            r.count,
            status(r),
            r.device_kind,
            r.backend,
            r.problem.op,
            r.problem.m,
            f"{r.problem.k},{r.problem.n},{r.problem.g}",
            r.problem.key,
            _when(r.first_seen),
            _when(r.last_seen),
        ]
        for r in found[offset : offset + limit]
    ]
    header = [
        "count",
        "status",
        "GPU",
        "backend",
        "op",
        "m",
        "k,n,g",
        "problem key",
        "first seen",
        "last seen",
    ]
    body = (
        "<h1>Misses</h1><p class=note>Dispatch lookups that found no winner, most frequent first (what to "
        "tune next; <code>moetune tune --misses</code> tunes the unresolved ones). resolved: a later sweep "
        "tuned it on that device with the current kernel source. Times in UTC.</p>"
        + (table(header, rows) if rows else "<p>No miss recorded.</p>")
        + pager("/misses", offset, limit, more=len(found) > offset + limit)
    )
    return document("moetune misses", body)


@router.get("/stale", response_class=HTMLResponse)
def stale_page(db: StoreDep) -> str:
    from moetune.tuner import config_diff
    from moetune.tuner.listings.winners import Stack, database_winners

    stack = Stack()  # this server's device and kernel sources, as `moetune best` reads them
    listed = [stack.freshness(item) for item in database_winners(db, active_only=True)]
    stale = [item for item in listed if item.freshness == "stale"]
    rows = [
        [
            item.device_kind,
            item.winner.backend,
            item.winner.problem.key,
            config_diff.text(item.winner.backend, dict(item.winner.config)),
            f"{_when(item.row.promoted_at if item.row else None)}: {item.reason}",
            lines(item.stale),
        ]
        for item in stale
    ]
    unknown = sum(item.freshness == "unknown" for item in listed)
    body = (
        "<h1>Stale winners</h1><p class=note>Active winners tuned with another kernel source than this "
        "server's, or on this server's GPU model under another device fingerprint (driver, firmware): as "
        "<code>moetune best</code> marks them. Dispatch still uses them; re-tuning refreshes them. "
        f"{len(stale)} of {len(listed)} stale"
        + (f"; {unknown} unknown (their backend cannot be loaded here)" if unknown else "")
        + ".</p>"
        + (
            table(["GPU", "backend", "problem", "config (not default)", "promoted", "why"], rows)
            if rows
            else "<p>No stale winner.</p>"
        )
    )
    return document("moetune stale winners", body)


@functools.cache
def _plotly_file() -> tuple[Path, os.stat_result]:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path, path.stat()


@router.get(PLOTLY_PATH)
def plotly_js(request: Request) -> Response:
    """plotly.js as the installed plotly package ships it; a browser holding this copy (its ETag) gets a
    304 instead of 5 MB again."""
    path, stat = _plotly_file()
    headers = {"Cache-Control": f"public, max-age={STATIC_MAX_AGE_S}"}
    response = FileResponse(path, media_type="text/javascript", headers=headers, stat_result=stat)
    if request.headers.get("if-none-match") == response.headers["etag"]:
        return Response(status_code=304, headers={"ETag": response.headers["etag"], **headers})
    return response
