"""SQLAlchemy engines for many writers at once: SQLite in WAL mode, PostgreSQL with plain transactions.

SQLite: WAL lets readers run beside one writer; `busy_timeout` makes a writer wait for the lock instead
of failing at once; and write transactions start with BEGIN IMMEDIATE. That last one matters: a deferred
transaction that reads first and writes later cannot wait for the lock (SQLite would deadlock), so it
fails with "database is locked" however long the timeout. pysqlite's own transaction handling is turned
off so that our BEGIN is the one used (the recipe in SQLAlchemy's pysqlite documentation).

Read-only engines (`read_only=True`, for commands that only read) never create, migrate or write the
database: SQLite opens the file with the `mode=ro` URI (a missing file is an error, not a new database)
and `query_only`; PostgreSQL sessions are READ ONLY. One thing SQLite still does: a reader of a WAL
database shares its -shm index with the writers, so it creates the empty -wal and -shm beside a file that
has none (the next writer uses and removes them); the database file itself is never touched.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import urllib.parse
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.db import urls
from moetune.db.errors import DatabaseError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Engine

# Execution option that marks a connection's transactions as writes (BEGIN IMMEDIATE on SQLite).
WRITE_OPTION = "moetune_write"
SQLITE_BUSY_TIMEOUT_MS = 30_000
POSTGRES_CONNECT_TIMEOUT_S = 10


def make_engine(url: URL, *, read_only: bool = False) -> Engine:
    """An engine for `url` (one that never writes, with `read_only`); raises DatabaseError when the URL
    names an unknown dialect or driver."""
    from sqlalchemy import create_engine, event
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    kwargs: dict[str, Any] = {}
    backend = url.get_backend_name()
    if backend == "sqlite":
        path = urls.sqlite_file(url)
        if path is None:
            # One shared in-memory database; only useful single-threaded (tests, dry runs).
            from sqlalchemy.pool import StaticPool

            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        elif read_only:
            url = _read_only_uri(url)
    elif backend == "postgresql":
        kwargs.update(pool_pre_ping=True, connect_args={"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S})
    try:
        engine = create_engine(url, **kwargs)
    except NoSuchModuleError as e:
        raise DatabaseError(f"unsupported database URL scheme {url.drivername!r}") from e
    except ImportError as e:
        hint = " (pip install 'moetune[postgres]')" if backend == "postgresql" else ""
        raise DatabaseError(f"the driver for {url.drivername} is not installed: {e.name}{hint}") from e
    except (ArgumentError, TypeError, ValueError) as e:
        raise DatabaseError(f"bad database URL {urls.masked(url)}: {urls.scrub(str(e), url)}") from e
    if backend == "sqlite":
        event.listen(engine, "connect", functools.partial(_sqlite_on_connect, read_only=read_only))
        path = urls.sqlite_file(url)
        if path is not None and not read_only:
            guard = _FileGuard(path, urls.masked(url))
            _GUARDS[engine] = guard
            event.listen(engine, "begin", guard.before_begin)  # before the BEGIN, which reads the -shm
            event.listen(engine, "handle_error", guard.on_error)
            event.listen(engine, "close", guard.on_close)
        event.listen(engine, "begin", _sqlite_begin)
    elif read_only and backend == "postgresql":
        event.listen(engine, "connect", _postgres_read_only)
    return engine


class _FileGuard:
    """A SQLite database whose files stop taking writes mid-run (made read-only or immutable) must not take
    the process down. SQLite maps the -shm index into memory and writes to it in every transaction, read
    ones included (read marks), and in the checkpoint that closing the last connection runs: once the file
    refuses writes, such a write is a SIGBUS, not an error. So before each transaction the -wal and -shm
    are checked (access(2) sees modes and the immutable flag alike), before a checkpoint the database file
    and its folder too; and once a check or a write has failed, connections close without a checkpoint
    (what reached the -wal stays there for the next writer)."""

    def __init__(self, path: Path, url: str) -> None:
        self.path = path
        self.url = url
        self.failed = False

    def check(self, *, checkpoint: bool = False) -> None:
        files = [Path(f"{self.path}-wal"), Path(f"{self.path}-shm")]
        if checkpoint:
            files = [self.path.parent, self.path, *files]
        for file in files:
            if file.exists() and not os.access(file, os.W_OK):
                self.failed = True
                raise DatabaseError(f"database {self.url}: {file} stopped taking writes")

    def before_begin(self, _connection: Any) -> None:
        self.check()

    def on_error(self, context: Any) -> None:
        code = getattr(context.original_exception, "sqlite_errorcode", None)
        if code is not None and (code & 0xFF) in _SQLITE_WRITE_FAILURES:
            self.failed = True

    def on_close(self, dbapi_connection: Any, _record: Any) -> None:
        if self.failed:
            dbapi_connection.setconfig(sqlite3.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, True)


# Errors of the file, not of the statement.
_SQLITE_WRITE_FAILURES = {
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_CORRUPT,
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_CANTOPEN,
}
_GUARDS: weakref.WeakKeyDictionary[Engine, _FileGuard] = weakref.WeakKeyDictionary()


def check_files(engine: Engine) -> None:
    """Before a checkpoint: DatabaseError when `engine` is a SQLite file whose files (the database's, its
    folder, -wal, -shm) stopped taking writes, or when a write failed before (_FileGuard)."""
    guard = _GUARDS.get(engine)
    if guard is not None:
        guard.check(checkpoint=True)
        if guard.failed:
            raise DatabaseError(f"database {guard.url}: a write failed; no checkpoint until it is reopened")


def _read_only_uri(url: URL) -> URL:
    """The SQLite URL as a `mode=ro` URI: the file is opened for reading and never created.

    A WAL database in a folder nobody can write to (a read-only mount, an archive) has no -shm that a
    reader could create, so SQLite cannot open it even to read; it is opened `immutable` then, with no
    locks and no -shm. No writer can be at work there (it could not make its -wal either); a -wal and
    -shm left there by one are read as they are, without `immutable`."""
    database = url.database or ""
    path = urls.sqlite_file(url)
    query = {"mode": "ro", "uri": "true"}
    if path is not None and not os.access(path.parent, os.W_OK):
        sides = [Path(f"{path}{side}") for side in ("-wal", "-shm")]
        if not all(side.exists() for side in sides):
            query["immutable"] = "1"
    if not database.startswith("file:"):
        database = "file:" + urllib.parse.quote(database)
    return url.set(database=database).update_query_dict(query)


def writer(engine: Engine) -> Engine:
    """The same engine, with transactions marked as writes."""
    return engine.execution_options(**{WRITE_OPTION: True})


def _sqlite_on_connect(dbapi_connection: Any, _record: Any, *, read_only: bool) -> None:
    dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (_sqlite_begin)
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if read_only:
            cursor.execute("PRAGMA query_only = ON")
            return  # switching to WAL would be a write
        (mode,) = cursor.execute("PRAGMA journal_mode").fetchone()
        if mode not in ("wal", "memory"):
            cursor.execute("PRAGMA journal_mode = WAL")
        # NORMAL (in WAL mode): a committed trial survives any crash of the writing process, which is
        # the failure a tuner meets (a kernel taking its process down); only a power cut or OS crash may
        # lose the last commits, and resuming a sweep re-times those. FULL fsyncs every commit: measured
        # on the 2-core dev VM, 6 ms per trial instead of 1.5 ms.
        cursor.execute("PRAGMA synchronous = NORMAL")
    finally:
        cursor.close()


def _postgres_read_only(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    finally:
        cursor.close()
    dbapi_connection.commit()  # the driver opened a transaction for the SET; a rollback would undo it


def _sqlite_begin(connection: Any) -> None:
    write = connection.get_execution_options().get(WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
