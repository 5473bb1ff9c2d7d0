"""`moetune pack-schema`: print the JSON Schema of the config pack format (configs/pack.schema.json)."""

from __future__ import annotations

import typer

from moetune.cli import app


@app.command("pack-schema")
def pack_schema() -> None:
    """Print the JSON Schema of config packs (`moetune export` writes them, `moetune import` reads them)."""
    from moetune.kernels.pack_schema import json_schema_text

    typer.echo(json_schema_text(), nl=False)
