"""Migrations: from empty to head, down to base and up again, old data carried forward, mismatches named."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import pytest
import sqlalchemy as sa
from db_factories import GATE_UP, H200, table_names, trial

from moetune.db import open_store, schema
from moetune.db.errors import SchemaMismatch
from moetune.db.leases import Owner
from moetune.db.models import TABLE_NAMES, Base

FIRST = "v0.1.0.a"
BEFORE_DETAILS = "v0.1.0.b"  # the last revision without trials.details
BEFORE_LEASE = "v0.1.0.c"  # the last revision without the sweep lease columns
BEFORE_DECISION = "v0.1.0.d"  # the last revision without winners.decision
BEFORE_JOBS = "v0.1.0.e"  # the last revision without the jobs table
LEASE_COLUMNS = {"owner_host", "owner_pid", "owner_token", "heartbeat_at", "device_id"}


def _columns(url: str, table: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return {c["name"] for c in sa.inspect(connection).get_columns(table)}
    finally:
        engine.dispose()


def _trial_ids(url: str) -> set[int]:
    """Read with plain SQL: at an old revision the store's models name columns that do not exist yet."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return set(connection.scalars(sa.text("SELECT id FROM trials")))
    finally:
        engine.dispose()


def _set_revision(url: str, revision: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text(f"UPDATE {schema.VERSION_TABLE} SET version_num = :r"), {"r": revision})
    engine.dispose()


def test_fresh_database_is_migrated_to_head_on_first_use(db_url):
    with open_store(db_url) as store:
        assert store.revision() == schema.head()
        assert store.schema_state().status == "current"
    assert TABLE_NAMES <= table_names(db_url)


def test_downgrade_to_base_and_upgrade_again(db_url):
    with open_store(db_url) as store:
        store.record_trial(trial())
        store.downgrade("base")
        assert store.revision() is None
        assert not (TABLE_NAMES & table_names(db_url))
        store.upgrade()
        assert store.revision() == schema.head()
        assert store.trials() == []


def test_old_revision_with_data_is_upgraded_to_head(db_url):
    with open_store(db_url) as store:
        trial_id = store.record_trial(trial())
    with open_store(db_url, check_schema=False) as store:
        store.downgrade(FIRST)  # trials exist at the first revision already and keep their rows
        assert store.schema_state().status == "outdated"
        assert "winners" not in table_names(db_url) and _trial_ids(db_url) == {trial_id}
        # Writing through the store is refused, with the command that fixes it.
        with pytest.raises(SchemaMismatch, match="run `moetune db upgrade`"):
            store.ensure_schema()
        store.upgrade()
        assert store.revision() == schema.head()
    with open_store(db_url) as store:
        (row,) = store.trials()
        assert row.id == trial_id and row.problem == GATE_UP
        store.promote(trial_id)
        assert store.current_winner(fingerprint_hash=H200.hash, backend="fake", problem_key=GATE_UP.key)


def test_trial_details_column_comes_and_goes_keeping_every_trial(db_url):
    """v0.1.0.c adds trials.details: trials recorded before it keep their rows with details NULL."""
    with open_store(db_url) as store:
        timed = store.record_trial(trial(routing={"routing": "balanced", "seed": 0}))
        compiled = store.record_trial(
            trial(config={"block_m": 128}, median_s=None, details={"target": "gfx942", "binary_hash": "ab"})
        )
        store.downgrade(BEFORE_DETAILS)
        assert store.revision() == BEFORE_DETAILS
        assert "details" not in _columns(db_url, "trials") and "routing" in _columns(db_url, "trials")
        assert _trial_ids(db_url) == {timed, compiled}
        store.upgrade()
        assert store.revision() == schema.head() and "details" in _columns(db_url, "trials")
        rows = {row.id: row for row in store.trials()}
        assert set(rows) == {timed, compiled}
        assert [row.details for row in rows.values()] == [None, None]
        assert rows[timed].routing == {"routing": "balanced", "seed": 0}
        again = store.record_trial(trial(config={"block_m": 16}, details={"binary_hash": "cd"}))
        assert {row.id: row.details for row in store.trials()}[again] == {"binary_hash": "cd"}


def test_sweeps_of_the_revision_before_leases_upgrade_to_dead_and_resumable(db_url):
    """v0.1.0.d adds the lease to sweeps: a sweep left running before it has no heartbeat, so it shows as
    dead and the next resumer takes it over; its trials stay with it."""
    with open_store(db_url) as store:
        store.downgrade(BEFORE_LEASE)
        assert not (LEASE_COLUMNS & _columns(db_url, "sweeps"))
    engine = sa.create_engine(db_url)
    old_sweeps = sa.table(
        "sweeps",
        *(sa.column(c) for c in ("id", "backend", "strategy", "status", "host", "username")),
        sa.column("spec", sa.JSON()),
        sa.column("created_at", sa.DateTime()),
    )
    with engine.begin() as connection:  # what a sweep of that revision left: running, with no lease
        connection.execute(
            sa.insert(old_sweeps).values(
                id=7,
                backend="fake",
                strategy="grid",
                status="running",
                spec={},
                host="old-host",
                username="ana",
                created_at=datetime.datetime(2026, 12, 1),
            )
        )
    engine.dispose()
    with open_store(db_url, check_schema=False) as store:
        store.upgrade()
        assert LEASE_COLUMNS <= _columns(db_url, "sweeps")
    with open_store(db_url) as store:
        trial_id = store.record_trial(trial(sweep_id=7))
        row = store.get_sweep(7)
        assert (row.status, row.stored_status, row.owner, row.heartbeat_age_s) == (
            "dead",
            "running",
            None,
            None,
        )
        owner = Owner.here()
        store.acquire_sweep(7, owner)
        store.claim_device(7, owner, H200)
        row = store.get_sweep(7)
        assert (row.status, row.owner, row.device_kind, row.trials) == (
            "running",
            str(owner),
            "NVIDIA H200",
            1,
        )
        store.downgrade(BEFORE_LEASE)  # and back: the sweep and its trial keep their rows
        assert not (LEASE_COLUMNS & _columns(db_url, "sweeps")) and _trial_ids(db_url) == {trial_id}


def test_winners_of_the_revision_before_decisions_upgrade_keeping_their_rows(db_url):
    """v0.1.0.e adds winners.decision: a winner promoted before it keeps its row with no decision, and
    shows its recorded median; promotions after it keep theirs."""
    with open_store(db_url) as store:
        old = store.record_trial(trial())
        store.promote(old, reason="sweep 1: first winner")
        store.downgrade(BEFORE_DECISION)
        assert "decision" not in _columns(db_url, "winners") and _trial_ids(db_url) == {old}
        assert store.schema_state().status == "outdated"
        store.upgrade()
        assert store.revision() == schema.head() and "decision" in _columns(db_url, "winners")
        (winner,) = store.winners()
        assert (winner.trial_id, winner.reason, winner.decision) == (old, "sweep 1: first winner", None)
        new = store.record_trial(trial(config={"block_m": 128}))
        store.promote(new, decision={"rule": "beats_winner", "gain": 0.1})
        assert store.winners()[0].decision == {"rule": "beats_winner", "gain": 0.1}
        store.downgrade(BEFORE_DECISION)  # and back: both winners keep their rows
        assert "decision" not in _columns(db_url, "winners") and _trial_ids(db_url) == {old, new}


def test_jobs_table_comes_and_goes_keeping_sweeps_and_trials(db_url):
    """v0.1.0.f adds the jobs table: downgrading drops it (and only it), upgrading brings it back empty,
    and a job can then be queued against a sweep recorded before."""
    with open_store(db_url) as store:
        kept = store.record_trial(trial())
        store.submit_job({"problems": ["m=16,k=64,n=256,g=4,dtype=bf16"]})
        store.downgrade(BEFORE_JOBS)
        assert "jobs" not in table_names(db_url) and _trial_ids(db_url) == {kept}
        assert store.schema_state().status == "outdated"
        store.upgrade()
        assert store.revision() == schema.head() and "jobs" in table_names(db_url)
        assert store.jobs() == [] and _trial_ids(db_url) == {kept}
        job_id = store.submit_job({"models": ["mixtral-8x7b"]}, priority=3)
        assert [(j.id, j.state, j.priority) for j in store.jobs()] == [(job_id, "queued", 3)]


def test_older_revision_names_the_upgrade_command(db_url):
    with open_store(db_url, check_schema=False) as store:
        store.upgrade(FIRST)
    with pytest.raises(SchemaMismatch) as info:
        open_store(db_url)
    assert f"revision {FIRST}" in str(info.value) and "moetune db upgrade" in str(info.value)


def test_unknown_revision_says_to_upgrade_moetune(db_url):
    open_store(db_url).close()
    _set_revision(db_url, "v9.9.9.z")
    with pytest.raises(SchemaMismatch, match="v9.9.9.z.*upgrade moetune"):
        open_store(db_url)
    with open_store(db_url, check_schema=False) as store:
        assert store.schema_state().status == "newer"
        with pytest.raises(SchemaMismatch, match="upgrade moetune"):
            store.upgrade()
        with pytest.raises(SchemaMismatch, match="upgrade moetune"):
            store.downgrade("base")
    assert TABLE_NAMES <= table_names(db_url)


def test_moetune_tables_without_a_revision_are_refused(db_url):
    open_store(db_url).close()
    engine = sa.create_engine(db_url)
    with engine.begin() as connection:
        connection.execute(sa.text(f"DROP TABLE {schema.VERSION_TABLE}"))
    engine.dispose()
    with pytest.raises(SchemaMismatch, match="not created by moetune"):
        open_store(db_url)


def test_unknown_downgrade_target_is_one_line(db_url):
    with open_store(db_url) as store:
        with pytest.raises(SchemaMismatch, match="nosuchrev") as info:
            store.downgrade("nosuchrev")
        assert "\n" not in str(info.value)
        assert store.revision() == schema.head()


def test_other_applications_tables_do_not_block_a_fresh_database(sqlite_url):
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        connection.execute(sa.text("INSERT INTO alembic_version VALUES ('someone-elses')"))
    engine.dispose()
    with open_store(sqlite_url) as store:
        assert store.revision() == schema.head()
    assert "alembic_version" in table_names(sqlite_url)


def test_migrated_schema_matches_the_models(db_url):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    open_store(db_url).close()
    engine = sa.create_engine(db_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"version_table": schema.VERSION_TABLE, "compare_type": True}
        )
        diffs = [d for d in compare_metadata(context, Base.metadata) if d[0] != "remove_table"]
    engine.dispose()
    assert diffs == []


def test_migrations_run_from_any_working_directory(tmp_path):
    """Alembic is configured from the package directory, so the cwd does not matter."""
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    code = f"from moetune.db import open_store; print(open_store({url!r}).revision())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
        env=os.environ.copy(),
    )
    assert out.stdout.strip() == schema.head()


def test_migrations_are_packages_with_their_data():
    """versions/ and migrations/ are packages (setup.py's find_packages ships them) with their data files."""
    import importlib.resources

    migrations = importlib.resources.files("moetune.db.migrations")
    for name in ("alembic.ini", "script.py.mako", "env.py", "versions/__init__.py"):
        assert (migrations / name).is_file(), name
    versions = [p.name for p in (migrations / "versions").iterdir() if p.name.startswith("v")]
    assert len(versions) >= 5
    assert schema.head() not in (FIRST, BEFORE_DETAILS, BEFORE_LEASE, BEFORE_DECISION, BEFORE_JOBS)
