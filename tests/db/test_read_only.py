"""open_store(read_only=True): what the commands that only read use. Nothing is created, migrated or
written, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib

import pytest
from db_factories import GATE_UP, table_names, trial

from moetune.db import DatabaseError, open_store, schema
from moetune.db.errors import NoDatabase, SchemaMismatch
from moetune.db.models import TABLE_NAMES
from moetune.db.store import open_any_revision


def test_a_missing_sqlite_file_is_one_line_and_nothing_is_created(tmp_path):
    path = tmp_path / "sub" / "never.db"
    with pytest.raises(NoDatabase) as info:
        open_store(f"sqlite:///{path}", read_only=True)
    assert str(info.value) == f"no database at {path}; run a sweep or moetune db upgrade first"
    assert list(tmp_path.iterdir()) == []


def test_an_empty_database_is_not_migrated(db_url):
    with pytest.raises(NoDatabase, match="run a sweep or moetune db upgrade first"):
        open_store(db_url, read_only=True)
    assert not (TABLE_NAMES & table_names(db_url))


def test_reads_work_and_writes_are_refused(db_url):
    with open_store(db_url) as store:
        trial_id = store.record_trial(trial())
    with open_store(db_url, read_only=True) as reader:
        assert [t.id for t in reader.trials()] == [trial_id]
        assert reader.has_problem(GATE_UP.key)
        with pytest.raises(DatabaseError):
            reader.record_trial(trial(config={"block_m": 8}))
        with pytest.raises(DatabaseError):
            reader.create_sweep(backend="fake", strategy="grid", spec={}, host="h", user="u")
    with open_store(db_url) as store:
        assert [t.id for t in store.trials()] == [trial_id] and store.sweeps() == []


def test_the_sqlite_file_is_never_written(tmp_path):
    path = tmp_path / "moetune.db"
    url = f"sqlite:///{path}"
    with open_store(url) as store:
        store.record_trial(trial())
    before = hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns
    with open_store(url, read_only=True) as reader:
        assert len(reader.trials()) == 1 and reader.revision() == schema.head()
    assert (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns) == before


def test_an_older_schema_is_named_and_left_alone(db_url):
    with open_store(db_url, check_schema=False) as store:
        store.upgrade("v0.1.0.a")
    with pytest.raises(SchemaMismatch, match="moetune db upgrade"):
        open_store(db_url, read_only=True)
    with open_store(db_url, check_schema=False) as store:
        assert store.revision() == "v0.1.0.a"


def test_a_file_of_an_older_revision_is_read_through_a_migrated_copy(tmp_path):
    path = tmp_path / "results.db"
    url = f"sqlite:///{path}"
    with open_store(url) as store:
        trial_id = store.record_trial(trial())
        store.downgrade("v0.1.0.c")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with open_any_revision(url) as store:
        assert [t.id for t in store.trials()] == [trial_id] and store.revision() == schema.head()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    with open_store(url, check_schema=False) as store:
        assert store.revision() == "v0.1.0.c"
    with pytest.raises(NoDatabase):
        with open_any_revision(url.replace("results", "missing")):
            pass
