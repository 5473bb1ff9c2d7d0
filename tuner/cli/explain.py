"""`moetune explain`: which backend and config a grouped_matmul call gets on this machine, and why."""

from __future__ import annotations

import contextlib

import typer

from moetune.kernels.errors import MoetuneError
from moetune.tuner.cli import app
from moetune.tuner.cli.common import check_range, checked_db, fail, json_text


@app.command()
def explain(
    m: int = typer.Option(..., "--m", help="Token rows (M) of the call."),
    k: int = typer.Option(..., "--k", help="Contraction size (K)."),
    n: int = typer.Option(..., "--n", help="Output columns (N)."),
    g: int = typer.Option(..., "--g", help="Experts (G)."),
    dtype: str = typer.Option("bf16", "--dtype", help="lhs and rhs dtype: bf16, f16 or f32."),
    out_dtype: str | None = typer.Option(None, "--out-dtype", help="Output dtype (default: --dtype)."),
    transpose_rhs: bool = typer.Option(False, "--transpose-rhs", help="Weights stored [G, N, K]."),
    backend: str | None = typer.Option(
        None, "--backend", help="Use this backend; an error if it cannot run the shape (see --fallback)."
    ),
    fallback: bool = typer.Option(
        False, "--fallback", help="Let the next backend take the shape when --backend cannot run it."
    ),
    db: str | None = typer.Option(
        None,
        "--db",
        help="Database URL without a password (default: $MOETUNE_DB, else the default file if it exists).",
        callback=checked_db,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Say which backend and config `moetune.kernels.grouped_matmul` picks for a shape, and why."""
    from moetune.db import open_store
    from moetune.kernels import api, registry
    from moetune.kernels.lookup import LOOKUP
    from moetune.kernels.problem import Problem

    for option, value in (("--m", m), ("--k", k), ("--n", n), ("--g", g)):
        check_range(option, value)
    try:
        if backend is not None:
            registry.get(backend)  # UnknownBackend names the registered ones, before any database opens
        problem = Problem(
            op=api.OP,
            m=m,
            k=k,
            n=n,
            g=g,
            lhs_dtype=dtype,
            rhs_dtype=dtype,
            out_dtype=out_dtype or dtype,
            transpose_rhs=transpose_rhs,
        )
        if db:  # read as the lookup reads it, never created or migrated: a missing one is an error here
            open_store(db, read_only=True).close()
        with LOOKUP.using_db(db) if db else contextlib.nullcontext():
            explanation = api.explain(problem, backend=backend, fallback=True if fallback else None)
    except MoetuneError as e:
        fail(str(e))
    except ExceptionGroup as group:
        fail(f"{group.message}: " + "; ".join(str(e) for e in group.exceptions))
    if as_json:
        typer.echo(json_text(explanation.to_dict(), indent=1, sort_keys=True))
    else:
        typer.echo(str(explanation))
