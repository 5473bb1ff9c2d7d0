"""The conventions every command keeps: --version, shell completion, typed choices, defaults in --help,
--db from $MOETUNE_DB through typer (a password there is accepted and never printed), and --json on every
command that prints data, with numbers and objects rather than formatted strings."""

from __future__ import annotations

import importlib.metadata
import json

import pytest
import typer
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.db import urls

_load_commands()
SECRET = "pw-of-the-environment"
# Commands that print no table or record of their own: pack-schema prints the JSON Schema itself.
NO_JSON = {"pack-schema", "serve"}  # serve: a long-running server, what it prints is its log


def commands() -> dict[str, object]:
    """Every leaf command by its path, e.g. "db upgrade"."""

    def walk(command, path):
        if hasattr(command, "commands"):  # a group (typer brings its own click: no isinstance)
            for name, sub in command.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), command

    return dict(walk(typer.main.get_command(app), []))


def invoke(*args, **options):
    return CliRunner().invoke(app, list(args), **options)


def test_version_is_the_installed_packages():
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout == f"moetune {importlib.metadata.version('moetune')}\n"


def test_shell_completion_is_offered(monkeypatch):
    import shellingham

    root = typer.main.get_command(app)
    assert {"install_completion", "show_completion"} <= {p.name for p in root.params}
    # --show-completion prints the script of the shell it runs under, which typer finds by walking the
    # process tree (shellingham): a test run whose parents are no shell (a detached job) has none.
    monkeypatch.setattr(shellingham, "detect_shell", lambda *_, **__: ("bash", "/bin/bash"))
    script = invoke("--show-completion", prog_name="moetune")
    assert script.exit_code == 0 and "_MOETUNE_COMPLETE" in script.stdout, (script.output, script.exception)


@pytest.mark.parametrize(
    ("command", "option", "expected"),
    [
        ("tune", "--strategy", {"grid", "random", "tpe"}),
        ("trials", "--status", {"ok", "compile_error", "wrong_result", "timeout", "crashed", "pruned"}),
        ("explain", "--op", {"grouped_matmul", "grouped_matmul_swiglu"}),
        ("explain", "--dtype", {"bf16", "f32"}),
    ],
)
def test_choices_are_typed_listed_and_refused_in_one_line(command, option, expected, tmp_path):
    (param,) = [p for p in commands()[command].params if option in p.opts]
    choices = param.type_descriptor.annotation  # the enum typer parses into, offers and lists
    assert expected <= {choice.value for choice in choices}
    shape = ["--m", "1", "--k", "64", "--n", "64", "--g", "1"] if command == "explain" else []
    result = invoke(*command.split(), *shape, option, "nosuch", "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "'nosuch' is not one of" in result.stderr and not (tmp_path / "x.db").exists()


def test_every_option_shows_its_default_in_help():
    """An option either is required, is a flag, has a default value --help prints, or says in words what
    not giving it means."""
    missing = [
        f"{path} {param.opts[0]}"
        for path, command in commands().items()
        for param in command.params
        if param.param_type_name == "option"
        and not param.is_flag
        and not param.required
        and param.default is None
        and not isinstance(param.show_default, str)
    ]
    assert missing == []
    text = invoke("tune", "--help", env={"COLUMNS": "200"}).stdout
    assert "the sweep file's, else grid" in text and "the sweep file's, else 120.0" in text


def test_db_comes_from_the_environment_through_typer_and_its_password_is_never_printed(tmp_path):
    with_db = {path: c for path, c in commands().items() if any("--db" in p.opts for p in c.params)}
    assert {"tune", "best", "trials", "misses", "db upgrade", "explain", "report"} <= set(with_db)
    for path, command in with_db.items():
        (param,) = [p for p in command.params if "--db" in p.opts]
        assert param.envvar == urls.ENV_DB and param.show_envvar, path
    secret_url = f"postgresql+psycopg://moetune:{SECRET}@127.0.0.1:1/x"
    env = {urls.ENV_DB: secret_url, "COLUMNS": "200"}
    for path in with_db:
        shown = invoke(*path.split(), "--help", env=env)
        assert shown.exit_code == 0 and "MOETUNE_DB" in shown.stdout and SECRET not in shown.output, path
    refused = invoke("db", "current", env=env)  # from the environment: accepted, tried, masked
    assert (
        refused.exit_code == 2 and "holds a password" not in refused.stderr and SECRET not in refused.output
    )
    local = f"sqlite:///{tmp_path / 'env.db'}"
    result = invoke("db", "current", "--json", env={urls.ENV_DB: local})
    assert result.exit_code == 0 and json.loads(result.stdout)[0]["url"] == local


def test_every_command_that_prints_data_has_json():
    without = sorted(
        path
        for path, command in commands().items()
        if path not in NO_JSON and not any("--json" in p.opts for p in command.params)
    )
    assert without == []


def test_plan_sweeps_doctor_and_db_current_print_numbers_as_numbers(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    from moetune.db import open_store

    with open_store(url):
        pass  # a database that exists: a dry run creates none, and read commands refuse a missing one
    plan = json.loads(
        invoke("tune", "--model", "tiny", "--backend", "xla", "--dry-run", "--json", "--db", url).stdout
    )
    row = plan["problems"][0]
    assert isinstance(plan["candidates"], int) and isinstance(plan["estimate_s"], float)
    assert isinstance(row["valid"], int) and isinstance(row["to_run"], int)
    assert json.loads(invoke("sweeps", "--json", "--db", url).stdout) == []
    (current,) = json.loads(invoke("db", "current", "--json", "--db", url).stdout)
    assert current["status"] == "current"
    doctor = json.loads(invoke("doctor", "--json", "--db", url).stdout)
    assert isinstance(doctor["fingerprint"], dict) and isinstance(doctor["versions"], dict)
