"""Fixtures for the database tests: a store per test (SQLite and PostgreSQL), no default database."""

from __future__ import annotations

import pytest

from moetune.db import open_store


@pytest.fixture(autouse=True)
def no_default_database(monkeypatch, tmp_path):
    """No test may touch the user's real database through $MOETUNE_DB or the default path."""
    monkeypatch.delenv("MOETUNE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def store(db_url):
    with open_store(db_url) as s:
        yield s
