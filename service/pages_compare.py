"""Two sweeps side by side (/compare?a=ID&b=ID) and a sweep's trials as a sortable, filterable table.

The comparison takes every problem either sweep tried: the best ok median of each (its fastest trial,
linked), how many trials each ran and how many failed, and B's best over A's (below 1: B found faster).
Both sweeps' settings sit above it, side by side, so a change of strategy, budget or backend is in view.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse

from moetune.db.store import Store
from moetune.kernels.typed_fields import INT32_MAX
from moetune.service.auth import require_read
from moetune.service.deps import store
from moetune.service.pages_layout import Html, document, filter_box, link, table
from moetune.tuner import config_diff

StoreDep = Annotated[Store, Depends(store)]
SweepQuery = Annotated[int, Query(ge=1, le=INT32_MAX)]
router = APIRouter(dependencies=[Depends(require_read)], include_in_schema=False)
TRIALS_SHOWN = 1000  # the sweep page's trial table: the newest, the rest through /api/sweeps/{id}/trials


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4g}"


KERNELS_SHOWN = 3  # a trial's longest kernels named in its row; the rest counted


def _kernels(details: dict | None) -> str:
    """The trial's longest kernels with their median ms (where its timer saw each launch), longest first:
    how a fused op's time splits, or which of an unfused path's many launches cost the most."""
    kernels = sorted((details or {}).get("kernels") or [], key=lambda kernel: -kernel[1])
    if not kernels:
        return "-"
    shown = ", ".join(f"{name} {_ms(seconds)}" for name, seconds in kernels[:KERNELS_SHOWN])
    rest = kernels[KERNELS_SHOWN:]
    return shown + (f", {len(rest)} more {_ms(sum(s for _, s in rest))}" if rest else "")


def trials_table(db: Store, sweep_id: int) -> str:
    """The sweep's trials (the newest TRIALS_SHOWN), sortable by any column and filtered by a text box."""
    rows = db.trials(sweep_id=sweep_id, limit=TRIALS_SHOWN)
    cells = [
        [
            Html(f'<span id="trial-{t.id}">{t.id}</span>'),
            t.problem.key,
            t.backend,
            config_diff.text(t.backend, dict(t.config)) if t.backend else str(t.config),
            Html(f"<span class=status-{t.status}>{t.status}</span>"),
            _ms(t.median_s),
            _kernels(t.details),
            (t.error or "")[:160],
        ]
        for t in rows
    ]
    if not cells:
        return ""
    table_id = f"trials-{sweep_id}"
    more = " (the newest; every trial: /api/sweeps/{id}/trials)" if len(rows) == TRIALS_SHOWN else ""
    return (
        f"<h2>Trials</h2><p class=note>{len(rows)} trials{more}. Click a header to sort; type to filter "
        "(every word must appear in the row).</p>"
        + filter_box(table_id, "filter trials: status, config, problem ...")
        + table(
            [
                "trial",
                "problem",
                "backend",
                "config (not default)",
                "status",
                "median ms",
                "kernels (ms)",
                "error",
            ],
            cells,
            sortable=True,
            table_id=table_id,
        )
    )


def _summary(db: Store, sweep_id: int) -> tuple[Any, dict[str, dict[str, Any]]]:
    sweep = db.get_sweep(sweep_id)  # RecordNotFound: 404
    problems: dict[str, dict[str, Any]] = {}
    for t in db.trials(sweep_id=sweep_id):
        if t.backend != sweep.backend:
            continue  # the XLA baseline beside it
        p = problems.setdefault(t.problem.key, {"trials": 0, "failed": 0, "best": None})
        p["trials"] += 1
        if t.status != "ok":
            p["failed"] += 1
        elif t.median_s is not None and (p["best"] is None or t.median_s < p["best"].median_s):
            p["best"] = t
    return sweep, problems


def _facts(sweep: Any) -> str:
    spec = (sweep.spec or {}).get("spec") or {}
    rows = [
        ["sweep", link(f"/sweeps/{sweep.id}", str(sweep.id))],
        ["status", sweep.status],
        ["backend", sweep.backend],
        ["strategy", sweep.strategy],
        ["device", sweep.device_kind or "-"],
        ["budget", spec.get("budget", "-")],
        ["routing", spec.get("routing", "-")],
        ["trials", sweep.trials],
        ["created", f"{sweep.created_at:%Y-%m-%d %H:%M}"],
    ]
    return table(["", ""], rows)


@router.get("/compare", response_class=HTMLResponse)
def compare_page(db: StoreDep, a: SweepQuery, b: SweepQuery) -> str:
    sweep_a, by_a = _summary(db, a)
    sweep_b, by_b = _summary(db, b)
    rows = []
    for key in sorted(set(by_a) | set(by_b)):
        pa, pb = by_a.get(key), by_b.get(key)
        row: list[object] = [key]
        for sweep_id, p in ((a, pa), (b, pb)):
            best = p and p["best"]
            shown = link(f"/sweeps/{sweep_id}#trial-{best.id}", _ms(best.median_s)) if best else "-"
            row += [shown, f"{p['trials']} ({p['failed']} failed)" if p else "-"]
        ratio = "-"
        if pa and pb and pa["best"] and pb["best"]:
            ratio = f"{pb['best'].median_s / pa['best'].median_s:.3f}"
        rows.append([*row, ratio])
    header = ["problem", f"best ms, sweep {a}", "trials", f"best ms, sweep {b}", "trials", f"{b} / {a}"]
    body = (
        f"<h1>Sweep {a} and sweep {b}</h1><p class=note>Every problem either sweep tried: the best ok "
        "median of each (linked to its trial), the trials each ran, and the second's best over the "
        "first's (below 1: the second found a faster config).</p>"
        + f"<div class=side-by-side><div>{_facts(sweep_a)}</div><div>{_facts(sweep_b)}</div></div>"
        + filter_box("compare", "filter problems ...")
        + (table(header, rows, sortable=True, table_id="compare") if rows else "<p>Neither has trials.</p>")
    )
    return document(f"moetune sweeps {a} and {b}", body)


def compare_form() -> str:
    """The sweeps page's form that opens /compare."""
    field = 'type="number" min="1" required style="width: 6em"'
    return (
        '<form action="/compare" method="get" class=note>Compare two sweeps side by side: '
        f'<input name="a" {field} aria-label="first sweep"> and '
        f'<input name="b" {field} aria-label="second sweep"> <button type="submit">compare</button></form>'
    )
