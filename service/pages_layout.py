"""The dashboard's page frame and tables: server-rendered HTML strings, every value escaped.

Strings, not templates: the sweep page embeds the sections `moetune report` writes (tuner/report.py),
which are HTML strings already, so one way of writing markup serves both and there is one escaping rule:
a cell is text and is escaped, unless it is `Html` built here from escaped parts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

PLOTLY_PATH = "/static/plotly.min.js"
NAV = (
    ("/", "sweeps"),
    ("/jobs", "jobs"),
    ("/winners", "winners"),
    ("/misses", "misses"),
    ("/stale", "stale winners"),
)
LIVE_JS = "/static/live.js"
TABLE_JS = "/static/table.js"
STYLESHEET = "/static/dashboard.css"


class Html(str):
    """Markup already built from escaped parts: a table cell that is not escaped again."""


def link(href: str, text: str) -> Html:
    return Html(f'<a href="{escape(href)}">{escape(text)}</a>')


def lines(items: Iterable[str]) -> Html:
    """Several values in one cell, one per line."""
    return Html("".join(f"<div>{escape(item)}</div>" for item in items))


def _cell(value: object) -> str:
    return value if isinstance(value, Html) else escape(str(value))


def table(
    header: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    cell_class: str = "",
    sortable: bool = False,
    table_id: str = "",
) -> str:
    """`sortable`: table.js sorts it by a clicked header; `table_id`: what a filter box names."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    attribute = f' class="{escape(cell_class)}"' if cell_class else ""
    body = "".join("<tr>" + "".join(f"<td{attribute}>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    opening = "<table"
    opening += ' class="sortable"' if sortable else ""
    opening += f' id="{escape(table_id)}"' if table_id else ""
    return f"{opening}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def filter_box(table_id: str, placeholder: str) -> str:
    """A text box that shows only the rows of table `table_id` holding every word typed (table.js)."""
    return (
        f'<input class="filter" type="search" data-table="{escape(table_id)}" '
        f'placeholder="{escape(placeholder)}" aria-label="{escape(placeholder)}">'
    )


def pager(path: str, offset: int, limit: int, *, more: bool) -> str:
    """Links to the previous and next page of a paged table ("" when it fits on one)."""
    links = []
    if offset > 0:
        links.append(link(f"{path}?offset={max(0, offset - limit)}&limit={limit}", "previous"))
    if more:
        links.append(link(f"{path}?offset={offset + limit}&limit={limit}", "next"))
    return f"<p class=pager>{' '.join(links)}</p>" if links else ""


def document(title: str, body: str, *, plotly: bool = False, live: bool = False) -> str:
    """A whole page: `body` is markup (its values escaped by whoever built it); `plotly`: the page has
    charts, so it loads plotly.js from this server (cached by the browser, never from a CDN); `live`: it
    has parts that live.js refreshes (service/pages_live.py)."""
    script = f'<script src="{PLOTLY_PATH}"></script>' if plotly else ""
    script += f'<script src="{LIVE_JS}" defer></script>' if live else ""
    script += f'<script src="{TABLE_JS}" defer></script>' if "sortable" in body else ""
    nav = "".join(f'<a href="{href}">{escape(text)}</a>' for href, text in NAV)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{escape(title)}</title>
<link rel="icon" href="data:,"><link rel="stylesheet" href="{STYLESHEET}">{script}</head>
<body>
<nav>{nav}</nav>
<main>
{body}
</main>
</body></html>
"""
