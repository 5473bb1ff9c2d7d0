"""The `moetune` command line: one Typer app; each command group lives in its own module."""

from __future__ import annotations

import typer

from moetune.tuner.cli.usage import OneLineErrors

app = typer.Typer(
    name="moetune",
    help="Autotune MoE grouped-GEMM kernels per GPU model and serve the winners to JAX.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=OneLineErrors,  # a bad command line is one line, `error: ...`, exit 2
)


def _load_commands() -> None:
    # Imported for their side effect of adding commands to `app`.
    from moetune.tuner.cli import (  # noqa: F401
        bench,
        db_commands,
        doctor,
        explain,
        export_optuna,
        pack_schema,
        report,
        sweeps,
        tune,
    )


def main() -> None:
    _load_commands()
    app()
