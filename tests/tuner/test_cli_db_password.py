"""A database password never goes on a command line: every command that takes --db refuses a URL that
carries one, in one line with exit code 2, before it starts anything; $MOETUNE_DB carries it instead."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.db import urls

SECRET = "hunter2-not-in-argv"
WITH_PASSWORD = [
    f"postgresql+psycopg://moetune:{SECRET}@127.0.0.1:1/x",
    f"postgresql+psycopg://moetune@127.0.0.1:1/x?password={SECRET}",  # libpq reads it from the query too
]


def commands_with_db() -> list[list[str]]:
    """The path of every command of the CLI that has a --db option, e.g. ["db", "upgrade"]."""
    _load_commands()

    def walk(command, path: list[str]):
        if hasattr(command, "commands"):  # a group (typer brings its own click, so no isinstance)
            for name, sub in command.commands.items():
                yield from walk(sub, [*path, name])
        elif any("--db" in param.opts for param in command.params):
            yield path

    return list(walk(typer.main.get_command(app), []))


def test_the_cli_has_commands_with_db():
    found = {" ".join(path) for path in commands_with_db()}
    assert {"tune", "trials", "best", "db upgrade", "doctor", "explain", "report"} <= found


@pytest.mark.parametrize("url", WITH_PASSWORD, ids=["user-part", "query"])
@pytest.mark.parametrize("command", commands_with_db(), ids=" ".join)
def test_db_with_a_password_is_refused(command, url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `report` and `export` would write here
    result = CliRunner().invoke(app, [*command, "--db", url])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --db holds a password"), result.stderr
    assert "$MOETUNE_DB" in lines[0] and "PGPASSFILE" in lines[0]
    assert SECRET not in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "holds"),
    [
        ("postgresql+psycopg://user:pw@host:5432/db", True),
        ("postgresql://user:@host/db", True),  # an empty password is still one given on the command line
        ("postgresql://user@host/db?sslmode=require&password=pw", True),
        ("postgresql+psycopg://user@host/db", False),
        ("sqlite:////var/lib/moetune/moetune.db", False),
        ("sqlite:///relative.db", False),
        ("https://example.org/a:b@c", False),  # an @ in the path is no user part
        ("not a url", False),
        ("http://[::1", False),  # unparsable
    ],
)
def test_which_urls_hold_a_password(text, holds):
    assert urls.has_password(text) is holds


@pytest.mark.parametrize("char", list("/?#@:%"))
def test_a_password_holding_a_url_delimiter_is_found(char):
    """The password SQLAlchemy connects with, whichever of the URL's delimiters it holds, at any place."""
    from sqlalchemy.engine import make_url

    for password in (f"a{char}b", f"{char}ab", f"ab{char}"):
        url = f"postgresql+psycopg://moetune:{password}@127.0.0.1:1/x"
        assert make_url(url).password is not None, url  # what connects sees one
        assert urls.has_password(url), url
    assert urls.has_password(f"postgresql://u@127.0.0.1/x?password=a{char.replace('#', '%23')}b")


@pytest.mark.parametrize("char", list("/?#@:%"))
def test_tune_refuses_a_password_holding_a_url_delimiter(char, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    secret = f"{SECRET}{char}tail"
    result = CliRunner().invoke(app, ["tune", "--model", "tiny", "--db", f"postgresql://u:{secret}@h:1/x"])
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.startswith("error: --db holds a password") and len(result.stderr.splitlines()) == 1
    assert SECRET not in result.output and list(tmp_path.iterdir()) == []


def test_moetune_db_may_hold_the_password(monkeypatch, tmp_path):
    """The same URL through the environment passes the check and reaches the database (which is not
    there: the error is the connection's, with the password masked)."""
    monkeypatch.setenv(urls.ENV_DB, WITH_PASSWORD[0])
    result = CliRunner().invoke(app, ["db", "current"])
    assert result.exit_code == 2
    assert "holds a password" not in result.stderr and "127.0.0.1" in result.stderr
    assert SECRET not in result.output
