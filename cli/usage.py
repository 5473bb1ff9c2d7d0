"""Usage errors on one line: the root command group of `moetune`.

Typer shows a bad command line (an unknown option, a value of the wrong type, a missing argument) as a
box of several lines. moetune's rule for bad input is one line on stderr, `error: ...`, and exit code
2, so the root group runs the command line itself and prints the error that way; `--help` is untouched.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from moetune.cli.common import printable


class OneLineErrors(TyperGroup):
    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            # Not standalone: errors come back here instead of being drawn; typer.Exit(n) returns n.
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as e:  # click's ClickException: UsageError and its kin
            _exit(e.format_message(), getattr(e, "ctx", None), e.exit_code)
        except typer.Abort:
            _exit("aborted", None, 1)
        sys.exit(code if isinstance(code, int) else 0)


def _exit(message: str, ctx: Any, code: int) -> NoReturn:
    if not message.strip():  # a group called without a command: typer has printed its help already
        sys.exit(code)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    print(f"error: {printable(' '.join(message.split()))}{hint}", file=sys.stderr)
    sys.exit(code)
