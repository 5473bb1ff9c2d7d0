"""Schema revisions through Alembic, configured from the package's own directory (never the cwd).

A fresh database (none of moetune's tables, no revision) is migrated to head on first use. Any other
mismatch is an error that names the fix: `moetune db upgrade` for an older schema, upgrading moetune
for a newer one. Migrations run inside one transaction under a lock (BEGIN IMMEDIATE on SQLite, an
advisory lock on PostgreSQL), so many processes opening one fresh database migrate it exactly once.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from moetune.db import transaction, urls
from moetune.db.errors import SchemaMismatch

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import URL, Connection, Engine
    from sqlalchemy.orm import Session

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# moetune's own version table, so that an application sharing the database keeps its alembic_version.
VERSION_TABLE = "moetune_alembic_version"
# Any fixed 64-bit number; it only has to differ from other applications' advisory locks.
_POSTGRES_LOCK_KEY = 0x6D6F6574756E65  # "moetune"

STATUSES = ("missing", "empty", "current", "outdated", "newer", "unversioned")


@dataclasses.dataclass(frozen=True)
class SchemaState:
    """Where a database stands. status: missing (SQLite file not created yet), empty (no moetune
    tables), current, outdated (a known older revision), newer (a revision this moetune does not know),
    unversioned (moetune tables without a revision)."""

    url: str  # masked
    revision: str | None
    head: str
    status: str

    @property
    def usable(self) -> bool:
        return self.status in ("missing", "empty", "current")

    @property
    def holds_tables(self) -> bool:
        """The database exists and holds moetune's tables (of any revision)."""
        return self.status not in ("missing", "empty")

    def problem(self) -> str | None:
        """The one-line error for a database that cannot be used as it is, else None."""
        if self.status == "outdated":
            return (
                f"database {self.url} is at schema revision {self.revision} but this moetune needs "
                f"{self.head}: run `moetune db upgrade` (with the same --db or MOETUNE_DB)"
            )
        if self.status == "newer":
            return (
                f"database {self.url} has schema revision {self.revision}, which this moetune does not "
                f"know (its newest is {self.head}): upgrade moetune to use this database"
            )
        if self.status == "unversioned":
            return (
                f"database {self.url} has moetune tables but no {VERSION_TABLE} table; "
                "it was not created by moetune"
            )
        return None

    def check(self) -> None:
        message = self.problem()
        if message is not None:
            raise SchemaMismatch(message)


def alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


@functools.cache
def _revisions() -> tuple[str, frozenset[str]]:
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config())
    return scripts.get_current_head(), frozenset(s.revision for s in scripts.walk_revisions())


def head() -> str:
    return _revisions()[0]


def known_revisions() -> frozenset[str]:
    """Every revision id of moetune's migrations (what `moetune db upgrade|downgrade` may name)."""
    return _revisions()[1]


def read_state(connection: Connection, url: URL) -> SchemaState:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import inspect

    from moetune.db.models import TABLE_NAMES

    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    revision = context.get_current_revision()
    top, known = _revisions()
    if revision is None:
        ours = TABLE_NAMES & set(inspect(connection).get_table_names())
        status = "unversioned" if ours else "empty"
    elif revision == top:
        status = "current"
    else:
        status = "outdated" if revision in known else "newer"
    return SchemaState(urls.masked(url), revision, top, status)


def inspect_database(engine: Engine, url: URL) -> SchemaState:
    """The schema state without creating or changing anything (a missing SQLite file stays missing)."""
    path = urls.sqlite_file(url)
    if path is not None and not path.exists():
        return SchemaState(urls.masked(url), None, head(), "missing")
    return transaction.run(engine, url, lambda s: read_state(s.connection(), url), write=False)


def migrate(engine: Engine, url: URL, target: str = "head", *, only_if_empty: bool = False) -> SchemaState:
    """Upgrade to `target` under the migration lock; with only_if_empty, just a fresh database."""

    def upgrade(session: Session) -> SchemaState:
        from alembic import command

        connection = session.connection()
        _lock(connection)
        state = read_state(connection, url)  # again, under the lock: another process may have won
        if only_if_empty and state.status != "empty":
            return state
        if state.status in ("newer", "unversioned"):
            state.check()
        _alembic(command.upgrade, connection, url, target)
        return read_state(connection, url)

    return transaction.run(engine, url, upgrade, write=True)


def downgrade(engine: Engine, url: URL, target: str) -> SchemaState:
    """Downgrade to `target` ("base" drops every moetune table and all data in them)."""

    def down(session: Session) -> SchemaState:
        from alembic import command

        connection = session.connection()
        _lock(connection)
        state = read_state(connection, url)
        if state.status in ("newer", "unversioned"):
            state.check()
        _alembic(command.downgrade, connection, url, target)
        return read_state(connection, url)

    return transaction.run(engine, url, down, write=True)


def _alembic(command: Callable[[Config, str], None], connection: Connection, url: URL, target: str) -> None:
    from alembic.util import CommandError

    try:
        command(alembic_config(connection), target)
    except CommandError as e:  # an unknown target revision, mostly
        raise SchemaMismatch(f"database {urls.masked(url)}: {urls.scrub(str(e), url)}") from e


def _lock(connection: Connection) -> None:
    # SQLite needs nothing more: the write transaction began with BEGIN IMMEDIATE.
    if connection.dialect.name == "postgresql":
        from sqlalchemy import text

        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _POSTGRES_LOCK_KEY})
