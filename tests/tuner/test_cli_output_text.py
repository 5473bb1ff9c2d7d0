"""Text that came from a pack, a file or the database prints as text: rich markup stays literal and
control characters are escaped, in every table and message of the command line."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.cli.common import cell, printable
from moetune.db import open_store
from tests.db.db_factories import H200, trial

_load_commands()
# Markup rich would apply (and "[/]" alone, which it refuses with an error), a screen-clearing escape
# sequence and a newline that would split a row.
HOSTILE = "[bold red]H200[/] [/] \x1b[2J\nnext"


@pytest.fixture
def hostile_database(sqlite_url, fake_backend):
    with open_store(sqlite_url) as store:
        device = dataclasses.replace(H200, device_kind=HOSTILE)
        store.promote(store.record_trial(trial(device=device, config={"block_m": 8, "block_n": 128})))
    return sqlite_url


@pytest.mark.parametrize("command", [["trials"], ["best", "--no-packs"]])
def test_tables_show_database_text_as_it_is(hostile_database, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "300")  # cells are not wrapped
    result = CliRunner().invoke(app, [*command, "--db", hostile_database])
    assert result.exit_code == 0, result.output
    assert "[bold red]H200[/] [/] \\x1b[2J\\nnext" in result.stdout
    assert "\x1b" not in result.stdout


def test_export_names_the_device_as_it_is(hostile_database, tmp_path):
    out = tmp_path / "p.json"
    args = ["export", "--gpu", HOSTILE, "--backend", "fake", "-o", str(out), "--db", hostile_database]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("exported")]
    assert "[bold red]H200[/] [/] \\x1b[2J\\nnext" in line


def test_printable_escapes_only_what_a_terminal_would_act_on():
    assert printable("NVIDIA H200 [x] é") == "NVIDIA H200 [x] é"
    assert printable("a\nb\x1b[31m\x07\u2028") == "a\\nb\\x1b[31m\\x07\\u2028"
    assert cell("[red]x[/]").plain == "[red]x[/]" and not cell("[red]x[/]").spans
