"""What the tuner and the command line print on a terminal: the stdout and stderr consoles, text with its
control characters escaped, table cells that show a value as it is, and the console tables go to."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

console = Console()
err_console = Console(stderr=True)


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (newlines, escape sequences, other controls)
    written as its Python escape: text from a pack or a file can neither split a line nor restyle it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def cell(value: Any) -> Text:
    """A table cell that shows `value` as it is: rich would read "[red]" in a plain string as markup."""
    return Text(printable(_cell(value)))


def table_console() -> Console:
    """The console for tables: piped output (logs, CI, scripts) gets whole tables, not 80 columns of
    ellipses; a terminal its own width."""
    return console if console.is_terminal else Console(width=200)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return "" if value is None else str(value)
