"""The commands that only read (best, trials, misses, sweeps, report, export, explain, db current) open the
database read-only: they never create, migrate or write one, and a missing one is one line, exit 2."""

from __future__ import annotations

import hashlib
import json

import pytest
from typer.testing import CliRunner

from moetune.cli import _load_commands, app
from moetune.db import open_store
from moetune.db.leases import Owner
from tests.db.db_factories import H200, age_heartbeat, set_immutable, trial
from tests.tuner.test_cli_db import snapshot

_load_commands()

READERS = [
    ["best"],
    ["trials"],
    ["misses"],
    ["sweeps"],
    ["report", "1", "--out", "OUT"],
    ["export", "--gpu", "NVIDIA H200", "--backend", "fake", "-o", "OUT"],
    ["explain", "--m", "64", "--k", "32", "--n", "16", "--g", "4"],
]


def cli(args, db_url, out):
    return CliRunner().invoke(app, [str(out) if a == "OUT" else a for a in args] + ["--db", db_url])


def filled(url: str) -> int:
    """A database with a sweep (running, its lease held by this process) and a trial of it."""
    with open_store(url) as store:
        sweep_id = store.create_sweep(
            backend="fake",
            strategy="grid",
            spec={"device": H200.to_dict()},
            host="h",
            user="u",
            owner=Owner.here(),
        )
        store.promote(store.record_trial(trial(sweep_id=sweep_id)))
    return sweep_id


@pytest.mark.parametrize("args", READERS, ids=lambda a: a[0])
def test_a_missing_database_is_one_line_and_nothing_is_created(tmp_path, args):
    path = tmp_path / "data" / "moetune.db"
    result = cli(args, f"sqlite:///{path}", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"error: no database at {path}; run a sweep or moetune db upgrade first"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", READERS, ids=lambda a: a[0])
def test_reading_changes_nothing(tmp_path, args):
    path = tmp_path / "moetune.db"
    url = f"sqlite:///{path}"
    filled(url)
    before = snapshot(url), hashlib.sha256(path.read_bytes()).hexdigest()
    result = cli(args, url, tmp_path / "out.file")
    assert result.exit_code == 0, result.output
    assert (snapshot(url), hashlib.sha256(path.read_bytes()).hexdigest()) == before


@pytest.mark.parametrize("args", READERS, ids=lambda a: a[0])
def test_an_older_schema_is_not_migrated(db_url, tmp_path, args):
    filled(db_url)
    with open_store(db_url, check_schema=False) as store:
        store.downgrade("v0.1.0.c")
    result = cli(args, db_url, tmp_path / "out.file")
    assert result.exit_code == 2 and "run `moetune db upgrade`" in result.stderr, result.output
    with open_store(db_url, check_schema=False) as store:
        assert store.revision() == "v0.1.0.c"


def test_db_current_reports_a_missing_database_without_creating_it(tmp_path):
    path = tmp_path / "new.db"
    result = CliRunner().invoke(app, ["db", "current", "--db", f"sqlite:///{path}"])
    assert result.exit_code == 0 and "not created yet" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_sweeps_lists_newest_first_and_shows_a_dead_sweep(db_url, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich reads it when printing: table cells are not cut short
    running = filled(db_url)
    dead = filled(db_url)
    age_heartbeat(db_url, dead, 3600)
    with open_store(db_url) as store:
        done = store.create_sweep(backend="fake", strategy="tpe", spec={}, host="h", user="u")
        store.finish_sweep(done, "done")
    result = CliRunner().invoke(app, ["sweeps", "--db", db_url, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert [(r["id"], r["status"]) for r in rows] == [(done, "done"), (dead, "dead"), (running, "running")]
    by_id = {r["id"]: r for r in rows}
    assert by_id[dead]["stored_status"] == "running" and by_id[dead]["heartbeat_age_s"] > 3000
    assert isinstance(by_id[running]["heartbeat_age_s"], float) and by_id[running]["heartbeat_age_s"] < 60
    assert (by_id[running]["trials"], by_id[running]["problems"], by_id[running]["device_kind"]) == (
        1,
        0,
        "NVIDIA H200",
    )
    assert by_id[done]["device_kind"] is None and by_id[done]["heartbeat_age_s"] is None
    assert by_id[running]["owner"] == str(Owner.here())  # host:pid of this process
    limited = CliRunner().invoke(app, ["sweeps", "--db", db_url, "--limit", "1"])
    assert limited.exit_code == 0 and "showing the newest 1 sweeps" in limited.stderr
    assert "dead" not in limited.stdout and "done" in limited.stdout
    table = CliRunner().invoke(app, ["sweeps", "--db", db_url]).stdout
    assert "dead" in table and "running" in table and "NVIDIA H200" in table
    bad = CliRunner().invoke(app, ["sweeps", "--db", db_url, "--limit", "-1"])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --limit -1")


def test_trials_and_report_show_a_dead_sweep_as_dead(db_url, tmp_path):
    sweep_id = filled(db_url)
    age_heartbeat(db_url, sweep_id, 3600)
    trials = CliRunner().invoke(app, ["trials", "--db", db_url, "--sweep", str(sweep_id)])
    assert trials.exit_code == 0 and f"of sweep {sweep_id} (dead)" in trials.stdout, trials.output
    out = tmp_path / "report.html"
    report = CliRunner().invoke(app, ["report", str(sweep_id), "--out", str(out), "--db", db_url])
    assert report.exit_code == 0, report.output
    assert "<td>status</td><td>dead</td>" in out.read_text()


def test_best_on_a_fresh_install_lists_the_shipped_packs_and_creates_nothing(tmp_path):
    # No --db, no $MOETUNE_DB (the conftest unsets it) and no default database under XDG_DATA_HOME yet.
    from moetune.db import urls

    assert not urls.default_path().exists()
    result = CliRunner().invoke(app, ["best", "--gpu", "NVIDIA H200", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows and all(row["origin"].endswith(".json") for row in rows)  # a pack file, not "database"
    assert not urls.default_path().exists()
    # Without the packs there is nothing to list: the missing database is the error.
    result = CliRunner().invoke(app, ["best", "--no-packs"])
    assert result.exit_code == 2 and "no database at" in result.stderr


@pytest.mark.parametrize("args", [a for a in READERS if "OUT" not in a], ids=lambda a: a[0])
def test_a_wal_database_in_a_folder_nobody_can_write_is_read(tmp_path, args, fake_backend):
    """No reader can create the -shm a WAL database needs there: it is opened immutable instead."""
    folder = tmp_path / "archive"
    folder.mkdir()
    url = f"sqlite:///{folder / 'moetune.db'}"
    filled(url)
    assert sorted(p.name for p in folder.iterdir()) == ["moetune.db"]  # WAL mode, its -wal checkpointed
    set_immutable(folder, True)  # a read-only folder, root included
    try:
        result = cli(args, url, tmp_path / "out.file")
    finally:
        set_immutable(folder, False)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in folder.iterdir()) == ["moetune.db"]
