"""`moetune serve`: the REST API and dashboard over the database, served by uvicorn."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from moetune.kernels.errors import MoetuneError
from moetune.tuner.cli import app
from moetune.tuner.cli.common import DbOption, check_range, console, fail


@app.command()
def serve(
    db: DbOption = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; any but loopback opens the API to the network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8765,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="File holding the write token (created 0600 if missing); $MOETUNE_SERVER_TOKEN wins.",
            show_default="server-token in the user data directory",
        ),
    ] = None,
    protect_reads: Annotated[
        bool, typer.Option("--protect-reads/--open-reads", help="Whether reads need the token too.")
    ] = False,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            help="An origin allowed to call the API from a browser (repeatable).",
            show_default="none: no cross-origin calls",
        ),
    ] = None,
    tune_misses: Annotated[
        int,
        typer.Option(
            "--tune-misses",
            help="Tune on miss: queue jobs for the N most-missed problems of each device kind, every 5 min.",
        ),
    ] = 0,
    tune_misses_budget: Annotated[
        int | None,
        typer.Option("--tune-misses-budget", help="Trials per tune-on-miss job.", show_default="no limit"),
    ] = None,
) -> None:
    """Serve winners, packs, sweeps, misses and the tuning queue over HTTP, with a dashboard at /."""
    import uvicorn

    from moetune.db import open_store
    from moetune.service import token_file as tokens
    from moetune.service.app import create_app
    from moetune.service.settings import ServiceSettings

    check_range("--port", port, low=1)
    check_range("--tune-misses", tune_misses, low=0)
    check_range("--tune-misses-budget", tune_misses_budget)
    if port > 65535:
        fail(f"--port {port} is not in [1, 65535]")
    try:
        tokens.resolve(token_file, create=False)  # a bad token file fails before anything is written
        # Open (and migrate a fresh) database now: a bad --db is one line here, not a failed start-up
        # inside uvicorn.
        open_store(db).close()
        token, source = tokens.resolve(token_file)
        settings = ServiceSettings(
            db_url=db,
            token=token,
            protect_reads=protect_reads,
            cors_origins=tuple(cors_origin or ()),
            tune_misses=tune_misses,
            tune_misses_budget=tune_misses_budget,
        )
        application = create_app(settings)
    except MoetuneError as e:
        fail(str(e))
    where = f"moetune serving on http://{host}:{port} (write token: {source})"
    console.print(where, markup=False, highlight=False)
    uvicorn.run(application, host=host, port=port, log_level="info", server_header=False)
