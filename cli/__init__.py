"""The `moetune` command line: one Typer app; each command group lives in its own module."""

from __future__ import annotations

from typing import Annotated

import typer

from moetune.cli.usage import OneLineErrors

app = typer.Typer(
    name="moetune",
    help="Autotune MoE grouped-GEMM kernels per GPU model and serve the winners to JAX.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    cls=OneLineErrors,  # a bad command line is one line, `error: ...`, exit 2
)


def _print_version(value: bool) -> None:
    if value:
        import importlib.metadata

        typer.echo(f"moetune {importlib.metadata.version('moetune')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print moetune's version and exit.", callback=_print_version, is_eager=True
        ),
    ] = False,
) -> None:
    pass


def _load_commands() -> None:
    # Imported for their side effect of adding commands to `app`.
    from moetune.cli import (  # noqa: F401
        bench,
        best,
        db_commands,
        doctor,
        explain,
        export_optuna,
        jobs,
        misses,
        pack_schema,
        report,
        serve,
        submit,
        sweeps,
        trials,
        tune,
        worker,
    )


def main() -> None:
    _load_commands()
    app()
