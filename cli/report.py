"""`moetune report SWEEP`: write a self-contained HTML report of a sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from moetune.cli import app
from moetune.cli.common import (
    DbOption,
    JsonOption,
    check_output_file,
    check_range,
    console,
    fail,
    json_text,
)
from moetune.kernels.errors import MoetuneError


@app.command()
def report(
    sweep: Annotated[int, typer.Argument(help="Sweep id (printed by `moetune tune`).")],
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="HTML file to write.", show_default="moetune-sweep-N.html"),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write an HTML report (Plotly charts, renders offline): winners vs heuristic vs XLA with the decisions,
    speedups per token bucket, failures, and per problem time per config, history and parameter importance."""
    from moetune.db import open_store
    from moetune.tuner.report import render

    check_range("sweep", sweep)
    path = out or Path(f"moetune-sweep-{sweep}.html")
    check_output_file("--out", path)
    try:
        with open_store(db, read_only=True) as store:
            html = render(store, sweep)
    except MoetuneError as e:
        fail(str(e))
    try:
        path.write_text(html)
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror}")
    if as_json:
        typer.echo(json_text({"sweep_id": sweep, "file": str(path), "bytes": len(html.encode())}, indent=1))
    else:
        console.print(f"wrote {path}", markup=False, highlight=False)
