"""What the CLI commands share: one-line failures with exit code 2, table-or-JSON output, the --db and
--json options, typed choices."""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.table import Table
from typer._click.core import ParameterSource

from moetune.db import DatabaseError, urls
from moetune.tuner.listings.json_values import json_text
from moetune.tuner.terminal import cell, console, err_console, printable, table_console

EXIT_BAD_INPUT = 2


def fail(message: str) -> NoReturn:
    """Print one line on stderr and exit 2: the convention for every bad input."""
    err_console.print(f"error: {printable(message)}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def checked_db(ctx: typer.Context, param: typer.CallbackParam, url: str | None) -> str | None:
    """Every --db's callback, run while the command line is parsed, so before anything starts. A URL on
    the command line must not hold a password (the process list shows it to every user); the same URL
    from $MOETUNE_DB may, and is only ever printed masked (moetune.db.urls)."""
    if url is not None and not from_environment(ctx, param.name):
        try:
            urls.refuse_password(url)
        except DatabaseError as e:
            fail(str(e))
    return url


def from_environment(ctx: typer.Context, name: str) -> bool:
    """Whether option `name` took its value from its environment variable rather than the command line."""
    # typer carries its own click; its ParameterSource is the one ctx answers with.
    return ctx.get_parameter_source(name) is ParameterSource.ENVIRONMENT


DB_HELP = "Database URL without a password, e.g. postgresql+psycopg://user@host/db; $MOETUNE_DB may hold one."
DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help=DB_HELP,
        envvar=urls.ENV_DB,
        show_envvar=True,
        # Never the variable's value (it may hold a password): what the default is, in words.
        show_default="SQLite in the user data directory",
        callback=checked_db,
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON (numbers as numbers, configs as objects) instead of text.")
]


def choice(name: str, values: Iterable[str]) -> type[enum.StrEnum]:
    """A type for an option taking one of `values`: --help lists them, shell completion offers them,
    and any other value is a usage error (one line, exit 2)."""
    return enum.StrEnum(name, {value: value for value in values})


def check_range(option: str, value: int | None, low: int = 1) -> None:
    """An integer option stays within [low, the largest 32-bit int]: problem dimensions and row ids are
    32-bit Integer columns on PostgreSQL."""
    from moetune.kernels.typed_fields import INT32_MAX

    if value is not None and not low <= value <= INT32_MAX:
        fail(f"{option} {value} is not in [{low}, {INT32_MAX}]")


def check_output_file(option: str, path: Path) -> None:
    """Fail before any work unless `path` can be written as a file: its folder exists and is writable,
    and `path` is not a folder itself, nor anything else that is not a regular file (a symlink, FIFO, device
    node or socket): the file is written beside it and renamed over it, which would replace /dev/null with a
    regular file."""
    folder = path.parent
    if path.is_dir():
        fail(f"{option} {path} is a directory")
    kind = not_regular_file(path)
    if kind:
        fail(f"{option} {path} is {kind}, not a regular file; name a new or regular file")
    if not folder.is_dir():
        fail(f"{option} {path}: the directory {folder} does not exist")
    if not os.access(folder, os.W_OK):
        fail(f"{option} {path}: the directory {folder} is not writable")


def not_regular_file(path: Path) -> str | None:
    """What `path` is when it exists and is not a regular file ("a symlink", "a FIFO", ...), else None.
    The path itself is examined (lstat), so a symlink is reported as one, not as what it points to."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    kinds = [
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ]
    return next((name for test, name in kinds if test(mode)), None)


def emit(rows: list[dict[str, Any]], *, as_json: bool, title: str | None = None) -> None:
    """Print rows as a rich table, or as a JSON list on stdout for scripts."""
    if as_json:
        typer.echo(json_text(rows, indent=1, sort_keys=True))
        return
    if not rows:
        console.print("(no rows)")
        return
    table = Table(title=None if title is None else cell(title))
    for column in rows[0]:
        # Folded, never cut with an ellipsis: a config's tail is where configs differ.
        table.add_column(cell(column), overflow="fold")
    for row in rows:
        table.add_row(*(cell(v) for v in row.values()))
    table_console().print(table)
