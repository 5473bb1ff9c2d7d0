"""`moetune export-optuna SWEEP`: write a sweep into an Optuna storage, one study per problem, for
optuna-dashboard and Optuna's own analysis."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from moetune.cli import app
from moetune.cli.common import DbOption, JsonOption, console, fail, json_text
from moetune.kernels.errors import MoetuneError

ENV_STORAGE = "MOETUNE_OPTUNA_STORAGE"


@app.command("export-optuna")
def export_optuna(
    sweep: Annotated[int, typer.Argument(help="Sweep id (printed by `moetune tune`).")],
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            help="Optuna RDB storage URL, e.g. sqlite:///optuna.db. A URL with a password is refused "
            "here: put it in the variable, or the password in a pgpass file.",
            show_default=f"${ENV_STORAGE}",
        ),
    ] = None,
    study_name: Annotated[
        str | None,
        typer.Option(
            "--study-name",
            help="Prefix of the study names; each study is named <prefix>/<problem key>.",
            show_default="sweep<id>",
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Export every trial of a sweep (any strategy) to an Optuna storage: value = median seconds,
    ok trials COMPLETE, failed ones FAIL with their status and error as user attributes."""
    from moetune.db import open_store
    from moetune.db.urls import has_password, masked, parse

    if storage is not None:
        try:
            parse(storage)
        except MoetuneError as e:
            fail(f"--storage: {e}")
        if has_password(storage):  # in the user part or libpq's password= query parameter
            fail(
                f"--storage holds a password, which argv shows to every user; set ${ENV_STORAGE} "
                "or use a pgpass file"
            )
    url = storage or os.environ.get(ENV_STORAGE)
    if not url:
        fail(f"no storage: give --storage URL or set ${ENV_STORAGE}")
    from moetune.tuner.optuna_export import export

    try:
        with open_store(db) as store:
            names = export(store, sweep, url, study_name)
    except MoetuneError as e:
        fail(str(e))
    if as_json:
        typer.echo(json_text({"sweep_id": sweep, "storage": masked(url), "studies": names}, indent=1))
        return
    shown = masked(url) if storage else f'"${ENV_STORAGE}"'  # a runnable command, never the password
    plain = {"markup": False, "highlight": False, "soft_wrap": True}
    console.print(
        f"wrote {len(names)} {'study' if len(names) == 1 else 'studies'} to {masked(url)}:", **plain
    )
    for name in names:
        console.print(f"  {name}", **plain)
    console.print(f"view them with: optuna-dashboard {shown}", **plain)
